"""Constant propagation (passes/constant_propagation.py): an instruction whose inputs are all
literals becomes a literal of its value, unless that literal would be much larger than what it
reads (a scalar broadcast to a feature map stays a free view)."""

from __future__ import annotations

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Program
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.source import add_literal, add_param
from fusegraph.ops.views import MultiBroadcast, Transpose
from fusegraph.passes.constant_propagation import ConstantPropagation
from tests.helpers import assert_same_results, op_names, printed


def literal_chain() -> Program:
    """y = x + neg(transpose(a) * b), where the part after x is computed from literals only."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [3, 2]))
    a = add_literal(m, np.arange(6, dtype=np.float32).reshape(2, 3))
    t = m.add(Transpose([1, 0]), [a])
    b = add_literal(m, np.full((3, 2), 0.5, np.float32))
    k = m.add(make_op("mul"), [t, b])
    n = m.add(make_op("neg"), [k])
    y = m.add(make_op("add"), [x, n])
    m.set_returns([y], ["y"])
    return p


def test_a_chain_of_literal_ops_becomes_one_literal():
    before, after = literal_chain(), literal_chain()
    assert op_names(before.main) == ["@param", "@literal", "transpose", "@literal", "mul", "neg", "add"]
    assert ConstantPropagation().apply(after.main)
    # the folded literals stay in place until dead code elimination; the add reads the last one
    assert op_names(after.main) == ["@param", "@literal", "@literal", "@literal", "@literal", "@literal", "add"]
    assert printed(after.main)[-2:] == [
        "@6 = add(@0,@5) -> float_type, {3, 2}, {2, 1}",
        "@7 = @return(@6)",
    ]
    folded = after.main.instructions[5].op.value
    np.testing.assert_array_equal(folded, -0.5 * np.arange(6, dtype=np.float32).reshape(2, 3).T)
    assert folded.dtype == np.float32
    assert_same_results(before, after, tolerance=0.0)


def broadcast_of_scalar(lens: tuple[int, ...]) -> Program:
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, lens))
    c = add_literal(m, np.float32(3.0))
    b = m.add(MultiBroadcast(lens), [c])
    y = m.add(make_op("mul"), [x, b])
    m.set_returns([y], ["y"])
    return p


def test_a_small_broadcast_of_a_literal_is_folded():
    before, after = broadcast_of_scalar((4, 8)), broadcast_of_scalar((4, 8))
    assert ConstantPropagation().apply(after.main)
    assert op_names(after.main) == ["@param", "@literal", "@literal", "mul"]
    assert after.main.instructions[2].shape.lens == (4, 8)
    assert_same_results(before, after, tolerance=0.0)


def test_a_large_broadcast_of_a_scalar_stays_a_view():
    p = broadcast_of_scalar((64, 80))  # 5120 elements from one
    text = str(p)
    assert not ConstantPropagation().apply(p.main)
    assert str(p) == text


def test_instructions_reading_a_parameter_are_not_folded():
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [2]))
    c = add_literal(m, np.ones(2, np.float32))
    m.set_returns([m.add(make_op("add"), [x, c])], ["y"])
    text = str(p)
    assert not ConstantPropagation().apply(m)
    assert str(p) == text
