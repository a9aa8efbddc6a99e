"""Pointwise fusion (passes/fuse_pointwise.py): the pointwise ops left after anchor fusion form
one kernel per root (a pointwise value read by something that is not pointwise, through any
views, or returned); a root's pointwise producers are recomputed in its kernel, read through
the views in between. A concat read only by pointwise ops, with a part that would cost a kernel
of its own, is read as a select of its parts in their kernels."""

from __future__ import annotations

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Program
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.movement import Concat
from fusegraph.ops.reduce import Softmax
from fusegraph.ops.source import add_literal, add_param
from fusegraph.ops.views import MultiBroadcast, Transpose
from fusegraph.passes.fuse_anchors import FuseReductions
from fusegraph.passes.fuse_pointwise import FusePointwise
from tests.helpers import assert_same_results, op_names, printed

TOLERANCE = 1e-6  # the kernels compute the same ops on the same values, element by element


def chain() -> Program:
    """transpose(sigmoid(x + 1)), the transpose returned."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [2, 3]))
    one = m.add(MultiBroadcast((2, 3)), [add_literal(m, np.float32(1.0))])
    s = m.add(make_op("sigmoid"), [m.add(make_op("add"), [x, one])])
    m.set_returns([m.add(Transpose([1, 0]), [s])], ["y"])
    return p


def test_a_pointwise_chain_becomes_one_kernel_and_a_returned_view_stays():
    before, after = chain(), chain()
    assert FusePointwise().apply(after.main)
    assert printed(after.main) == [
        'module: "main"',
        "@0 = @param:x -> float_type, {2, 3}, {3, 1}",
        "@1 = @literal{1} -> float_type, {}, {}",
        "@2 = add_sigmoid[module=fused0](@0,@1) -> float_type, {2, 3}, {3, 1}",
        "@3 = transpose[permutation={1,0}](@2) -> float_type, {3, 2}, {1, 3}",
        "@4 = @return(@3)",
    ]
    # the scalar is read through its broadcast as one load of a 0-d input
    sub = after.main.instructions[2].op.module
    assert op_names(sub) == ["@param", "load", "@param", "load", "add", "sigmoid", "allocate", "store"]
    assert str(sub.instructions[3].op.attrs["map"]) == "{2, 3} -> {}: (i0, i1) -> ()"
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_producers_are_read_through_views_inside_the_kernel():
    """relu(transpose(exp(x))): exp is not a root (its reader is pointwise behind a view)."""
    def build() -> Program:
        p = Program()
        m = p.main
        x = add_param(m, "x", Shape.of(DType.float32, [2, 3]))
        t = m.add(Transpose([1, 0]), [m.add(make_op("exp"), [x])])
        m.set_returns([m.add(make_op("relu"), [t])], ["y"])
        return p

    before, after = build(), build()
    assert FusePointwise().apply(after.main)
    assert op_names(after.main) == ["@param", "fused"]
    (kernel,) = [i for i in after.main if i.op.name == "fused"]
    assert kernel.op.attrs["kernel"] == "exp_relu"
    (load,) = [i for i in kernel.op.module if i.op.name == "load"]
    assert str(load.op.attrs["map"]) == "{3, 2} -> {2, 3}: (i0, i1) -> (i1, i0)"
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_two_roots_each_recompute_a_shared_producer():
    def build() -> Program:
        p = Program()
        m = p.main
        e = m.add(make_op("exp"), [add_param(m, "x", Shape.of(DType.float32, [4]))])
        m.set_returns([m.add(make_op("neg"), [e]), m.add(make_op("sin"), [e])], ["a", "b"])
        return p

    before, after = build(), build()
    assert FusePointwise().apply(after.main)
    assert op_names(after.main) == ["@param", "fused", "fused"]
    assert [k.op.attrs["kernel"] for k in after.main.instructions[1:]] == ["exp_neg", "exp_sin"]
    assert all(k.inputs == [after.main.params["x"]] for k in after.main.instructions[1:])
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_value_read_by_a_reduction_is_a_kernel_of_its_own():
    def build() -> Program:
        p = Program()
        m = p.main
        e = m.add(make_op("exp"), [add_param(m, "x", Shape.of(DType.float32, [3, 4]))])
        s = m.add(make_op("reduce_sum", axes=[1]), [e])
        m.set_returns([m.add(make_op("neg"), [s])], ["y"])
        return p

    before, after = build(), build()
    assert FusePointwise().apply(after.main)
    assert op_names(after.main) == ["@param", "fused", "reduce_sum", "fused"]
    assert [i.op.attrs.get("kernel") for i in after.main] == [None, "exp", None, "neg"]
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_views_and_reductions_alone_are_not_fused():
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [3, 4]))
    s = m.add(make_op("reduce_max", axes=[0]), [m.add(Transpose([1, 0]), [x])])
    m.set_returns([s], ["y"])
    text = str(p)
    assert not FusePointwise().apply(m)
    assert str(p) == text


def centre_size(kernel_parts: bool = False) -> Program:
    """concat(a + b, b - a) * s along rows, YOLOv8's box arithmetic; with `kernel_parts` the
    parts are softmaxes (kernels writing their slots of the concat in place)."""
    p = Program()
    m = p.main
    a = add_param(m, "a", Shape.of(DType.float32, [2, 5]))
    b = add_param(m, "b", Shape.of(DType.float32, [2, 5]))
    s = add_param(m, "s", Shape.of(DType.float32, [4, 5]))
    if kernel_parts:
        parts = [m.add(Softmax(1), [a]), m.add(Softmax(1), [b])]
    else:
        parts = [m.add(make_op("add"), [a, b]), m.add(make_op("sub"), [b, a])]
    m.set_returns([m.add(make_op("mul"), [m.add(Concat(0), parts), s])], ["y"])
    return p


def test_a_concat_of_pointwise_parts_read_by_a_pointwise_op_is_a_select_in_its_kernel():
    before, after = centre_size(), centre_size()
    assert FusePointwise().apply(after.main)
    assert op_names(after.main) == ["@param", "@param", "@param", "fused"]
    (kernel,) = [i for i in after.main if i.op.name == "fused"]
    assert kernel.op.attrs["kernel"] == "add_sub_concat_mul"
    sub = printed(kernel.op.module)
    assert sub[9:13] == ["@8 = select[0 <= i0 < 2](@4,@7) -> float_type, {4, 5}, {5, 1}",
                         "@9 = @param:x2 -> float_type, {4, 5}, {5, 1}",
                         "@10 = load[{4, 5} -> {4, 5}: (i0, i1) -> (i0, i1)](@9) -> float_type, {4, 5}, {5, 1}",
                         "@11 = mul(@8,@10) -> float_type, {4, 5}, {5, 1}"]
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_concat_of_kernel_outputs_stays_a_buffer():
    """Its parts write their slots in place (concat elimination): a select would add masks only."""
    before, after = centre_size(kernel_parts=True), centre_size(kernel_parts=True)
    FuseReductions().apply(after.main)
    assert FusePointwise().apply(after.main)
    assert op_names(after.main) == ["@param", "@param", "@param", "fused", "fused", "concat", "fused"]
    assert [i.op.attrs["kernel"] for i in after.main if i.op.name == "fused"] == ["softmax", "softmax", "mul"]
    assert_same_results(before, after, tolerance=TOLERANCE)
