"""Identity elimination (passes/eliminate_identity.py): views and converts that change nothing,
and adding or subtracting 0 or multiplying or dividing by 1, are dropped; their readers read the
input directly."""

from __future__ import annotations

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Program
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.pointwise import Convert
from fusegraph.ops.source import add_literal, add_param
from fusegraph.ops.views import MultiBroadcast, Reshape, Slice, Transpose
from fusegraph.passes.eliminate_identity import EliminateIdentity
from tests.helpers import assert_same_results, op_names, printed


def _const(m, value: float, lens):
    return m.add(MultiBroadcast(lens), [add_literal(m, np.float32(value))])


def no_op_chain() -> Program:
    """relu(x) through a same-lens reshape, an identity transpose, a full slice, a float32 to
    float32 convert, + 0, * 1, - 0 and / 1."""
    p = Program()
    m = p.main
    lens = (2, 3)
    v = add_param(m, "x", Shape.of(DType.float32, lens))
    v = m.add(Reshape(lens), [v])
    v = m.add(Transpose([0, 1]), [v])
    v = m.add(Slice([1], [0], [3]), [v])
    v = m.add(Convert(DType.float32), [v])
    for op, value in (("add", 0.0), ("mul", 1.0), ("sub", 0.0), ("div", 1.0)):
        v = m.add(make_op(op), [v, _const(m, value, lens)])
    m.set_returns([m.add(make_op("relu"), [v])], ["y"])
    return p


def test_no_op_views_converts_and_neutral_arithmetic_are_dropped():
    before, after = no_op_chain(), no_op_chain()
    assert op_names(before.main).count("multibroadcast") == 4
    assert EliminateIdentity().apply(after.main)
    # the neutral constants are left for dead code elimination
    assert [n for n in op_names(after.main) if n not in ("@literal", "multibroadcast")] == ["@param", "relu"]
    relu = after.main.instructions[-1]
    assert relu.inputs == [after.main.params["x"]]
    assert_same_results(before, after, tolerance=0.0)


def changing_ops() -> Program:
    """Ops that look like identities but are not: 0 - x, x * 2, x + 0 where x is broadcast up
    (the add materializes the broadcast), a real transpose, a slice that drops a column and a
    convert to float16."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [2, 3]))
    r = add_param(m, "r", Shape.of(DType.float32, [1, 3]))
    a = m.add(make_op("sub"), [_const(m, 0.0, (2, 3)), x])
    b = m.add(make_op("mul"), [a, _const(m, 2.0, (2, 3))])
    c = m.add(make_op("add"), [m.add(MultiBroadcast((2, 3)), [r]), _const(m, 0.0, (2, 3))])
    d = m.add(Transpose([1, 0]), [m.add(make_op("add"), [b, c])])
    e = m.add(Slice([0], [0], [2]), [d])
    f = m.add(Convert(DType.float16), [e])
    m.set_returns([f], ["y"])
    return p


def test_ops_that_change_their_input_stay():
    p = changing_ops()
    text = printed(p.main)
    assert not EliminateIdentity().apply(p.main)
    assert printed(p.main) == text
    assert op_names(p.main)[-4:] == ["add", "transpose", "slice", "convert"]


def test_a_dropped_identity_that_is_returned_returns_its_input():
    def build() -> Program:
        p = Program()
        m = p.main
        x = add_param(m, "x", Shape.of(DType.float32, [4]))
        e = m.add(make_op("exp"), [x])
        m.set_returns([m.add(make_op("mul"), [e, _const(m, 1.0, (4,))])], ["y"])
        return p

    before, after = build(), build()
    assert EliminateIdentity().apply(after.main)
    assert printed(after.main) == [
        'module: "main"',
        "@0 = @param:x -> float_type, {4}, {1}",
        "@1 = exp(@0) -> float_type, {4}, {1}",
        "@2 = @literal{1} -> float_type, {}, {}",
        "@3 = multibroadcast[out_lens={4}](@2) -> float_type, {4}, {0}",
        "@4 = @return(@1)",
    ]
    assert_same_results(before, after, tolerance=0.0)
