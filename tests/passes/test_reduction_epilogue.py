"""A softmax inside a product's epilogue (passes/reduction_epilogue.py, applied by FuseAnchors):
legal exactly when, through the epilogue's index map, the softmax axis is the anchor's channel
index modulo the axis' length and no other axis reads that remainder, and the run is at most
256 wide; the group then computes a `segment_softmax` in the anchor's index space."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import api, parse_onnx
from fusegraph.ir.dtypes import DType
from fusegraph.ir.index_expr import Var, floordiv, mod
from fusegraph.ir.index_map import IndexMap
from fusegraph.ir.program import Instruction, Program
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.reduce import SegmentSoftmax, Softmax
from fusegraph.ops.source import add_literal, add_param
from fusegraph.ops.views import Reshape, Transpose
from fusegraph.passes.fuse_anchors import FuseAnchors
from fusegraph.passes.reduction_epilogue import run_length
from tests.helpers import assert_same_results, make_model, op_names, printed, rand

TOLERANCE = 1e-6


def head(split: list[int], perm: list[int], axis: int, n: int = 192, log: bool = False) -> Program:
    """softmax(transpose(reshape(dot(x, w), split), perm), axis) over a [1, 8, n] product."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [1, 8, 32]))
    d = m.add(make_op("dot"), [x, add_literal(m, rand(1, 32, n, seed=1))])
    t = m.add(Transpose(perm), [m.add(Reshape(split), [d])])
    m.set_returns([m.add(Softmax(axis, log), [t])], ["y"])
    return p


def test_a_softmax_over_a_64_wide_head_joins_the_product():
    before, after = head([1, 8, 3, 64], [0, 2, 1, 3], 3), head([1, 8, 3, 64], [0, 2, 1, 3], 3)
    assert op_names(before.main) == ["@param", "@literal", "dot", "reshape", "transpose", "softmax"]
    assert FuseAnchors().apply(after.main)
    assert op_names(after.main) == ["@param", "@literal", "fused"]
    assert printed(after.main)[3] == ("@2 = dot_reshape_transpose_softmax[module=fused0](@0,@1) -> float_type, "
                                      "{1, 3, 8, 64}, {1536, 512, 64, 1}")
    sub = printed(after.main.instructions[2].op.module)
    assert sub[-5:-1] == [
        "@4 = dot(@1,@3) -> float_type, {1, 8, 192}, {1536, 192, 1}",
        "@5 = segment_softmax[axis=2,length=64,log=False](@4) -> float_type, {1, 8, 192}, {1536, 192, 1}",
        "@6 = allocate[float_type,{1,3,8,64}] -> float_type, {1, 3, 8, 64}, {1536, 512, 64, 1}",
        "@7 = store[{1, 8, 192} -> {1, 3, 8, 64}: (i0, i1, i2) -> (0, (i2 // 64), i1, (i2 % 64))](@6,@5) -> "
        "float_type, {1, 3, 8, 64}, {1536, 512, 64, 1}"]
    assert_same_results(before, after, tolerance=TOLERANCE)


@pytest.mark.parametrize("split,perm,axis,n,why", [
    ([1, 8, 3, 64], [0, 2, 3, 1], 3, 192, "softmax over the product's rows"),
    ([1, 8, 64, 3], [0, 1, 3, 2], 3, 192, "the run is the channel index divided by 3, strided channels"),
    ([1, 8, 1, 320], [0, 1, 2, 3], 3, 320, "a run wider than 256 channels"),
])
def test_a_softmax_whose_runs_leave_a_tile_stays_a_kernel(split, perm, axis, n, why):
    before, after = head(split, perm, axis, n), head(split, perm, axis, n)
    FuseAnchors().apply(after.main)
    assert op_names(after.main)[-1] == "softmax", why
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_log_softmax_over_a_whole_product_row_joins_it():
    before, after = head([1, 8, 100], [0, 1, 2], 2, n=100, log=True), head([1, 8, 100], [0, 1, 2], 2, n=100, log=True)
    FuseAnchors().apply(after.main)
    assert op_names(after.main) == ["@param", "@literal", "fused"]
    assert "segment_softmax[axis=2,length=100,log=True]" in str(after.main.instructions[2].op.module)
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_the_rule_reads_the_run_from_the_index_map():
    anchor = Instruction(make_op("dot"), [], Shape.of(DType.float32, [8, 192]))
    i0, i1 = Var("i0", 8), Var("i1", 192)
    heads = IndexMap([i0, i1], [floordiv(i1, 64), i0, mod(i1, 64)], [3, 8, 64])
    assert run_length(heads, anchor, 2) == 64
    assert run_length(heads, anchor, 1) is None  # the rows
    strided = IndexMap([i0, i1], [i0, mod(i1, 3), floordiv(i1, 3)], [8, 3, 64])
    assert run_length(strided, anchor, 2) is None


