"""Tests of view index maps against NumPy's own view semantics (property-based)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusegraph.ir.index_expr import Const, FloorDiv, Mod, Var, to_source
from fusegraph.ir.index_map import (
    IndexMap,
    broadcast_map,
    chain_input_map,
    compose,
    delinearize,
    embed_map,
    flatten_map,
    identity_map,
    linear_offset,
    reshape_map,
    slice_map,
    squeeze_map,
    strides_for,
    transpose_map,
    unsqueeze_map,
)

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example])

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


def arange(lens):
    return np.arange(math.prod(lens)).reshape(lens)


def check_gather(m: IndexMap, want: np.ndarray) -> None:
    assert m.out_lens == want.shape
    np.testing.assert_array_equal(m.gather(arange(m.in_lens)), want)


def check_inverse(m: IndexMap) -> None:
    """inverse(map(i)) == i on every domain index, and map(inverse(j)) == j."""
    inv = m.inverse()
    assert inv is not None, f"no inverse for {m}"
    assert inv.out_lens == m.in_lens and inv.in_lens == m.out_lens
    dom = tuple(np.indices(m.out_lens))
    back = inv.evaluate(m.evaluate(dom))
    for got, want in zip(back, dom):
        np.testing.assert_array_equal(got, want)
    cod = tuple(np.indices(m.in_lens))
    fwd = m.evaluate(inv.evaluate(cod))
    for got, want in zip(fwd, cod):
        np.testing.assert_array_equal(got, want)
    assert inv.inverse() is m


# ---------------------------------------------------------------------------------------
# Random views: each draw returns (index map, numpy function) for the current shape.
# ---------------------------------------------------------------------------------------


def _factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def draw_reshape(data, lens):
    n = math.prod(lens)
    fs = data.draw(st.permutations(_factors(n)))
    out: list[int] = []
    for f in fs:
        if out and data.draw(st.booleans()):
            out[-1] *= f
        else:
            out.append(f)
    for _ in range(data.draw(st.integers(0, 2))):
        out.insert(data.draw(st.integers(0, len(out))), 1)
    if not out:
        out = [1]
    out_t = tuple(out)
    return reshape_map(lens, out_t), lambda x: x.reshape(out_t)


def draw_transpose(data, lens):
    perm = tuple(data.draw(st.permutations(range(len(lens)))))
    return transpose_map(lens, perm), lambda x: np.transpose(x, perm)


def draw_squeeze(data, lens):
    ones = [k for k, n in enumerate(lens) if n == 1]
    if not ones or len(ones) == len(lens):
        return None
    axes = data.draw(st.lists(st.sampled_from(ones), min_size=1, unique=True))
    return squeeze_map(lens, axes), lambda x: np.squeeze(x, tuple(axes))


def draw_unsqueeze(data, lens):
    r = len(lens) + 1
    axis = data.draw(st.integers(-r, r - 1))
    return unsqueeze_map(lens, [axis]), lambda x: np.expand_dims(x, axis)


def draw_flatten(data, lens):
    axis = data.draw(st.integers(0, len(lens)))
    a = axis
    shape2 = (math.prod(lens[:a]), math.prod(lens[a:]))
    return flatten_map(lens, axis), lambda x: x.reshape(shape2)


def draw_slice(data, lens):
    r = len(lens)
    axes = data.draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True))
    starts, ends, steps, sl = [], [], [], [slice(None)] * r
    for a in axes:
        n = lens[a]
        s = data.draw(st.integers(-n - 2, n + 2))
        e = data.draw(st.integers(-n - 2, n + 2))
        k = data.draw(st.sampled_from([-3, -2, -1, 1, 2, 3]))
        if len(range(*slice(s, e, k).indices(n))) == 0:  # keep it non-empty
            s, e = (0, n + 2) if k > 0 else (n - 1, -n - 2)
        starts.append(s), ends.append(e), steps.append(k)
        sl[a] = slice(s, e, k)
    # ONNX allows negative axes too.
    onnx_axes = [a - r if data.draw(st.booleans()) else a for a in axes]
    return slice_map(lens, starts, ends, onnx_axes, steps), lambda x: x[tuple(sl)]


def draw_broadcast(data, lens):
    lead = data.draw(st.lists(st.integers(1, 3), max_size=2))
    tail = [data.draw(st.integers(1, 3)) if n == 1 else n for n in lens]
    out = tuple(lead + tail)
    return broadcast_map(lens, out), lambda x: np.broadcast_to(x, out)


BIJECTIVE = [draw_reshape, draw_transpose, draw_squeeze, draw_unsqueeze, draw_flatten]
ALL = BIJECTIVE + [draw_slice, draw_broadcast]


def draw_view(data, lens, kinds):
    while True:
        kind = data.draw(st.sampled_from(kinds))
        got = kind(data, lens)
        if got is not None:
            return got


# ---------------------------------------------------------------------------------------
# Single views against NumPy
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("draw", ALL, ids=lambda f: f.__name__)
@SETTINGS
@given(lens=shapes, data=st.data())
def test_single_view_matches_numpy(draw, lens, data):
    got = None
    while got is None:
        got = draw(data, lens)
        if got is None:
            lens = tuple(1 if k == 0 else n for k, n in enumerate(lens)) + (2,)
    m, fn = got
    check_gather(m, fn(arange(lens)))


@SETTINGS
@given(lens=shapes, data=st.data())
def test_chains_match_numpy(lens, data):
    maps, x = [], arange(lens)
    want = x
    cur = lens
    for _ in range(data.draw(st.integers(2, 4))):
        m, fn = draw_view(data, cur, ALL)
        maps.append(m)
        want = fn(want)
        cur = m.out_lens
    total = chain_input_map(*maps)
    assert total.in_lens == lens
    check_gather(total, want)


@SETTINGS
@given(lens=shapes, data=st.data())
def test_bijective_chains_invert(lens, data):
    maps, want = [], arange(lens)
    cur = lens
    for _ in range(data.draw(st.integers(1, 4))):
        m, fn = draw_view(data, cur, BIJECTIVE)
        check_inverse(m)
        maps.append(m)
        want = fn(want)
        cur = m.out_lens
    total = chain_input_map(*maps)
    check_gather(total, want)
    check_inverse(total)
    # Scattering the producer through the inverse rebuilds the chain's output.
    x = arange(lens)
    out = np.empty(total.out_lens, dtype=x.dtype)
    out[total.inverse().evaluate(tuple(np.indices(lens)))] = x
    np.testing.assert_array_equal(out, want)


@SETTINGS
@given(lens=shapes, data=st.data())
def test_non_bijective_views_have_no_inverse(lens, data):
    n = data.draw(st.integers(2, 3))
    m = broadcast_map(lens, (n,) + lens)
    assert m.inverse() is None
    if lens[0] > 1:
        s = slice_map(lens, [1], [lens[0]], [0])
        assert s.inverse() is None


# ---------------------------------------------------------------------------------------
# Fixed cases
# ---------------------------------------------------------------------------------------


def test_yolo_head():
    """conv out {1,255,80,80} -> reshape {1,3,85,80,80} -> transpose {0,1,3,4,2}."""
    r = reshape_map((1, 255, 80, 80), (1, 3, 85, 80, 80))
    t = transpose_map((1, 3, 85, 80, 80), (0, 1, 3, 4, 2))
    m = chain_input_map(r, t)
    print("input map:", m)
    assert m.out_lens == (1, 3, 80, 80, 85) and m.in_lens == (1, 255, 80, 80)
    n, a, h, w, k = m.out_vars
    assert m.exprs == (Const(0), a * 85 + k, h, w)
    assert str(m) == "{1, 3, 80, 80, 85} -> {1, 255, 80, 80}: (i0, i1, i2, i3, i4) -> (0, 85 * i1 + i4, i2, i3)"

    inv = m.inverse()
    print("inverse map:", inv)
    c = inv.out_vars[1]
    h2, w2 = inv.out_vars[2], inv.out_vars[3]
    assert inv.exprs == (Const(0), c // 85, h2, w2, c % 85)
    assert isinstance(inv.exprs[1], FloorDiv) and isinstance(inv.exprs[4], Mod)
    assert [to_source(e) for e in inv.exprs] == ["0", "(i1 // 85)", "i2", "i3", "(i1 % 85)"]
    check_inverse(m)
    x = np.arange(255 * 80 * 80).reshape(1, 255, 80, 80)
    want = x.reshape(1, 3, 85, 80, 80).transpose(0, 1, 3, 4, 2)
    np.testing.assert_array_equal(m.gather(x), want)
    # The symbolic inversion (no chain knowledge) finds the same inverse.
    bare = IndexMap(m.out_vars, m.exprs, m.in_lens)
    assert bare.inverse() == inv


def test_compose_direction():
    t = transpose_map((2, 3), (1, 0))  # out {3, 2}
    r = reshape_map((3, 2), (6,))
    assert compose(t, r) == t.after(r) == chain_input_map(t, r)
    with pytest.raises(ValueError, match="compose"):
        r.after(t)


def test_identity_and_trivial_views():
    assert identity_map((2, 3)).is_identity()
    assert identity_map((2, 3)).inverse() == identity_map((2, 3))
    assert reshape_map((2, 3), (2, 3)).is_identity()
    assert transpose_map((2, 3, 4), (0, 1, 2)).is_identity()
    assert not transpose_map((2, 2), (1, 0)).is_identity()
    assert broadcast_map((1, 3), (1, 3)).is_identity()
    assert slice_map((4,), [0], [100]).is_identity()
    # Reshape then its reverse composes to the identity.
    assert chain_input_map(reshape_map((6, 4), (2, 3, 4)), reshape_map((2, 3, 4), (6, 4))).is_identity()
    # A full reversal is a bijection found by the symbolic inversion.
    rev = slice_map((5, 2), [-1], [-100], [0], [-1])
    assert rev.inverse() == rev.inverse().inverse().inverse()
    check_inverse(rev)


def test_transpose_default_perm_and_errors():
    m = transpose_map((2, 3, 4))
    check_gather(m, np.transpose(arange((2, 3, 4))))
    with pytest.raises(ValueError):
        transpose_map((2, 3), (0, 0))
    with pytest.raises(ValueError):
        reshape_map((2, 3), (5,))
    with pytest.raises(ValueError):
        broadcast_map((2, 3), (4, 3))
    with pytest.raises(ValueError):
        squeeze_map((2, 1), [0])
    with pytest.raises(ValueError, match="empty"):
        slice_map((4,), [3], [1])
    with pytest.raises(ValueError, match="non-empty"):
        reshape_map((0, 3), (0,))


def test_squeeze_unsqueeze_flatten():
    check_gather(squeeze_map((1, 3, 1, 2)), arange((1, 3, 1, 2)).reshape(3, 2))
    check_gather(unsqueeze_map((3, 2), [0, -1]), arange((3, 2)).reshape(1, 3, 2, 1))
    check_gather(flatten_map((2, 3, 4)), arange((2, 3, 4)).reshape(2, 12))
    check_gather(flatten_map((2, 3, 4), 0), arange((2, 3, 4)).reshape(1, 24))
    check_gather(flatten_map((2, 3, 4), -1), arange((2, 3, 4)).reshape(6, 4))
    assert squeeze_map((1, 3, 1, 2)).inverse() == unsqueeze_map((3, 2), [0, 2])


def test_rank_zero():
    m = reshape_map((1,), ())
    assert m.out_lens == () and m.exprs == (Const(0),)
    np.testing.assert_array_equal(m.gather(np.array([7])), np.array(7))
    check_inverse(m)


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    data=st.data(),
)
def test_embed_map_matches_concat(lens, sizes, data):
    axis = data.draw(st.integers(0, len(lens) - 1))
    parts = []
    for k, s in enumerate(sizes):
        pl = tuple(s if d == axis else n for d, n in enumerate(lens))
        parts.append(np.arange(math.prod(pl)).reshape(pl) + 1000 * k)
    big = np.concatenate(parts, axis=axis)
    offset = 0
    for p in parts:
        m = embed_map(p.shape, big.shape, axis, offset)
        dest = m.evaluate(tuple(np.indices(p.shape)))
        np.testing.assert_array_equal(big[dest], p)
        assert (m.inverse() is None) == (p.shape != big.shape)
        offset += p.shape[axis]


def test_address_helpers():
    assert strides_for((1, 255, 80, 80)) == (1632000, 6400, 80, 1)
    assert strides_for(()) == ()
    i = Var("i", 24)
    idx = delinearize(i, (2, 3, 4))
    assert [str(e) for e in idx] == ["(i // 12)", "((i // 4) % 3)", "(i % 4)"]
    assert linear_offset(idx, strides_for((2, 3, 4))) == i
    assert linear_offset(idx, (12, 4, 1), offset=5) == i + 5


def test_apply_with_tiled_index():
    """Store address of the head aligned to the split: contiguous along the 85 columns."""
    m = chain_input_map(
        reshape_map((1, 255, 80, 80), (1, 3, 85, 80, 80)), transpose_map((1, 3, 85, 80, 80), (0, 1, 3, 4, 2))
    ).inverse()
    t, j, h, w = Var("t", 3), Var("j", 85), Var("h", 80), Var("w", 80)
    out = m.apply([0, t * 85 + j, h, w])
    assert out == (Const(0), t, h, w, j)
    with pytest.raises(ValueError, match="range"):
        m.apply([0, Var("c", 300), h, w])
