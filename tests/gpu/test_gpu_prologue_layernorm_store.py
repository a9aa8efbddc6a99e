"""A GEMM kernel that computes a layernorm in its prologue and also stores the normalized rows
(templates/gemm_prologue.py `row_stores`), under Triton's interpreter (or on a GPU): BERT's
post-norm feed-forward block and a whole encoder layer, the stored rows also returned, chained
layernorms, rows read (and stored) through a transpose, tiles that M and K do not fill, and
split-k, where each program stores the k chunks it walks. Every
buffer is poisoned with NaN, so an element no program stores shows up; outputs are compared
with the NumPy reference target on random inputs."""

from __future__ import annotations

import numpy as np
import pytest

from fusegraph import api, parse_onnx
from fusegraph.passes.prologue_rule import STORE_NORMS_ENV
from tests.gpu.test_gpu_kernels import TOL, check_gpu, node
from tests.helpers import has_gpu, make_model, rand, rel_err
from tests.passes.test_prologue_layernorm_store import chained_norms, post_norm_block, post_norm_layer


@pytest.fixture(autouse=True)
def _stored_norms(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stores these tests check are taken on request only (`prologue_rule.STORE_NORMS_ENV`)."""
    monkeypatch.setenv(STORE_NORMS_ENV, "1")


FP16_TOL = 5e-3  # fp16 operands, weights and stored rows against the fp32 reference (measured 4.5e-4)


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("returned", [False, True])
def test_post_norm_block(returned, fp16):
    """7 rows in a tile of 16 or more, 48 columns in chunks of 32: both ragged."""
    compiled = check_gpu(post_norm_block(returned=returned), tolerance=FP16_TOL if fp16 else TOL, fp16=fp16)
    first, second = compiled.kernels
    assert [first.src.template, second.src.template] == ["gemm", "gemm"]
    assert "if pid_n == 0:" in first.src.body and "out1" in first.src.args
    assert "if pid_n == 0:" not in second.src.body
    # normalized after the product without split-k, the rows stored from the final statistics;
    # a returned layernorm keeps its affine (`fold_norm_affine`), so the k loop sums gamma W and
    # beta W; otherwise the affine is in the weights, whose columns sum to zero, and the group
    # stores norm * gamma + beta for the residual
    assert ("ln_wsum" in first.src.body) == returned
    assert "for k1 in range(pid_n * BK, 48, BK * tl.num_programs(1)):" in first.src.body
    assert "tl.debug_barrier()" in first.src.body.split("for k0 in")[1]  # the k loop's (GemmEmitter._a_tile)


def _run_configs(program, compiled, configs: list[dict], seed: int, tolerance: float = TOL, runs: int = 1) -> None:
    """Run the program with its first kernel under each config, on fresh inputs, every output
    against the reference; `runs` times each, on poisoned buffers every time."""
    rng = np.random.default_rng(seed)
    kernel = compiled.kernels[0]
    for config in configs:
        kernel.config = config
        inputs = {k: rng.standard_normal(s.lens).astype(np.float32) for k, s in program.input_shapes.items()}
        want = api.run(program, inputs)
        for _ in range(runs):
            compiled.poison()
            got = compiled.run(inputs)
            for name in want:
                g = np.asarray(got[name], dtype=np.float32)
                assert np.isfinite(g).all(), (name, config, int((~np.isfinite(g)).sum()))
                assert rel_err(g, want[name]) <= tolerance, (name, config, rel_err(g, want[name]))


def test_post_norm_block_under_split_k_and_every_default_config():
    """K = 520: eight or more chunks of 64, so the configs split k (each split stores the
    chunks it walks, which together cover the row once), the last chunk ragged; 37 rows,
    two column blocks of the first product (only the first stores). Without split-k the
    product normalizes after its k loop and both column blocks store the rows, alternate
    chunks each. The stored rows are returned, so they are checked directly."""
    program = parse_onnx(post_norm_block(m=37, k=520, h=40, returned=True))
    compiled = api.compile(program, "gpu", tune=False)
    configs = compiled.kernels[0].src.configs
    narrow = [c for c in configs if c["SPLIT"] > 1 and c["BN"] < 40]  # split k, two column blocks
    assert {c["SPLIT"] for c in narrow} >= {2, 4}, configs
    unsplit = [c for c in configs if c["SPLIT"] == 1]
    two_blocks = [c for c in unsplit if c["BN"] < 40]
    assert two_blocks and "ln_wsum" in compiled.kernels[0].src.body
    chosen = configs[:3] + narrow + unsplit[:2] + two_blocks[:2] + [c for c in configs if c["BK"] == 32][:1]
    _run_configs(program, compiled, chosen, seed=7)


@pytest.mark.skipif(not has_gpu(), reason="BERT-sized: minutes under the interpreter; the defect it guards is the GPU's")
def test_post_norm_block_at_bert_batch_32_size_under_every_unsplit_config(monkeypatch):
    """BERT-base's feed-forward block at batch 32 (4096 rows, 768 -> 3072), fp16: the large
    tiles (128x256, 8 warps) that only such sizes choose. Triton 3.6 on an H100 wrote NaN into a
    few hundred rows of the product's output per run until the k loop gained its barrier
    (`GemmEmitter._a_tile`); runs vary, so each config runs three times. By default a norm of
    this many rows keeps its own kernel (`prologue_rule`), so the product is made to store it."""
    from fusegraph.passes import prologue_rule

    monkeypatch.setenv("FUSEGRAPH_STORE_NORMS", "1")
    monkeypatch.setattr(prologue_rule, "NORM_PROLOGUE_MAX_ROWS", 1 << 30)
    program = parse_onnx(post_norm_block(m=4096, k=768, h=3072))
    compiled = api.compile(program, "gpu", tune=False, fp16=True)
    assert compiled.kernels[0].src.kernel_name == "add_layernorm_dot_mul_erf"
    configs = [c for c in compiled.kernels[0].src.configs if c["SPLIT"] == 1]
    assert any(c["BM"] == 128 and c["BN"] == 256 for c in configs), configs
    _run_configs(program, compiled, configs, seed=3, tolerance=FP16_TOL, runs=3)


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("n", [32, 8])
def test_chained_layernorms(n, fp16):
    """A layernorm of a stored layernorm (Swin's patch embedding and first block): two
    statistics loops, the second reading the first's normalized rows. With N = K the
    residual add in the epilogue reads the first layernorm at the output index; else a
    relu reads its stored rows."""
    tail = [node("Add", ["p", "e"], ["out"])] if n == 32 else [node("Relu", ["e"], ["out"])]
    compiled = check_gpu(chained_norms(tail, n, ["out", "p"]), tolerance=FP16_TOL if fp16 else TOL, fp16=fp16)
    body = compiled.kernels[0].src.body
    assert body.count("for k1 in tl.range(") == 2  # the second norm's statistics wait for the first's


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("width,stores", [(320, 2), (32, 1)])
def test_post_norm_encoder_layer(fp16, width, stores):
    """A whole BERT layer on the gpu target: 320 wide, the two post-norm layernorms stored by
    QKV and fc1 and read by the residual adds, the last one returned; 32 wide, the post-norms
    in the epilogues of the products before them and only the input norm stored by QKV."""
    compiled = check_gpu(post_norm_layer(c=width), tolerance=FP16_TOL if fp16 else TOL, fp16=fp16)
    assert sum("if pid_n == 0:" in k.src.body for k in compiled.kernels) == stores


@pytest.mark.parametrize("fp16", [False, True])
def test_rows_stored_through_a_transpose_of_the_leading_axes(fp16):
    """Sequence-first rows: the batched product reads the layernorm transposed, so its kernel
    stores each row through the inverse of that map (the batch index picks the position). What
    it stores is the relu of the affine: pointwise ops on the norm and constants that are all
    its other readers join the group (`PrologueRule.constant_tails`)."""
    model = make_model([node("LayerNormalization", ["x", "g", "bt"], ["t"], axis=-1), node("Transpose", ["t"], ["tt"], perm=[1, 0, 2]),
                        node("MatMul", ["tt", "w"], ["y"]), node("Relu", ["t"], ["z"])], {"x": [3, 5, 64]}, ["y", "z"],
                       {"g": rand(64, seed=1), "bt": rand(64, seed=2), "w": rand(64, 8, seed=3, scale=0.3)})
    compiled = check_gpu(model, tolerance=FP16_TOL if fp16 else TOL, fp16=fp16)
    (kernel,) = compiled.kernels
    assert kernel.src.kernel_name == "layernorm_dot_add" and "out1" in kernel.src.args


@pytest.mark.parametrize("fp16", [False, True])
def test_epilogue_reading_the_normalized_rows_keeps_the_statistics_loop(fp16):
    """y = LN(x) @ W + LN(x) with W square: the epilogue's residual reads the layernorm at the
    output index, which a product normalized after its k loop would not have yet, so the kernel
    normalizes before the product (`deferrable`); with the epilogue reading x instead it defers."""
    literals = {"g": 1 + rand(48, seed=1, scale=0.1), "bt": rand(48, seed=2, scale=0.1), "w": rand(48, 48, seed=3, scale=0.2)}
    for residual, deferred in (("t", False), ("x", True)):
        model = make_model([node("LayerNormalization", ["x", "g", "bt"], ["t"], axis=-1), node("MatMul", ["t", "w"], ["y0"]),
                            node("Add", ["y0", residual], ["y"])], {"x": [1, 9, 48]}, ["y", "t"], literals)
        compiled = check_gpu(model, tolerance=FP16_TOL if fp16 else TOL, fp16=fp16)
        (kernel,) = compiled.kernels
        assert ("ln_wsum" in kernel.src.body) == deferred, residual
