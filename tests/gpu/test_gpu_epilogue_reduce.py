"""Epilogues that store more than one value, under Triton's interpreter (or on a GPU).

Each model is compiled for the gpu target, every buffer poisoned with NaN, and every output
compared with the NumPy ref target on fresh random inputs, in fp32 and fp16.
"""

from __future__ import annotations

import numpy as np
import pytest

from fusegraph import api, parse_onnx
from tests.gpu.test_gpu_kernels import check_gpu, node
from tests.helpers import make_model, rand
from tests.passes.test_multi_output_groups import residual_model

HALF_TOL = 3e-3  # fp16 storage of fp32-computed values


@pytest.mark.parametrize("fp16", [False, True])
def test_a_conv_kernel_stores_its_residual_and_its_activation(fp16):
    """The relu is read by a 1x1 and a 3x3 conv, too often to recompute in their prologues."""
    c = check_gpu(residual_model(readers=2), tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    assert [k.src.kernel_name for k in c.kernels] == ["conv_add_relu", "conv_add", "conv"]
    assert c.kernels[0].src.args[-4:] == ["out", "out1", "ws", "cnt"]


@pytest.mark.parametrize("fp16", [False, True])
def test_a_pooling_and_a_reduction_kernel_store_two_values(fp16):
    """max pool -> relu, the pool also returned; softmax -> exp, the softmax also returned."""
    m = make_model([node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]), node("Relu", ["p"], ["r"]),
                    node("Softmax", ["x"], ["s"], axis=-1), node("Exp", ["s"], ["e"])],
                   {"x": [1, 3, 6, 8]}, ["r", "p", "e", "s"])
    c = check_gpu(m, tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    assert sorted(k.src.kernel_name for k in c.kernels) == ["pool_relu", "softmax_exp"]
    assert all("out1" in k.src.args for k in c.kernels)


def head_model(n: int, split: list[int], perm: list[int], log: bool = False):
    """MatMul + bias -> reshape -> transpose -> (log-)softmax over the last axis."""
    return make_model([node("MatMul", ["x", "w"], ["g"]), node("Add", ["g", "b"], ["a"]),
                       node("Reshape", ["a", "shape"], ["r"]), node("Transpose", ["r"], ["t"], perm=perm),
                       node("LogSoftmax" if log else "Softmax", ["t"], ["y"], axis=-1)],
                      {"x": [1, 12, 32]}, ["y"],
                      {"w": rand(32, n, seed=1), "b": rand(n, seed=2), "shape": np.array(split, np.int64)})


@pytest.mark.parametrize("fp16", [False, True])
def test_a_softmax_over_64_wide_heads_is_one_product_kernel(fp16):
    c = check_gpu(head_model(192, [1, 12, 3, 64], [0, 2, 1, 3]), tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    assert [k.src.kernel_name for k in c.kernels] == ["dot_add_reshape_transpose_softmax"]
    assert {cfg["BN"] for cfg in c.kernels[0].src.configs} == {64}  # one tile is one head
    assert "tl.max(" in c.kernels[0].src.source and "tl.sum(" in c.kernels[0].src.source


@pytest.mark.parametrize("fp16", [False, True])
def test_a_log_softmax_over_a_padded_row_leaves_the_padding_out(fp16):
    """100 columns in a tile of 128: the 28 padding lanes must not reach the max or the sum."""
    c = check_gpu(head_model(100, [1, 12, 100], [0, 1, 2], log=True), tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    assert [k.src.kernel_name for k in c.kernels] == ["dot_add_softmax"]  # the views are identities
    assert {cfg["BN"] for cfg in c.kernels[0].src.configs} == {128}


@pytest.mark.parametrize("fp16", [False, True])
def test_a_softmax_over_a_convolutions_channels_is_its_epilogue(fp16):
    from tests.passes.test_reduction_epilogue import conv_softmax_model

    c = check_gpu(conv_softmax_model(), tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    assert [k.src.kernel_name for k in c.kernels] == ["conv_add_softmax"]


@pytest.mark.parametrize("fp16", [False, True])
def test_yolov8s_dfl_tail_with_its_softmax_in_the_head_conv(fp16):
    from tests.passes.test_reduction_epilogue import dfl_model

    c = check_gpu(dfl_model(), tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    assert c.kernels[0].src.kernel_name == "conv_add_reshape_transpose_softmax_slice_sub"  # and the weighted sum
    assert {cfg["BN"] for cfg in c.kernels[0].src.configs} == {16}  # one tile is one box side's 16 bins


@pytest.mark.parametrize("batch,hw,fp16", [(1, 6, False), (2, 12, False), (3, 5, True)])
def test_an_se_squeeze_is_summed_by_the_conv_kernel(batch, hw, fp16):
    """Row tiles that hold one sample's pixels in part, or several samples (5x5 pixels), give
    their parts per sample; the last tile of each column block adds them in order."""
    from tests.passes.test_reduction_epilogue import se_model

    c = check_gpu(se_model(batch=batch, hw=hw), tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    assert c.kernels[0].src.kernel_name == "conv_add_sigmoid_mul_reduce_mean"
    assert c.kernels[0].src.args[-2:] == ["part", "pcnt"]
    assert all(cfg["SPLIT"] == 1 for cfg in c.kernels[0].src.configs)


@pytest.mark.parametrize("batch,hw,fp16", [(2, 6, False), (3, 5, True)])
def test_an_se_squeeze_is_summed_by_the_depthwise_kernel(batch, hw, fp16):
    """MobileNetV3's and EfficientNet's squeeze follows a depthwise conv + SiLU: the depthwise
    kernel stores the map and the channel means, its pixel blocks giving parts per sample."""
    from tests.passes.test_reduction_epilogue import se_model

    c = check_gpu(se_model(batch=batch, hw=hw, depthwise=True), tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    k = c.kernels[0].src
    assert (k.template, k.kernel_name) == ("depthwise", "conv_add_sigmoid_mul_reduce_mean")
    assert k.args[-2:] == ["part", "pcnt"] and "atomic_add(pcnt" in k.source
    assert "atomic_add(part" not in k.source and "atomic_xchg(part" not in k.source  # no float atomics


@pytest.mark.parametrize("batch,hw,fp16", [(1, 7, False), (3, 5, True), (2, 12, False)])
def test_a_global_mean_is_summed_by_the_linear_layer_over_pixels(batch, hw, fp16):
    """ConvNeXt's last linear layer (channels-last rows of pixels) stores its map and the mean
    over each sample's pixels; rows of several samples (5x5) and samples over several row
    tiles (12x12) give their parts per sample."""
    from tests.passes.test_reduction_epilogue import dot_mean_model

    c = check_gpu(dot_mean_model(batch=batch, hw=hw), tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    (k,) = c.kernels
    assert k.src.kernel_name.endswith("reduce_mean") and k.src.args[-2:] == ["part", "pcnt"]


@pytest.mark.parametrize("hw", [12, 30])
def test_depthwise_squeeze_parts_are_combined_across_many_pixel_blocks(hw):
    """The smallest pixel block over 12x12 pixels: several blocks per sample; over 30x30, more
    blocks per sample than the last program adds in one load (gemm_reduce.PART_ROWS), and
    blocks that straddle the two samples."""
    from fusegraph.targets.gpu.templates.gemm_reduce import PART_ROWS
    from tests.passes.test_reduction_epilogue import se_model

    program = parse_onnx(se_model(batch=2, hw=hw, depthwise=True))
    compiled = api.compile(program, "gpu", tune=False)
    k = compiled.kernels[0]
    assert k.src.template == "depthwise"
    k.config = min(k.src.configs, key=lambda cfg: cfg["BP"])
    assert k.config["BP"] < 144
    if hw == 30:
        assert hw * hw // k.config["BP"] > 2 * PART_ROWS and hw * hw % k.config["BP"]
    inputs = {"x": np.random.default_rng(1).standard_normal((2, 32, hw, hw)).astype(np.float32)}
    compiled.poison()
    got, want = compiled.run(inputs)["y"], api.run(program, inputs)["y"]
    assert float(np.abs(got - want).max()) <= 1e-4 * float(np.abs(want).max())


def test_se_squeeze_parts_are_combined_across_many_row_tiles():
    """The smallest row tile over 12x12 pixels: several row tiles per sample."""
    from tests.passes.test_reduction_epilogue import se_model

    program = parse_onnx(se_model(batch=2, hw=12))
    compiled = api.compile(program, "gpu", tune=False)
    k = compiled.kernels[0]
    k.config = min(k.src.configs, key=lambda cfg: cfg["BM"])
    assert k.config["BM"] < 144
    inputs = {"x": np.random.default_rng(1).standard_normal((2, 16, 12, 12)).astype(np.float32)}
    compiled.poison()
    got, want = compiled.run(inputs)["y"], api.run(program, inputs)["y"]
    assert float(np.abs(got - want).max()) <= 1e-4 * float(np.abs(want).max())


def test_a_global_mean_after_a_split_product_is_summed_by_the_programs_that_finish_its_tiles():
    """ConvNeXt-T's last linear layer at batch 1 (few rows, a long k loop) splits k; only the
    program that adds a tile's k slices adds its rows into the mean. Every split candidate,
    run twice: the counters are cleared for the next run, and both runs give the same bits."""
    from tests.passes.test_reduction_epilogue import dot_mean_model

    program = parse_onnx(dot_mean_model(batch=2, hw=5, c=512, n=40))
    compiled = api.compile(program, "gpu", tune=False)
    (k,) = compiled.kernels
    assert k.src.kernel_name.endswith("reduce_mean")
    splits = [cfg for cfg in k.src.configs if cfg["SPLIT"] > 1]
    assert {cfg["SPLIT"] for cfg in splits} >= {2, 4}
    # the interpreter runs programs one after another, the owner last, which hides a race:
    # the parts and the counter must be left to the owner, as the source shows
    lines = k.src.source.splitlines()
    at = next(i for i, line in enumerate(lines) if "atomic_add(pcnt" in line)
    owner = max(i for i in range(at) if lines[i].strip() == "if owner:")
    indent = len(lines[owner]) - len(lines[owner].lstrip())
    assert all(len(line) - len(line.lstrip()) > indent for line in lines[owner + 1:at + 1] if line.strip())
    rng = np.random.default_rng(3)
    inputs = {"x": rng.standard_normal((2, 5, 5, 512)).astype(np.float32),
              "r": rng.standard_normal((2, 40, 5, 5)).astype(np.float32)}
    want = api.run(program, inputs)
    for cfg in splits[:3]:
        k.config = cfg
        compiled.poison()
        first = compiled.run(inputs)
        second = compiled.run(inputs)
        for name in ("s", "m"):
            err = float(np.abs(first[name] - want[name]).max())
            assert err <= 1e-4 * float(np.abs(want[name]).max()), (cfg, name, err)
            np.testing.assert_array_equal(first[name], second[name])


@pytest.mark.slow
def test_the_epilogue_reduction_kernels_compile_for_sm90():
    """The real backend (not the interpreter) accepts the pixel sums' slots loop, the tile
    softmax and the further output stores: fp16 kernels built for the H200 without a GPU."""
    pytest.importorskip("triton")
    from fusegraph.ir.dtypes import DType
    from fusegraph.ops.base import is_fused
    from fusegraph.passes.pipeline import fuse
    from fusegraph.passes.to_half import ToHalf
    from fusegraph.targets.gpu.ahead_of_time import arg_dtypes, compile_many
    from fusegraph.targets.gpu.codegen import generate, kernel_inputs, plan_program
    from fusegraph.targets.gpu.device import H200
    from tests.passes.test_reduction_epilogue import se_model

    jobs = []
    for model in (se_model(batch=2, hw=12), se_model(batch=2, hw=12, depthwise=True),
                  head_model(192, [1, 12, 3, 64], [0, 2, 1, 3]), residual_model(readers=2)):
        program = parse_onnx(model)
        ToHalf(DType.float16).apply(program.main)
        fuse(program)
        plan = plan_program(program.main)
        ins = next(i for i in program.main if is_fused(i))
        src = generate(ins, 0, kernel_inputs(ins, plan))
        jobs.append((src, arg_dtypes(ins, src)))
    for (src, _), r in zip(jobs, compile_many(jobs, workers=1)):
        assert r.cubin_bytes > 0 and r.shared_bytes <= H200.shared_bytes_per_block, src.name


@pytest.mark.parametrize("op,fp16", [("ReduceMax", False), ("ReduceMean", True), ("ReduceSum", False)])
def test_a_row_fold_over_a_padded_product_row_is_its_epilogue(op, fp16):
    """A fold over the 100 columns of each row (a tile of 128): padding lanes at the identity."""
    m = make_model([node("MatMul", ["x", "w"], ["g"]), node("Add", ["g", "b"], ["a"]),
                    node(op, ["a", "axes"], ["y"], keepdims=1)],
                   {"x": [1, 12, 32]}, ["y"], {"w": rand(32, 100, seed=1), "b": rand(100, seed=2),
                                               "axes": np.array([-1], np.int64)}, opset=18)
    c = check_gpu(m, tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    assert len(c.kernels) == 1 and c.kernels[0].src.template == "gemm"


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("pre_norm,affine", [(False, True), (True, False)])
def test_a_layernorm_over_a_convolutions_channels_is_its_epilogue(fp16, pre_norm, affine):
    """ConvNeXt's stem: conv -> channels-last -> layernorm over 24 channels (a tile of 32, 8
    padding lanes), stored beside the conv's output when that is returned too."""
    from tests.passes.test_segment_layernorm import stem_model

    c = check_gpu(stem_model(also_pre_norm=pre_norm, affine=affine), tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    assert [k.src.kernel_name for k in c.kernels] == ["conv_add_transpose_layernorm", "conv"]
    assert {cfg["BN"] for cfg in c.kernels[0].src.configs} == {32}
    assert ("out1" in c.kernels[0].src.args) == pre_norm


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("rms", [False, True])
def test_a_post_norm_after_a_residual_is_the_products_epilogue(fp16, rms):
    from tests.passes.test_segment_layernorm import residual_norm_model

    c = check_gpu(residual_norm_model(96, rms=rms), tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    assert [k.src.kernel_name for k in c.kernels] == ["dot_add_rmsnorm" if rms else "dot_add_layernorm"]
    assert {cfg["BN"] for cfg in c.kernels[0].src.configs} == {128}