def test_segment_softmax_reference_is_softmax_per_run():
    x = np.random.default_rng(0).standard_normal((2, 6, 3)).astype(np.float32)
    got = SegmentSoftmax(1, 3).reference([x])
    e = np.exp(x.reshape(2, 2, 3, 3) - x.reshape(2, 2, 3, 3).max(axis=2, keepdims=True))
    np.testing.assert_allclose(got, (e / e.sum(axis=2, keepdims=True)).reshape(2, 6, 3), rtol=1e-6)


def conv_softmax_model():
    """A 1x1 conv of 32 channels, softmax over its channels (an NCHW axis 1)."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Softmax", ["c"], ["y"], axis=1)]
    return make_model(nodes, {"x": [1, 16, 5, 5]}, ["y"], {"w": rand(32, 16, 1, 1, seed=3), "b": rand(32, seed=4)})


def test_a_softmax_over_a_convolutions_channels_joins_it():
    program = parse_onnx(conv_softmax_model())
    api.fuse(program)
    assert [i.op.attrs["kernel"] for i in program.main if i.op.name == "fused"] == ["conv_add_softmax"]
    assert_same_results(parse_onnx(conv_softmax_model()), program, tolerance=1e-5)


def dfl_model(h: int = 4, w: int = 4):
    """YOLOv8's detection tail after its head convs, one level: box logits [1, 64, h, w] ->
    reshape {1,4,16,hw} -> transpose -> softmax over the 16 bins -> 1x1 conv with weights 0..15
    (the expected bin) -> distances lt, rb -> box centre and size from the anchor points ->
    times the stride; class logits -> sigmoid; both concatenated."""
    hw = h * w
    n = lambda op, i, o, **a: helper.make_node(op, i, o, **a)
    nodes = [n("Conv", ["x", "wb", "bb"], ["box"], pads=[1, 1, 1, 1]), n("Conv", ["x", "wc", "bc"], ["cls"]),
             n("Reshape", ["box", "s4"], ["b4"]), n("Transpose", ["b4"], ["bt"], perm=[0, 2, 1, 3]),
             n("Softmax", ["bt"], ["sm"], axis=1), n("Conv", ["sm", "wd"], ["d"]), n("Reshape", ["d", "s3"], ["dist"]),
             n("Slice", ["dist", "z", "two", "one"], ["lt"]), n("Slice", ["dist", "two", "four", "one"], ["rb"]),
             n("Sub", ["anc", "lt"], ["xy1"]), n("Add", ["anc", "rb"], ["xy2"]), n("Add", ["xy1", "xy2"], ["sxy"]),
             n("Div", ["sxy", "half"], ["cxy"]), n("Sub", ["xy2", "xy1"], ["wh"]), n("Concat", ["cxy", "wh"], ["bx"], axis=1),
             n("Mul", ["bx", "stride"], ["dbox"]), n("Reshape", ["cls", "sc"], ["c3"]), n("Sigmoid", ["c3"], ["cs"]),
             n("Concat", ["dbox", "cs"], ["y"], axis=1)]
    grid = np.stack(np.meshgrid(np.arange(w) + 0.5, np.arange(h) + 0.5)[::-1], 0)[::-1].reshape(1, 2, hw)
    inits = {"wb": rand(64, 8, 3, 3, seed=1, scale=0.3), "bb": rand(64, seed=2), "wc": rand(8, 8, 1, 1, seed=3),
             "bc": rand(8, seed=4), "wd": np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1),
             "s4": np.array([1, 4, 16, hw], np.int64), "s3": np.array([1, 4, hw], np.int64),
             "sc": np.array([1, 8, hw], np.int64), "z": np.array([0], np.int64), "two": np.array([2], np.int64),
             "four": np.array([4], np.int64), "one": np.array([1], np.int64), "anc": grid.astype(np.float32),
             "half": np.array(2.0, np.float32), "stride": np.array(8.0, np.float32)}
    return make_model(nodes, {"x": [1, 8, h, w]}, ["y"], inits)


def test_yolov8s_dfl_softmax_runs_inside_its_head_conv():
    """The head conv computes the softmax over the 16 bins and their weighted sum (the 1x1 conv
    with weights 0..15, `weighted_sum_epilogue.py`) in its epilogue; the box arithmetic combines
    its channels j and j + 2, which one element of an epilogue cannot read: one pointwise kernel
    does it, reading the concat of centre and size as a select."""
    program = parse_onnx(dfl_model())
    api.fuse(program)
    kernels = [i.op.attrs["kernel"] for i in program.main if i.op.name == "fused"]
    assert kernels == ["conv_add_reshape_transpose_softmax_slice_sub", "add_div_sub_concat_mul", "conv_add_reshape_sigmoid"]
    box = next(i for i in program.main if i.op.name == "fused")
    assert "segment_reduce" in str(box.op.module)
    assert_same_results(parse_onnx(dfl_model()), program, tolerance=1e-5)



def se_model(batch: int = 1, c: int = 32, hw: int = 6, depthwise: bool = False):
    """A squeeze-and-excitation block after a conv + SiLU (a depthwise one: MobileNetV3's and
    EfficientNet's): global mean -> fc -> relu -> fc -> sigmoid -> scale the SiLU output per
    channel."""
    n = lambda op, i, o, **a: helper.make_node(op, i, o, **a)
    groups = {"group": c} if depthwise else {}
    nodes = [n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], **groups), n("Sigmoid", ["c"], ["sg"]), n("Mul", ["c", "sg"], ["a"]),
             n("GlobalAveragePool", ["a"], ["m"]), n("Conv", ["m", "w1", "b1"], ["f1"]), n("Relu", ["f1"], ["r1"]),
             n("Conv", ["r1", "w2", "b2"], ["f2"]), n("Sigmoid", ["f2"], ["s"]), n("Mul", ["a", "s"], ["y"])]
    cin = c if depthwise else 16
    inits = {"w": rand(c, 1 if depthwise else cin, 3, 3, seed=1, scale=0.2), "b": rand(c, seed=2),
             "w1": rand(8, c, 1, 1, seed=3, scale=0.3), "b1": rand(8, seed=4), "w2": rand(c, 8, 1, 1, seed=5, scale=0.3),
             "b2": rand(c, seed=6)}
    return make_model(nodes, {"x": [batch, cin, hw, hw]}, ["y"], inits)


def test_an_se_squeeze_is_stored_by_the_conv_that_produces_its_input():
    """conv + SiLU stores its full output (for the scale) and the per-channel mean (for the
    first fc) in one kernel: no standalone mean."""
    program = parse_onnx(se_model(batch=2))
    api.fuse(program)
    kernels = [i for i in program.main if i.op.name == "fused"]
    assert [k.op.attrs["kernel"] for k in kernels] == ["conv_add_sigmoid_mul_reduce_mean", "conv_add_relu",
                                                       "conv_add_sigmoid", "mul"]
    sub = kernels[0].op.module
    assert "epilogue_sum[axes={2,3},mean=True]" in str(sub)
    assert [r.shape.lens for r in sub.returns] == [(2, 32, 1, 1), (2, 32, 6, 6)]
    assert_same_results(parse_onnx(se_model(batch=2)), program, tolerance=1e-5)


def dot_mean_model(batch: int = 2, hw: int = 7, c: int = 24, n: int = 32, shared: bool = True):
    """A linear layer over the pixels of a channels-last map, its bias, a transpose back to
    channels-first and a residual, then the global mean over the pixels: ConvNeXt's last
    block and head. `shared=False` gives every sample weights of its own (a batched product)."""
    nd = helper.make_node
    nodes = [nd("MatMul", ["x", "w"], ["y"]), nd("Add", ["y", "b"], ["yb"]), nd("Transpose", ["yb"], ["t"], perm=[0, 3, 1, 2]),
             nd("Add", ["t", "r"], ["s"]), nd("ReduceMean", ["s"], ["m"], axes=[2, 3], keepdims=1)]
    w = rand(c, n, seed=1, scale=0.3) if shared else rand(batch, 1, c, n, seed=1, scale=0.3)
    return make_model(nodes, {"x": [batch, hw, hw, c], "r": [batch, n, hw, hw]}, ["s", "m"], {"w": w, "b": rand(n, seed=2)})


def test_a_global_mean_after_a_linear_layer_over_pixels_is_its_epilogue():
    """The product's rows are every sample's pixels (its weights shared by all): the mean over
    them is an epilogue sum over the product's middle axes, stored beside the map."""
    program = parse_onnx(dot_mean_model())
    api.fuse(program)
    (kernel,) = [i for i in program.main if i.op.name == "fused"]
    assert kernel.op.attrs["kernel"].startswith("dot") and kernel.op.attrs["kernel"].endswith("reduce_mean")
    assert "epilogue_sum[axes={1,2},mean=True]" in str(kernel.op.module)
    assert sorted(r.shape.lens for r in kernel.op.module.returns) == [(2, 32, 1, 1), (2, 32, 7, 7)]
    assert_same_results(parse_onnx(dot_mean_model()), program, tolerance=1e-5)


def test_a_mean_after_a_product_with_weights_per_sample_keeps_its_kernel():
    """Weights of its own per sample make the sample the kernel's batch index, not part of its
    rows: the mean stays a kernel of its own."""
    program = parse_onnx(dot_mean_model(shared=False))
    api.fuse(program)
    kernels = [i.op.attrs["kernel"] for i in program.main if i.op.name == "fused"]
    assert len(kernels) == 2 and kernels[-1] == "reduce_mean"
    assert_same_results(parse_onnx(dot_mean_model(shared=False)), program, tolerance=1e-5)


def test_a_mean_after_a_product_the_gpu_splits_still_joins_it():
    """Few rows over a long k loop (ConvNeXt-T's last linear layer at batch 1): the template
    splits k, and the program that finishes each tile adds its rows; with rows enough the
    product is not split, and takes the mean all the same."""
    for batch in (1, 30):  # 144 rows over k 512 (split), 30 x 144 rows (135 tiles of 32 rows)
        program = parse_onnx(dot_mean_model(batch=batch, hw=12, c=512))
        api.fuse(program)
        (kernel,) = [i for i in program.main if i.op.name == "fused"]
        assert kernel.op.attrs["kernel"].endswith("reduce_mean"), batch
        assert "epilogue_sum[axes={1,2},mean=True]" in str(kernel.op.module)


def pixel_program(axes: list[int], op: str = "reduce_mean", then_relu: bool = False) -> Program:
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [2, 3, 4, 5]))
    conv = make_op("convolution", padding=(0, 0, 0, 0), stride=(1, 1), dilation=(1, 1))
    c = m.add(make_op("relu"), [m.add(conv, [x, add_literal(m, rand(6, 3, 1, 1, seed=1))])])
    r = m.add(make_op(op, axes=axes), [c])
    m.set_returns([m.add(make_op("relu"), [r]) if then_relu else r], ["y"])
    return p


