"""Tests of the index-expression algebra: exactness (property-based) and the rewrites."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusegraph.ir.index_expr import (
    Const,
    Expr,
    FloorDiv,
    Mod,
    Prod,
    Sum,
    Var,
    bounds,
    coefficient,
    divmod_args_nonnegative,
    evaluate,
    floordiv,
    free_vars,
    is_affine_in,
    mod,
    simplify,
    substitute,
    to_source,
)

# ---------------------------------------------------------------------------------------
# Random expression trees. A tree is a tuple AST evaluated independently of the library
# (plain integer arithmetic), then built through the library's operators.
# ---------------------------------------------------------------------------------------

DIVISORS = [1, 2, 3, 4, 5, 6, 8, 12, 16, 85]
COEFFS = [-3, -1, 0, 1, 2, 3, 4, 6, 8, 12, 85]

leaves = st.one_of(
    st.tuples(st.just("var"), st.integers(0, 2)),
    st.tuples(st.just("const"), st.integers(-20, 20)),
)


def _extend(t: st.SearchStrategy) -> st.SearchStrategy:
    d = st.sampled_from(DIVISORS)
    small = st.sampled_from([1, 2, 3, 4, 5])
    return st.one_of(
        st.tuples(st.just("add"), t, t),
        st.tuples(st.just("sub"), t, t),
        st.tuples(st.just("mulc"), t, st.sampled_from(COEFFS)),
        st.tuples(st.just("mul"), t, t),
        st.tuples(st.just("div"), t, d),
        st.tuples(st.just("mod"), t, d),
        # Patterns that exercise specific rules (expanded to plain arithmetic below).
        st.tuples(st.just("split"), t, d),  # (t // d) * d + t % d
        st.tuples(st.just("subdiv"), t, d),  # t - (t // d) * d
        st.tuples(st.just("nestdiv"), t, small, small),  # (t // a) // b
        st.tuples(st.just("moddiv"), t, small, small),  # (t % (a*b)) // a
        st.tuples(st.just("modmod"), t, small, small),  # (t % (a*b)) % a
        st.tuples(st.just("madd"), t, t, d),  # (t1 * d + t2) // d  and % d, summed
    )


trees = st.recursive(leaves, _extend, max_leaves=10)


def run_tree(tree, vals, div, md):
    """Evaluate a tree with the given leaf values and division/modulo functions."""
    kind = tree[0]
    r = lambda t: run_tree(t, vals, div, md)  # noqa: E731
    if kind == "var":
        return vals[tree[1] % len(vals)]
    if kind == "const":
        return tree[1]
    if kind == "add":
        return r(tree[1]) + r(tree[2])
    if kind == "sub":
        return r(tree[1]) - r(tree[2])
    if kind == "mulc":
        return r(tree[1]) * tree[2]
    if kind == "mul":
        return r(tree[1]) * r(tree[2])
    if kind == "div":
        return div(r(tree[1]), tree[2])
    if kind == "mod":
        return md(r(tree[1]), tree[2])
    if kind == "split":
        x = r(tree[1])
        return div(x, tree[2]) * tree[2] + md(x, tree[2])
    if kind == "subdiv":
        x = r(tree[1])
        return x - div(x, tree[2]) * tree[2]
    if kind == "nestdiv":
        return div(div(r(tree[1]), tree[2]), tree[3])
    if kind == "moddiv":
        return div(md(r(tree[1]), tree[2] * tree[3]), tree[2])
    if kind == "modmod":
        return md(md(r(tree[1]), tree[2] * tree[3]), tree[2])
    if kind == "madd":
        x = r(tree[1]) * tree[3] + r(tree[2])
        return div(x, tree[3]) + md(x, tree[3])
    raise AssertionError(kind)


def py_div(a, b):
    return a // b


def py_mod(a, b):
    return a % b


def sub_exprs(e: Expr):
    """All sub-expressions of e (for per-node checks)."""
    yield e
    if isinstance(e, Sum):
        for a, _ in e.terms:
            yield from sub_exprs(a)
    elif isinstance(e, (FloorDiv, Mod)):
        yield from sub_exprs(e.arg)
    elif isinstance(e, Prod):
        for f in e.factors:
            yield from sub_exprs(f)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees, extents=st.lists(st.integers(1, 12), min_size=1, max_size=3))
def test_simplification_is_exact(tree, extents):
    vs = [Var(f"v{k}", n) for k, n in enumerate(extents)]
    expr = run_tree(tree, vs, floordiv, mod)  # built through the smart constructors
    expr = Const(expr) if isinstance(expr, int) else expr
    grids = np.indices(extents).astype(np.int64)
    env = {v.name: g for v, g in zip(vs, grids)}
    want = np.broadcast_to(run_tree(tree, list(grids), py_div, py_mod), grids.shape[1:])
    got = np.broadcast_to(evaluate(expr, env), grids.shape[1:])
    assert np.array_equal(got, want), f"{tree} simplified to {expr}"
    # Bounds are sound at every node, and every //,% argument is non-negative.
    for sub in sub_exprs(expr):
        lo, hi = bounds(sub)
        vals = np.asarray(evaluate(sub, env))
        assert lo <= vals.min() and vals.max() <= hi, f"bounds {lo, hi} of {sub} in {expr}"
    assert divmod_args_nonnegative(expr)
    # Generated source computes the same thing (with Python and with truncating division).
    src = to_source(expr)
    assert np.array_equal(np.broadcast_to(eval(src, {}, dict(env)), want.shape), want), src
    # Simplification is idempotent and the free variables are a subset of the inputs.
    assert simplify(expr) == expr
    assert free_vars(expr) <= set(vs)
    # Pure Python ints on a few corners (not only NumPy).
    for point in itertools.islice(itertools.product(*[(0, n - 1) for n in extents]), 8):
        assert evaluate(expr, {v.name: p for v, p in zip(vs, point)}) == run_tree(
            tree, list(point), py_div, py_mod
        )


@settings(max_examples=200, deadline=None)
@given(
    tree=trees,
    extents=st.lists(st.integers(1, 10), min_size=2, max_size=2),
    a=st.integers(0, 4),
    b=st.integers(1, 4),
)
def test_substitute_is_exact(tree, extents, a, b):
    """Substituting v0 := a*v1' + ... in range keeps values, and re-simplifies."""
    vs = [Var(f"v{k}", n) for k, n in enumerate(extents)]
    expr = as_e(run_tree(tree, vs, floordiv, mod))
    # Replace v0 by an expression of a fresh var that stays within v0's range.
    w = Var("w", max(1, extents[0] // b))
    repl = (w * b + min(a, b - 1)) if extents[0] >= b else Const(0)
    if bounds(repl)[1] > extents[0] - 1:
        return
    out = substitute(expr, {"v0": repl})
    grid = np.indices((w.extent, extents[1]))
    env_new = {"w": grid[0], "v1": grid[1]}
    env_old = {"v0": np.asarray(evaluate(repl, env_new)), "v1": grid[1]}
    shape = grid.shape[1:]
    assert np.array_equal(
        np.broadcast_to(evaluate(out, env_new), shape), np.broadcast_to(evaluate(expr, env_old), shape)
    )


def as_e(x):
    return Const(x) if isinstance(x, int) else x


# ---------------------------------------------------------------------------------------
# The specific rewrites
# ---------------------------------------------------------------------------------------

i = Var("i", 6400)
x = Var("x", 100)
a = Var("a", 7)
b = Var("b", 5)


def test_recombine_quotient_and_remainder():
    assert (i // 85) * 85 + i % 85 == i
    assert i % 85 + 85 * (i // 85) + 3 == i + 3
    assert 2 * (i % 85) + 170 * (i // 85) == 2 * i
    # Three digits of a mixed radix recombine through the canonical middle digit.
    assert (i // 6400) * 6400 + ((i // 80) % 80) * 80 + i % 80 == i


def test_remainder_from_subtraction():
    assert i - (i // 85) * 85 == i % 85
    assert 3 * i - 255 * (i // 85) == 3 * (i % 85)


def test_range_rules():
    small = Var("s", 10)
    assert small // 10 == 0
    assert small // 16 == 0
    assert small % 10 == small
    assert small % 12 == small
    assert (small + 10) // 10 == 1
    assert (small + 10) % 10 == small
    assert (i % 6400) // 80 == i // 80  # i < 6400
    assert i % 6400 == i


def test_split_division():
    h, w = Var("h", 80), Var("w", 80)
    assert (a * 85 + b) // 85 == a  # b < 85
    assert (a * 85 + b) % 85 == b
    assert (a * 4 + x) // 4 == a + x // 4  # exact for any x
    assert (a * 4 + x) % 4 == x % 4
    assert (h * 80 + w) // 80 == h
    assert (h * 80 + w) % 80 == w
    # Divisibility through a common factor: 6400*c + (80h + w) with 80h + w < 6400.
    c = Var("c", 255)
    off = c * 6400 + h * 80 + w
    assert off // 544000 == c // 85
    assert (off // 6400) % 85 == c % 85
    assert (2 * x) // 4 == x // 2
    assert (2 * x + 1) // 4 == x // 2
    assert str((2 * x + 1) % 4) == "2 * (x % 2) + 1"


def test_nested_rules():
    assert (x // 3) // 4 == x // 12
    assert (i // 4) // 5 == i // 20
    assert (i % 12) // 3 == (i // 3) % 4
    assert (i % 12) % 3 == i % 3
    assert (x * 7) // 7 == x
    assert (x * 7) % 7 == 0
    assert x % 1 == 0
    assert x // 1 == x
    assert str(i // 85) == "(i // 85)"
    assert str((i // 80) % 80) == "(i // 80)"  # i < 6400
    big = Var("big", 10**6)
    assert str((big // 80) % 80) == "((big // 80) % 80)"


def test_extent_one_vars_vanish_in_arithmetic():
    n = Var("n", 1)
    assert n * 1632000 + a == a
    assert n // 3 == 0
    assert bounds(n) == (0, 0)


def test_constants_and_operators():
    assert Const(3) == 3 and hash(Const(3)) == hash(3)
    assert (Const(7) // 2) == 3 and (Const(-7) // 2) == -4 and (Const(-7) % 2) == 1
    assert 2 + x - x == 2
    assert -(x - 5) == 5 - x
    assert 3 * (x + 1) == 3 * x + 3
    assert 14 // Const(4) == 3
    with pytest.raises(ValueError):
        x // 0
    with pytest.raises(ValueError):
        x % -3
    with pytest.raises(TypeError):
        x // a
    with pytest.raises(ValueError):
        Var("bad", 0)


def test_products_of_expressions():
    y = Var("y", 10)
    e = (x + 1) * (y - 1)
    assert isinstance(e, Sum)
    assert evaluate(e, {"x": 4, "y": 7}) == 30
    assert bounds(x * y) == (0, 99 * 9)
    assert not is_affine_in(e, "x")


def test_bounds():
    assert bounds(i // 85) == (0, 75)
    assert bounds(i % 85) == (0, 84)
    assert bounds(3 * a - 2 * b + 1) == (-7, 19)


def test_to_source_and_str():
    e = (i // 85) * 3 + i % 85 * 7 + 2
    assert str(e) == "7 * (i % 85) + 3 * (i // 85) + 2"
    assert to_source(e) == "(7 * (i % 85) + 3 * (i // 85) + 2)"
    assert to_source(e, {"i": "offs"}) == "(7 * (offs % 85) + 3 * (offs // 85) + 2)"
    assert to_source((a * 3 + b + 1) // 7) == "((3 * a + b + 1) // 7)"
    assert to_source(Const(-4)) == "(-4)"
    assert to_source(5 - a) == "(-a + 5)"
    env = {"i": 4321}
    assert eval(to_source(e), {}, env) == evaluate(e, env)


def test_evaluate_vectorized_and_missing_var():
    out = evaluate(i // 85 + i % 85, {"i": np.arange(200)})
    np.testing.assert_array_equal(out, np.arange(200) // 85 + np.arange(200) % 85)
    with pytest.raises(KeyError, match="'i'"):
        evaluate(i + 1, {})


def test_free_vars_and_substitute():
    e = (a * 85 + b) // 5 + x % 3  # b < 5 drops out
    assert e == 17 * a + x % 3
    assert free_vars(e) == {a, x}
    t, j = Var("t", 3), Var("j", 85)
    n = Var("n", 255)
    e = n // 85 * 1000 + n % 85
    assert substitute(e, {"n": t * 85 + j}) == t * 1000 + j
    with pytest.raises(ValueError, match="range"):
        substitute(e, {"n": Var("big", 300)})
    assert substitute(e, {"n": 86}) == 1001


def test_affine_queries():
    n = Var("n", 255)
    addr = (n // 85) * 544000 + (n % 85)
    assert not is_affine_in(addr, "n")
    assert coefficient(addr, "n") is None
    # Aligned to the split (n = 85*t + j), the store is contiguous along j.
    t, j = Var("t", 3), Var("j", 85)
    tiled = substitute(addr, {"n": t * 85 + j})
    assert is_affine_in(tiled, j) and coefficient(tiled, j) == 1
    assert coefficient(tiled, t) == 544000
    assert coefficient(tiled, "absent") == 0
    assert coefficient(3 * a + b // 2, a) == 3
    assert coefficient(3 * a + b // 2, b) is None


def test_pickle_roundtrip():
    import copy
    import pickle

    e = (i // 85) * 3 + (i % 85) * (a + 1) - 7
    assert pickle.loads(pickle.dumps(e)) == e
    assert copy.deepcopy(e) == e


def test_hashable_and_immutable():
    d = {i // 85: 1, (i // 85): 2}
    assert len(d) == 1
    with pytest.raises(AttributeError):
        i.name = "j"  # type: ignore[misc]
