"""bench/head_configs.py's ablation variants cut out what they say, on the current head kernel.

The variants rewrite lines of the generated kernel; if the template's output changes shape,
a rewrite that silently no longer applies would time the full kernel under another name. Run
under Triton's interpreter on a small head level (32 channels, 4x4 grid), with the tile whole
and in column pieces, on fresh random inputs, against float64 NumPy: the full kernel computes
the head, `no-product` stores sigmoid(bias) in every place, `aligned-store` writes the same
values into the scratch buffer's 128-wide rows, and the one-row variants store one row per
tile. Tolerance 2e-3 absolute (fp16 outputs in [0, 1]).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import fusegraph  # noqa: E402
from bench.head import NA, NO, Level, head_model, make_weights  # noqa: E402
from bench.head_configs import variant  # noqa: E402

LEVEL = Level(32, 4)
TOL = 2e-3


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v))


@pytest.fixture(scope="module", params=[0, 1], ids=["whole", "pieces"])
def head(request):
    w, b = make_weights(LEVEL, 0)
    compiled = fusegraph.compile(fusegraph.parse_onnx(head_model(LEVEL, w, b)), "gpu", fp16=True)
    (kernel,) = compiled.kernels
    x = torch.from_numpy(np.random.default_rng().standard_normal((1, 32, 4, 4))).half()
    bound = compiled.bind({"x": x})
    w16 = torch.from_numpy(w).half().double().numpy().reshape(NA * NO, 32)
    b16 = torch.from_numpy(b).half().double().numpy()
    conv = np.einsum("oc,chw->ohw", w16, x.double().numpy()[0]) + b16[:, None, None]
    want = _sigmoid(conv.reshape(NA, NO, 4, 4).transpose(0, 2, 3, 1))  # [3, 4, 4, 85]
    assert "PIECES" in kernel.config  # 85 of 128 columns: the head's kernel can run in two pieces
    kernel.config = {**kernel.config, "PIECES": request.param}
    return bound, kernel, bound.args(kernel), want, _sigmoid(b16).reshape(NA, NO)


def _run(head, name: str) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    bound, kernel, args, _, _ = head
    launch, scratch = variant(kernel, args, kernel.config, name)
    out = bound.outputs()["y"]
    out.fill_(float("nan"))
    launch()
    return out.double().numpy()[0], scratch.double().numpy(), kernel.config


def test_full_and_no_sigmoid_variants(head) -> None:
    want = head[3]
    out, _, _ = _run(head, "full")
    assert np.abs(out - want).max() < TOL
    out, _, _ = _run(head, "no-sigmoid")
    logits = np.log(want / (1 - want))
    assert np.abs(out - logits).max() < 2e-2 * max(1.0, np.abs(logits).max())


def test_no_product_stores_sigmoid_of_bias(head) -> None:
    out, _, _ = _run(head, "no-product")
    assert np.abs(out - head[4][:, None, None, :]).max() < TOL


def test_aligned_store_writes_the_values_into_scratch_rows(head) -> None:
    out, scratch, config = _run(head, "aligned-store")
    assert np.isnan(out).all()  # the real output is left alone
    rows = scratch.reshape(NA, -1, config["BN"])[:, :16, :NO]  # [anchor, pixel, channel]
    assert np.abs(rows - head[3].reshape(NA, 16, NO)).max() < TOL


@pytest.mark.parametrize("name", ["one-row-store", "launch-only"])
def test_one_row_variants_store_one_row_per_tile(head, name: str) -> None:
    out, _, config = _run(head, name)
    pixels = out.reshape(NA, 16, NO)
    stored = ~np.isnan(pixels).all(axis=2)
    first = np.arange(16) % config["BM"] == 0
    assert (stored == first[None, :]).all()
    want = head[3].reshape(NA, 16, NO) if name == "one-row-store" else np.broadcast_to(head[4][:, None, :], (NA, 16, NO))
    assert np.abs(pixels[:, first] - want[:, first]).max() < TOL
