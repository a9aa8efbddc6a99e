"""The attention template under Triton's interpreter (or on a GPU if present): ONNX
`Attention` nodes and attention written in plain ops, compiled for the gpu target with every
buffer poisoned with NaN, against the NumPy reference target on fresh random inputs.

Shapes are small (sequences of 17 to 64, heads of 16 to 32) so the interpreter stays fast;
they still cover masked tails of query and key tiles, padded head sizes, additive and boolean
masks, causal masking with and without cached keys, and fp32 and fp16."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from fusegraph import api, parse_onnx
from tests.attention_models import (bert_attention, causal_attention, float32_softmax_attention, vit_block,
                                    window_attention)
from tests.helpers import make_model, rel_err

FP32_TOL = 2e-5
FP16_TOL = 3e-3  # probabilities rounded to fp16 for the product with V, as flash attention does


def attention_model(b: int, h: int, sq: int, sk: int, d: int, mask: str | None = None, causal: bool = False,
                    past: int = 0, dtype: int = TensorProto.FLOAT):
    """One ONNX `Attention` node on [B, H, S, D] inputs; `mask` "float" or "bool" adds a
    [B, 1, Sq, Sk] mask input, `past` cached keys and values in front of the `sk` new ones."""
    shapes = {"q": [b, h, sq, d], "k": [b, h, sk, d], "v": [b, h, sk, d]}
    names = ["q", "k", "v", ""]
    if mask:
        shapes["m"] = [b, 1, sq, sk + past]
        names[3] = "m"
    if past:
        shapes.update(pk=[b, h, past, d], pv=[b, h, past, d])
        names += ["pk", "pv"]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Attention", names, ["y"], is_causal=int(causal))
    model = make_model([node], shapes, ["y"], opset=23, dtype=dtype)
    if mask == "bool":
        model.graph.input[3].type.tensor_type.elem_type = TensorProto.BOOL
    return model


def random_inputs(program, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in program.input_shapes.items():
        if shape.dtype.is_float:
            out[name] = rng.standard_normal(shape.lens).astype(shape.dtype.numpy)
        else:  # a boolean mask keeping about 3 keys in 4, and always the first
            keep = rng.random(shape.lens) < 0.75
            keep[..., 0] = True
            out[name] = keep
    return out


def check(model, tolerance: float, seed: int = 5, configs: bool = False):
    program = parse_onnx(model)
    compiled = api.compile(program, "gpu", tune=False)
    kernel = next(k for k in compiled.kernels if k.src.template == "attention")
    for config in kernel.src.configs if configs else [kernel.config]:
        kernel.config = config
        inputs = random_inputs(program, seed)
        want = api.run(program, inputs)
        compiled.poison()
        got = compiled.run(inputs)
        for name in want:
            g = np.asarray(got[name])
            assert not np.isnan(g).any(), f"{name}: {np.isnan(g).sum()} elements left unwritten (NaN), {config}"
            assert rel_err(g, want[name]) <= tolerance, f"{name}: {rel_err(g, want[name])}, {config}"
    return compiled


@pytest.mark.parametrize("b,h,sq,sk,d,mask,causal", [
    (1, 2, 17, 17, 16, None, False),
    (2, 2, 33, 33, 32, "float", False),
    (1, 2, 64, 64, 32, None, True),
    (1, 2, 19, 19, 24, "bool", False),  # a head of 24 padded to 32
    (2, 1, 20, 45, 16, None, False),  # cross attention, key tail inside a tile
])
def test_attention_fp32(b, h, sq, sk, d, mask, causal):
    compiled = check(attention_model(b, h, sq, sk, d, mask, causal), FP32_TOL)
    # a boolean mask's 0 / -inf is computed where the kernel reads it
    assert [k.src.template for k in compiled.kernels] == ["attention"]


@pytest.mark.parametrize("b,h,sq,sk,d,mask,causal", [
    (2, 3, 40, 40, 32, "bool", False),
    (1, 2, 50, 50, 16, None, True),
    (1, 2, 17, 17, 32, "float", True),
])
def test_attention_fp16(b, h, sq, sk, d, mask, causal):
    check(attention_model(b, h, sq, sk, d, mask, causal, dtype=TensorProto.FLOAT16), FP16_TOL)


@pytest.mark.parametrize("dtype,tolerance", [(TensorProto.BFLOAT16, 2e-2), (TensorProto.DOUBLE, 1e-12)],
                         ids=["bf16", "fp64"])
def test_attention_bf16_and_fp64(dtype, tolerance):
    """bfloat16 (its products in float32 under the interpreter, whose bf16 dot is wrong) and
    float64 (exact products summed, no tensor-core dot)."""
    check(attention_model(1, 2, 33, 33, 32, "float", True, dtype=dtype), tolerance)


def test_causal_with_cached_keys_skips_tiles_past_the_diagonal():
    """20 new queries after 25 cached keys: query i sees keys j <= i + 25; every config."""
    compiled = check(attention_model(1, 2, 20, 20, 16, causal=True, past=25), FP32_TOL, configs=True)
    (k,) = [k for k in compiled.kernels if k.src.template == "attention"]
    assert "for n0 in range(lo, hi, BN):" in k.src.body and len(k.src.configs) > 1


def test_every_config_with_a_mask():
    check(attention_model(2, 2, 37, 37, 32, "float"), FP32_TOL, configs=True)


def test_fully_masked_row_gives_zeros():
    model = attention_model(1, 1, 17, 17, 16, "bool")
    program = parse_onnx(model)
    compiled = api.compile(program, "gpu", tune=False)
    inputs = random_inputs(program, 3)
    inputs["m"][0, 0, 4] = False
    compiled.poison()
    got = compiled.run(inputs)["y"]
    assert (got[0, 0, 4] == 0).all()
    assert rel_err(got, api.run(program, inputs)["y"]) <= FP32_TOL


@pytest.mark.parametrize("model,tolerance", [
    (vit_block(s=17, scale_on="qk"), FP32_TOL),
    (bert_attention(s=19, mask="none"), FP32_TOL),
    (causal_attention(s=18, form="where"), FP32_TOL),
    (vit_block(s=20, scale_on="q", dtype=TensorProto.FLOAT16), FP16_TOL),
    (window_attention(), FP32_TOL),
    (float32_softmax_attention(), FP16_TOL),
], ids=["vit", "bert", "gpt2-causal", "vit-fp16", "swin-window", "fp32-softmax"])
def test_block_in_plain_ops_has_one_attention_kernel(model, tolerance):
    """A ViT block exported as ops (QKV GEMM, head split, scales, softmax, products, head merge,
    projection): three kernels, the middle one attention reading the QKV GEMM's head layout."""
    compiled = check(model, tolerance)
    assert [k.src.template for k in compiled.kernels].count("attention") == 1
    if "w_qkv" in [i.name for i in model.graph.initializer]:
        assert [k.src.template for k in compiled.kernels] == ["gemm", "attention", "gemm"]


