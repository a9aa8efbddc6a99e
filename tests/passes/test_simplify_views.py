"""View-chain simplification (passes/simplify_views.py): chains of reshape-like views over a
row-major input become one reshape, two transposes become one, and a lone squeeze, unsqueeze
or flatten of a row-major input is spelled as a reshape."""

from __future__ import annotations

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Program
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.source import add_param
from fusegraph.ops.views import Flatten, Reshape, Squeeze, Transpose, Unsqueeze
from fusegraph.passes.simplify_views import SimplifyViews
from tests.helpers import assert_same_results, op_names, printed


def reshape_chain() -> Program:
    """exp(x) through unsqueeze, reshape, flatten and squeeze."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [2, 3, 4]))
    v = m.add(make_op("exp"), [x])
    v = m.add(Unsqueeze([0]), [v])
    v = m.add(Reshape([1, 6, 4]), [v])
    v = m.add(Flatten(1), [v])
    v = m.add(Squeeze([0]), [v])
    m.set_returns([m.add(make_op("neg"), [v])], ["y"])
    return p


def test_a_reshape_chain_becomes_one_reshape():
    before, after = reshape_chain(), reshape_chain()
    assert SimplifyViews().apply(after.main)
    assert printed(after.main) == [
        'module: "main"',
        "@0 = @param:x -> float_type, {2, 3, 4}, {12, 4, 1}",
        "@1 = exp(@0) -> float_type, {2, 3, 4}, {12, 4, 1}",
        "@2 = reshape[dims={24}](@1) -> float_type, {24}, {1}",
        "@3 = neg(@2) -> float_type, {24}, {1}",
        "@4 = @return(@3)",
    ]
    assert_same_results(before, after, tolerance=0.0)


def transposes(inner: list[int], outer: list[int]) -> Program:
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [2, 3, 4]))
    t = m.add(Transpose(outer), [m.add(Transpose(inner), [x])])
    m.set_returns([m.add(make_op("sigmoid"), [t])], ["y"])
    return p


def test_two_transposes_compose_into_one():
    before, after = transposes([1, 2, 0], [1, 0, 2]), transposes([1, 2, 0], [1, 0, 2])
    assert SimplifyViews().apply(after.main)
    assert op_names(after.main) == ["@param", "transpose", "sigmoid"]
    # the outer permutation picks from the inner one: (1, 0, 2) of (1, 2, 0) is (2, 1, 0)
    assert after.main.instructions[1].op.attrs["permutation"] == (2, 1, 0)
    assert after.main.instructions[1].shape.lens == (4, 3, 2)
    assert_same_results(before, after, tolerance=0.0)


def test_an_inverse_pair_of_transposes_leaves_the_identity_permutation():
    """Dropping it is identity elimination's job."""
    before, after = transposes([1, 2, 0], [2, 0, 1]), transposes([1, 2, 0], [2, 0, 1])
    assert SimplifyViews().apply(after.main)
    assert op_names(after.main) == ["@param", "transpose", "sigmoid"]
    assert after.main.instructions[1].op.attrs["permutation"] == (0, 1, 2)
    assert_same_results(before, after, tolerance=0.0)


def test_views_of_a_transposed_input_are_not_merged():
    """A reshape of a transposed tensor is not a reshape of the tensor: the chain stays."""
    def build() -> Program:
        p = Program()
        m = p.main
        x = add_param(m, "x", Shape.of(DType.float32, [2, 3]))
        t = m.add(Transpose([1, 0]), [x])
        u = m.add(Unsqueeze([0]), [t])
        r = m.add(Reshape([6]), [u])
        m.set_returns([m.add(make_op("relu"), [r])], ["y"])
        return p

    p = build()
    text = printed(p.main)
    assert op_names(p.main) == ["@param", "transpose", "unsqueeze", "reshape", "relu"]
    assert not SimplifyViews().apply(p.main)
    assert printed(p.main) == text
    assert_same_results(build(), p, tolerance=0.0)
