"""Conformance cases of supported ops that fusegraph is known to fail, each with the reason.

Every other case of a supported op must pass: ONNX Runtime (CPU) is run on the same cases by
tools/conformance_report.py, and each case it passes that fusegraph fails was fixed, not listed
here, unless the reason below says why it cannot or should not be. A listed case that starts to
pass fails the test suite, so the list cannot go stale.

Cases that fusegraph *declines* (an op without a parser, an unsupported attribute value, element
type or empty tensor) are skipped with that reason and need no entry here.
"""

from __future__ import annotations

#: test name -> one-line reason
EXCLUDED: dict[str, str] = {
    # Ill-conditioned: the light models use constant weights, so squeezenet's 1000 logits are
    # mathematically equal (about 9.5e9, where a float32 ULP is 1024) and the stored output is
    # softmax's uniform 0.001. Our float32-accumulating conv rounds a few channels 1 ULP higher,
    # and softmax of a 1024 difference puts all mass on those (1/64 each). ONNX Runtime passes
    # only because its conv rounds every channel identically.
    "test_squeezenet": "ill-conditioned: equal logits of 9.5e9 differ by 1 float32 ULP (1024) across channels, softmax amplifies it",
    # The expected output is onnx's reference rounding float16 after every op of the expanded graph;
    # ours (float32 accumulation, float64 softmax) is closer to the exact result (max error 4.0e-4
    # against the reference's 4.9e-4), but 2 of 192 outputs differ from it by 2 float16 ULPs, above
    # rtol=1e-3. ONNX Runtime's output differs from it by the same 4.9e-4, just at other elements.
    "test_attention_4d_causal_fp16_expanded": "float16 rounding: 2 of 192 outputs 2 ULPs from onnx's per-op-rounded reference (ours is closer to exact)",
}
