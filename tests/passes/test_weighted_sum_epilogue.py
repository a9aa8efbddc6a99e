"""A product of one output channel inside another product's epilogue
(passes/weighted_sum_epilogue.py, applied by FuseAnchors): a 1x1 convolution with one output
channel, or a matrix product with one output column, is a weighted sum over its K; when K is
the anchor's channel index modulo K (a run that a tile of output channels holds), the epilogue
multiplies by the weights and adds across the run (`segment_reduce`)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import api, parse_onnx
from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Program
from fusegraph.ir.shape import Shape
from fusegraph.ops.anchors import Convolution
from fusegraph.ops.source import add_literal, add_param
from fusegraph.passes.weighted_sum_epilogue import summed_axis
from tests.helpers import assert_same_results, make_model, rand

TOLERANCE = 1e-5  # the weighted sum adds in another order than the convolution's reference


def conv_softmax_sum(kernel: int = 1, out_channels: int = 1, channels: int = 16, softmax: bool = True):
    """1x1 conv to `channels`, softmax over them (or not), then a conv with `out_channels`
    outputs and a kernel x kernel window (padded to keep the size)."""
    pad = (kernel - 1) // 2
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]),
             helper.make_node("Softmax" if softmax else "Relu", ["c"], ["s"], **({"axis": 1} if softmax else {})),
             helper.make_node("Conv", ["s", "wd"], ["y"], pads=[pad] * 4)]
    return make_model(nodes, {"x": [1, 8, 5, 5]}, ["y"], {
        "w": rand(channels, 8, 1, 1, seed=1), "b": rand(channels, seed=2),
        "wd": rand(out_channels, channels, kernel, kernel, seed=3)})


def kernels(program: Program) -> list[str]:
    return [i.op.attrs["kernel"] for i in program.main if i.op.name == "fused"]


def test_a_one_channel_1x1_conv_after_a_softmax_joins_the_conv_before():
    before, after = parse_onnx(conv_softmax_sum()), parse_onnx(conv_softmax_sum())
    api.fuse(after)
    assert kernels(after) == ["conv_add_softmax"]
    (k,) = [i for i in after.main if i.op.name == "fused"]
    ops = [i.op.name for i in k.op.module]
    assert ops[ops.index("segment_softmax"):] == ["segment_softmax", "@param", "load", "mul", "segment_reduce",
                                                   "allocate", "store"]
    weights = k.op.module.instructions[ops.index("load", ops.index("segment_softmax"))]
    assert str(weights.op.attrs["map"]) == "{1, 16, 5, 5} -> {1, 16, 1, 1}: (i0, i1, i2, i3) -> (0, i1, 0, 0)"
    assert k.shape.lens == (1, 1, 5, 5)
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_one_channel_1x1_conv_sums_all_channels_of_the_conv_before():
    """Without a softmax the run is all of the first conv's 16 channels."""
    before, after = parse_onnx(conv_softmax_sum(softmax=False)), parse_onnx(conv_softmax_sum(softmax=False))
    api.fuse(after)
    assert kernels(after) == ["conv_add_relu"]
    assert "segment_reduce[axis=1,length=16,combine=add,finalize=None]" in str(after.main.instructions[-1].op.module)
    assert_same_results(before, after, tolerance=TOLERANCE)


@pytest.mark.parametrize("kernel,out_channels,channels,why", [
    (3, 1, 16, "a 3x3 window reads neighbouring pixels, which other rows of the tile hold"),
    (1, 2, 16, "two output channels are two sums"),
    (1, 1, 320, "a run of 320 channels is wider than a tile (256)"),
])
def test_other_products_stay_kernels_of_their_own(kernel, out_channels, channels, why):
    def build():
        return parse_onnx(conv_softmax_sum(kernel, out_channels, channels, softmax=False))

    before, after = build(), build()
    api.fuse(after)
    assert kernels(after) == ["conv_add_relu", "conv"], why
    assert_same_results(before, after, tolerance=TOLERANCE)


def head_sum_model():
    """MatMul -> reshape into heads of 16 -> softmax per head -> MatMul with one column."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["g"]), helper.make_node("Reshape", ["g", "shape"], ["r"]),
             helper.make_node("Softmax", ["r"], ["s"], axis=-1), helper.make_node("MatMul", ["s", "v"], ["y"])]
    return make_model(nodes, {"x": [1, 6, 32]}, ["y"], {
        "w": rand(32, 64, seed=1), "shape": np.array([1, 6, 4, 16], np.int64), "v": rand(16, 1, seed=2)})


def test_a_one_column_matrix_product_after_a_head_softmax_joins_the_product_before():
    before, after = parse_onnx(head_sum_model()), parse_onnx(head_sum_model())
    api.fuse(after)
    assert kernels(after) == ["dot_reshape_softmax"]
    (k,) = [i for i in after.main if i.op.name == "fused"]
    assert k.shape.lens == (1, 6, 4, 1)
    assert "segment_reduce[axis=2,length=16,combine=add,finalize=None]" in str(k.op.module)
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_summed_axis_is_k_of_a_one_channel_product_without_a_window():
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [1, 16, 4, 4]))
    conv = lambda w, pads=(0, 0, 0, 0), stride=(1, 1): m.add(Convolution(pads, stride, [1, 1]), [x, add_literal(m, w)])
    assert summed_axis(conv(rand(1, 16, 1, 1))) == 1
    assert summed_axis(conv(rand(2, 16, 1, 1))) is None
    assert summed_axis(conv(rand(1, 16, 1, 1), stride=(2, 2))) is None
    assert summed_axis(conv(rand(1, 16, 1, 1), pads=(1, 1, 1, 1))) is None
    assert summed_axis(conv(rand(1, 16, 3, 3), pads=(1, 1, 1, 1))) is None
