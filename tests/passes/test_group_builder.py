"""Building fused groups (passes/group_builder.py), the part every fusion pass shares: outside
values are read through their view chains as one load, accepted pointwise producers are
recomputed inside, and `place` swaps the members for the one fused instruction."""

from __future__ import annotations

import pytest

from fusegraph.ir.dtypes import DType
from fusegraph.ir.index_map import identity_map
from fusegraph.ir.program import Program
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.source import add_param
from fusegraph.ops.views import Reshape, Transpose
from fusegraph.passes.group_builder import GroupBuilder, Piece, Unfusable, group_name, kernel_name, place
from tests.helpers import assert_same_results, op_names, printed


def viewed() -> Program:
    """relu(reshape(transpose(exp(x))))."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [2, 3]))
    e = m.add(make_op("exp"), [x])
    v = m.add(Reshape([6]), [m.add(Transpose([1, 0]), [e])])
    m.set_returns([m.add(make_op("relu"), [v])], ["y"])
    return p


def group_the_relu(p: Program, inline: bool) -> GroupBuilder:
    m = p.main
    relu = m.instructions[-1]
    b = GroupBuilder(group_name(m), inline=lambda ins, at: inline)
    value = b.add(relu.op, [b.gather(x) for x in relu.inputs], relu.origin)
    fused = b.finish(relu, [Piece(identity_map(relu.shape.lens), (), value)], kernel_name(b.inlined + [relu]))
    place(m, fused, relu, [relu])
    return b


def test_a_view_chain_becomes_one_load_of_its_source():
    before, after = viewed(), viewed()
    b = group_the_relu(after, inline=False)
    assert b.inputs == [after.main.instructions[1]]  # exp, read through both views
    assert printed(b.sub) == [
        'module: "fused0"',
        "@0 = @param:x0 -> float_type, {2, 3}, {3, 1}",
        "@1 = load[{6} -> {2, 3}: (i0) -> ((i0 % 2), (i0 // 2))](@0) -> float_type, {6}, {1}",
        "@2 = relu(@1) -> float_type, {6}, {1}",
        "@3 = allocate[float_type,{6}] -> float_type, {6}, {1}",
        "@4 = store[{6} -> {6}: (i0) -> (i0)](@3,@2) -> float_type, {6}, {1}",
        "@5 = @return(@4)",
    ]
    # the views stay until dead code elimination; the returned value is the kernel
    assert op_names(after.main) == ["@param", "exp", "transpose", "reshape", "fused"]
    assert after.main.returns == [after.main.instructions[-1]]
    assert after.main.instructions[-1].op.attrs["kernel"] == "relu"
    assert_same_results(before, after, tolerance=0.0)


def test_an_accepted_pointwise_producer_is_recomputed_inside():
    before, after = viewed(), viewed()
    b = group_the_relu(after, inline=True)
    assert b.inputs == [after.main.params["x"]]
    assert [i.op.name for i in b.inlined] == ["exp"]
    assert op_names(b.sub) == ["@param", "load", "exp", "relu", "allocate", "store"]
    assert after.main.instructions[-1].op.attrs["kernel"] == "exp_relu"
    assert_same_results(before, after, tolerance=0.0)


def test_a_value_gathered_twice_is_loaded_once_and_unread_inputs_are_dropped():
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [4]))
    z = add_param(m, "z", Shape.of(DType.float32, [4]))
    y = m.add(make_op("mul"), [x, x])
    m.set_returns([y], ["y"])
    b = GroupBuilder(group_name(m))
    b.gather(z)  # read tentatively, then not used
    first, second = b.gather(x), b.gather(x)
    assert first is second and b.inputs == [z, x]
    value = b.add(y.op, [first, second])
    fused = b.finish(y, [Piece(identity_map((4,)), (), value)], kernel_name([y]))
    assert fused.inputs == [x]
    assert printed(b.sub)[1] == "@0 = @param:x0 -> float_type, {4}, {1}"


def test_an_empty_tensor_cannot_be_gathered():
    p = Program()
    x = add_param(p.main, "x", Shape.of(DType.float32, [0, 3]))
    with pytest.raises(Unfusable):
        GroupBuilder("g").gather(x)


def test_kernel_names_and_group_names():
    p = viewed()
    m = p.main
    assert kernel_name(list(m)) == "exp_transpose_reshape_relu"  # the parameter is no part of it
    assert kernel_name(list(m)[:1]) == "copy"
    assert group_name(m) == "fused0"
    group_the_relu(p, inline=False)
    assert group_name(m) == "fused1"
