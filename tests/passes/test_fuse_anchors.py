"""Anchor fusion (passes/fuse_anchors.py): a convolution, product or pooling becomes one fused
instruction with its invertible epilogue (`FuseAnchors`); reductions (`FuseReductions`) and data
movement other than concat and view-like resizes (`FuseMovement`) do the same and also recompute
their pointwise producers inside the kernel."""

from __future__ import annotations

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction, Module, Program
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.movement import Concat, Pad, Resize
from fusegraph.ops.source import add_literal, add_param
from fusegraph.ops.views import MultiBroadcast, Transpose
from fusegraph.passes.fuse_anchors import FuseAnchors, FuseMovement, FuseReductions
from tests.helpers import assert_same_results, op_names, printed, rand

TOLERANCE = 1e-6  # fused groups compute the same ops on the same values, element by element


def _conv(m: Module, x: Instruction, out_channels: int) -> Instruction:
    w = add_literal(m, rand(out_channels, x.shape.lens[1], 1, 1, seed=1))
    return m.add(make_op("convolution", padding=(0, 0, 0, 0), stride=(1, 1), dilation=(1, 1)), [x, w])


def _bias(m: Module, lens) -> Instruction:
    return m.add(MultiBroadcast(lens), [add_literal(m, rand(1, lens[1], 1, 1, seed=2))])


def _store_maps(fused: Instruction) -> list[str]:
    return [str(i.op.attrs["map"]) for i in fused.op.module if i.op.name == "store"]


def conv_epilogue() -> Program:
    """reduce_sum(transpose(relu(conv(x) + b))) over image columns (a reduction no epilogue takes)."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [1, 2, 4, 4]))
    c = _conv(m, x, 3)
    r = m.add(make_op("relu"), [m.add(make_op("add"), [c, _bias(m, c.shape.lens)])])
    t = m.add(Transpose([0, 2, 3, 1]), [r])
    m.set_returns([m.add(make_op("reduce_sum", axes=[2]), [t])], ["y"])
    return p


def test_a_conv_takes_its_pointwise_and_transpose_epilogue():
    before, after = conv_epilogue(), conv_epilogue()
    assert op_names(before.main) == ["@param", "@literal", "convolution", "@literal", "multibroadcast", "add", "relu",
                                     "transpose", "reduce_sum"]
    assert FuseAnchors().apply(after.main)
    assert op_names(after.main) == ["@param", "@literal", "@literal", "fused", "reduce_sum"]
    fused = after.main.instructions[3]
    assert printed(after.main)[4] == "@3 = conv_add_relu_transpose[module=fused0](@0,@1,@2) -> float_type, {1, 4, 4, 3}, {48, 12, 3, 1}"
    assert op_names(fused.op.module) == ["@param", "load", "@param", "load", "convolution", "@param", "load", "add",
                                         "relu", "allocate", "store"]
    # the kernel writes the transposed layout itself
    assert _store_maps(fused) == ["{1, 3, 4, 4} -> {1, 4, 4, 3}: (i0, i1, i2, i3) -> (i0, i2, i3, i1)"]
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_an_anchor_read_elsewhere_is_a_further_output_of_its_group():
    """relu(c) + broadcast(reduce_sum(c) over image rows): the add would read a value that
    needs the anchor's whole output first, so the epilogue stops at the relu; the anchor, also
    read by the reduction, is the group's second stored value."""
    def build() -> Program:
        p = Program()
        m = p.main
        x = add_param(m, "x", Shape.of(DType.float32, [1, 2, 3, 3]))
        c = _conv(m, x, 3)
        r = m.add(make_op("relu"), [c])
        s = m.add(MultiBroadcast(c.shape.lens), [m.add(make_op("reduce_sum", axes=[2]), [c])])
        m.set_returns([m.add(make_op("add"), [r, s])], ["y"])
        return p

    before, after = build(), build()
    assert FuseAnchors().apply(after.main)
    assert op_names(after.main) == ["@param", "@literal", "fused", "fused_output", "reduce_sum", "multibroadcast", "add"]
    assert printed(after.main)[3:5] == [
        "@2 = conv_relu[module=fused0](@0,@1) -> float_type, {1, 3, 3, 3}, {27, 9, 3, 1}",
        "@3 = fused_output[index=1](@2) -> float_type, {1, 3, 3, 3}, {27, 9, 3, 1}"]
    assert printed(after.main)[5] == "@4 = reduce_sum[axes={2}](@3) -> float_type, {1, 3, 1, 3}, {9, 3, 3, 1}"
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_programs_without_anchors_are_left_to_the_other_passes():
    p = reduction_program()
    text = str(p)
    assert not FuseAnchors().apply(p.main)
    assert not FuseMovement().apply(p.main)
    assert str(p) == text


def reduction_program() -> Program:
    """reduce_mean(exp(x)) over the last axis, times 2."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [3, 5]))
    s = m.add(make_op("reduce_mean", axes=[1]), [m.add(make_op("exp"), [x])])
    two = m.add(MultiBroadcast(s.shape.lens), [add_literal(m, np.float32(2.0))])
    m.set_returns([m.add(make_op("mul"), [s, two])], ["y"])
    return p


def test_a_reduction_recomputes_its_prologue_and_takes_its_epilogue():
    before, after = reduction_program(), reduction_program()
    assert FuseReductions().apply(after.main)
    assert op_names(after.main) == ["@param", "@literal", "fused"]
    fused = after.main.instructions[2]
    assert fused.op.attrs["kernel"] == "exp_reduce_mean_mul"
    assert op_names(fused.op.module) == ["@param", "load", "exp", "reduce_mean", "@param", "load", "mul", "allocate",
                                         "store"]
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_reduction_recomputes_pointwise_producers_but_not_an_anchor():
    """The add and relu between the conv and the reduction move into the reduction's kernel;
    the conv stays an instruction of its own for anchor fusion."""
    before, after = conv_epilogue(), conv_epilogue()
    assert FuseReductions().apply(after.main)
    assert op_names(after.main) == ["@param", "@literal", "convolution", "@literal", "fused"]
    assert printed(after.main)[:4] == printed(before.main)[:4]
    fused = after.main.instructions[4]
    assert fused.inputs[0] is after.main.instructions[2]
    assert fused.op.attrs["kernel"] == "add_relu_reduce_sum"
    assert_same_results(before, after, tolerance=TOLERANCE)


def movement_program() -> Program:
    """pad(sigmoid(x)), concatenated with a nearest 2x upsampling of x (a view) and negated."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [1, 2, 3, 3]))
    padded = m.add(Pad([0, 0, 1, 2, 0, 0, 2, 1]), [m.add(make_op("sigmoid"), [x])])
    up = m.add(Resize([1, 2, 6, 6], [1.0, 1.0, 2.0, 2.0], coordinate_transformation_mode="asymmetric"), [x])
    cat = m.add(Concat(1), [padded, up])
    m.set_returns([m.add(make_op("neg"), [cat])], ["y"])
    return p


def test_a_pad_fuses_with_its_producer_but_concat_and_view_resizes_stay():
    before, after = movement_program(), movement_program()
    assert FuseMovement().apply(after.main)
    assert op_names(after.main) == ["@param", "fused", "resize", "concat", "neg"]
    assert after.main.instructions[1].op.attrs["kernel"] == "sigmoid_pad"
    assert_same_results(before, after, tolerance=TOLERANCE)
