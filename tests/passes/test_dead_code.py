"""Dead code elimination (passes/dead_code.py): instructions no return depends on go, parameters
stay because they are the program's interface."""

from __future__ import annotations

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Program
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.source import add_literal, add_param
from fusegraph.passes.dead_code import DeadCodeElimination
from tests.helpers import assert_same_results, op_names, printed


def with_dead_branch() -> Program:
    """y = sigmoid(x); exp(neg(x)) and the literal it would add are computed and never read,
    and parameter z is read by nothing."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [2, 3]))
    add_param(m, "z", Shape.of(DType.float32, [4]))
    n = m.add(make_op("neg"), [x])
    e = m.add(make_op("exp"), [n])
    c = add_literal(m, np.full((2, 3), 2.0, np.float32))
    m.add(make_op("add"), [e, c])
    y = m.add(make_op("sigmoid"), [x])
    m.set_returns([y], ["y"])
    return p


def test_unread_instructions_go_and_parameters_stay():
    before, after = with_dead_branch(), with_dead_branch()
    assert op_names(before.main) == ["@param", "@param", "neg", "exp", "@literal", "add", "sigmoid"]
    assert DeadCodeElimination().apply(after.main)
    assert printed(after.main) == [
        'module: "main"',
        "@0 = @param:x -> float_type, {2, 3}, {3, 1}",
        "@1 = @param:z -> float_type, {4}, {1}",
        "@2 = sigmoid(@0) -> float_type, {2, 3}, {3, 1}",
        "@3 = @return(@2)",
    ]
    assert_same_results(before, after, tolerance=0.0)


def test_every_ancestor_of_a_return_is_kept():
    """A chain whose last member is returned stays whole (transitive liveness), in its order."""
    def build() -> Program:
        p = Program()
        m = p.main
        x = add_param(m, "x", Shape.of(DType.float32, [3]))
        a = m.add(make_op("neg"), [x])
        b = m.add(make_op("exp"), [a])
        c = m.add(make_op("mul"), [b, a])
        m.add(make_op("tanh"), [x])  # dead
        m.set_returns([c, a], ["c", "a"])
        return p

    before, after = build(), build()
    assert DeadCodeElimination().apply(after.main)
    assert op_names(after.main) == ["@param", "neg", "exp", "mul"]
    assert after.main.returns == [after.main.instructions[3], after.main.instructions[1]]
    assert_same_results(before, after, tolerance=0.0)


def test_a_program_without_dead_code_is_left_as_it_is():
    p = with_dead_branch()
    DeadCodeElimination().apply(p.main)
    text = str(p)
    assert not DeadCodeElimination().apply(p.main)
    assert str(p) == text