@pytest.mark.parametrize("axes,op,fused", [([2, 3], "reduce_mean", True), ([2, 3], "reduce_sum", True),
                                           ([3], "reduce_mean", False), ([1, 2, 3], "reduce_mean", False),
                                           ([2, 3], "reduce_max", False)])
def test_only_sums_over_all_of_a_samples_pixels_join_the_conv(axes, op, fused):
    before, after = pixel_program(axes, op), pixel_program(axes, op)
    FuseAnchors().apply(after.main)
    assert (op_names(after.main) == ["@param", "@literal", "fused"]) == fused
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_pixel_sum_is_only_stored():
    """No epilogue member may read the sum (each program holds part of the pixels): the relu
    after it is a kernel of its own."""
    before, after = pixel_program([2, 3], then_relu=True), pixel_program([2, 3], then_relu=True)
    FuseAnchors().apply(after.main)
    assert op_names(after.main) == ["@param", "@literal", "fused", "relu"]
    assert_same_results(before, after, tolerance=TOLERANCE)


@pytest.mark.parametrize("op", ["reduce_max", "reduce_sum", "reduce_mean", "reduce_min"])
def test_a_row_fold_over_a_head_joins_the_product(op):
    """max/sum/mean/min over each 64-wide head: a segment_reduce, stored once per row and head."""
    def build() -> Program:
        p = head([1, 8, 3, 64], [0, 2, 1, 3], 3)
        m = p.main
        t = m.returns[0].inputs[0]
        m.set_returns([m.add(make_op(op, axes=[3]), [t])], ["y"])
        m.remove_dead_code()
        return p

    before, after = build(), build()
    FuseAnchors().apply(after.main)
    assert op_names(after.main) == ["@param", "@literal", "fused"]
    sub = after.main.instructions[2].op.module
    assert "segment_reduce[axis=2,length=64" in str(sub)
    assert str(sub.returns[0].op.attrs["map"]) == "{1, 8, 192} -> {1, 3, 8, 1}: (i0, i1, i2) -> (0, (i2 // 64), i1, 0)"
    assert_same_results(before, after, tolerance=TOLERANCE)