def _attention_jobs(models) -> list:
    from fusegraph.ir.dtypes import DType
    from fusegraph.ops.base import is_fused
    from fusegraph.passes.pipeline import fuse
    from fusegraph.passes.to_half import ToHalf
    from fusegraph.targets.gpu.ahead_of_time import arg_dtypes
    from fusegraph.targets.gpu.codegen import generate, kernel_inputs, plan_program

    jobs = []
    for model in models:
        program = parse_onnx(model)
        ToHalf(DType.float16).apply(program.main)
        fuse(program)
        plan = plan_program(program.main)
        for pos, ins in enumerate(i for i in program.main if is_fused(i)):
            src = generate(ins, pos, kernel_inputs(ins, plan))
            if src.template == "attention":
                jobs.append((src, arg_dtypes(ins, src)))
    return jobs


@pytest.mark.slow
def test_attention_kernels_compile_for_sm90():
    """An fp16 kernel at head size 64 with a mask and causal (the dynamic key loop) builds for
    the H200 without a GPU (its default config) and fits its shared memory."""
    from fusegraph.targets.gpu.ahead_of_time import compile_many
    from fusegraph.targets.gpu.device import H200

    jobs = _attention_jobs([attention_model(2, 6, 197, 197, 64, "float", causal=True)])
    assert len(jobs) == 1
    for (src, _), r in zip(jobs, compile_many(jobs, workers=1)):
        assert r.cubin_bytes > 0 and r.shared_bytes <= H200.shared_bytes_per_block, src.name
