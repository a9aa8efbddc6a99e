"""Index maps of view ops: the heart of fusion (DESIGN.md, "Views are index maps").

An ``IndexMap`` is a function between index spaces::

    (i0, .., i{k-1})  in out_lens   ->   (e0, .., e{m-1})  in in_lens

given by one ``Var`` per *domain* dimension (``out_vars``, extents = ``out_lens``) and one
expression per *codomain* dimension (``exprs``, valid indices of a tensor of ``in_lens``).

Direction conventions
---------------------
* Every view constructor here (``reshape_map``, ``transpose_map``, ``broadcast_map``,
  ``slice_map``, ``squeeze_map``, ``unsqueeze_map``, ``flatten_map``) returns the view's
  **input map**: from an index of the view's *output* to the index of its *input* that
  it reads (gather direction). ``out_lens`` is the view's output shape, ``in_lens`` its
  input shape.
* ``inverse()`` of a bijective map goes the other way: from the producer's index to where
  the element lands in the view's output (scatter direction, used by epilogue fusion).
  For an inverse, ``out_lens`` (domain) is the producer's shape and ``in_lens``
  (codomain) the consumer's: the names always describe the map's own direction.
* ``embed_map`` is already in the scatter direction: part index -> index in the larger
  buffer the part is written into (concat elimination).
* Composition follows function notation: ``compose(f, g) == f.after(g)`` is
  ``x -> f(g(x))`` and needs ``g.in_lens == f.out_lens``. For a chain of views in dataflow
  order ``producer -> A -> B -> C`` the chain's input map is
  ``chain_input_map(mA, mB, mC) == mA.after(mB).after(mC)``, and its inverse is
  ``mC^-1 . mB^-1 . mA^-1`` (computed by ``inverse()`` of the composed map).

Inversion
---------
A map remembers how to invert itself: each primitive view knows its inverse (the inverse
of a reshape is the reverse reshape, of a transpose the inverse permutation, of a
squeeze the unsqueeze, ...) and a composition inverts as the reverse composition of the
inverses. When that fails (a part is not invertible, or the map was built by hand),
``inverse()`` tries a symbolic inversion: a map whose flat input offset is
``c0 + sum(k_i * i_i)`` with strides ``|k_i|`` tiling the input exactly is a bijection
(this covers reversed full slices and broadcasts of size-1 dims). ``inverse()`` returns
None when the map is not (provably) bijective, e.g. a real broadcast or a strict slice.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .index_expr import Const, Expr, ExprLike, Sum, Var, as_expr, evaluate, free_vars, substitute

__all__ = [
    "IndexMap",
    "compose",
    "chain_input_map",
    "identity_map",
    "reshape_map",
    "transpose_map",
    "broadcast_map",
    "slice_map",
    "squeeze_map",
    "unsqueeze_map",
    "flatten_map",
    "embed_map",
    "strides_for",
    "linear_offset",
    "delinearize",
]

Lens = tuple[int, ...]


def _lens(lens: Sequence[int], what: str = "shape") -> Lens:
    out = tuple(operator.index(n) for n in lens)
    for n in out:
        if n < 1:
            raise ValueError(
                f"index maps need non-empty dimensions, got {what} {list(out)} "
                "(an empty tensor needs no index map)"
            )
    return out


def _vars(lens: Lens, prefix: str = "i") -> tuple[Var, ...]:
    return tuple(Var(f"{prefix}{k}", n) for k, n in enumerate(lens))


class IndexMap:
    """A map from an index of ``out_lens`` (``out_vars``) to an index of ``in_lens`` (``exprs``).

    Immutable; equality and hash are structural (variables, expressions, ``in_lens``).
    See the module docstring for the direction conventions.
    """

    __slots__ = ("out_vars", "exprs", "in_lens", "_inverse_fn", "_inverse_cache", "_inverse_known")
    out_vars: tuple[Var, ...]
    exprs: tuple[Expr, ...]
    in_lens: Lens

    def __init__(
        self,
        out_vars: Sequence[Var],
        exprs: Sequence[ExprLike],
        in_lens: Sequence[int],
        *,
        inverse: Callable[[], IndexMap | None] | None = None,
    ) -> None:
        """``inverse``, if given, is a thunk computing the exact inverse (or None); it is
        called at most once, lazily. Without it ``inverse()`` inverts symbolically."""
        ov = tuple(out_vars)
        ex = tuple(as_expr(e) for e in exprs)
        il = _lens(in_lens, "in_lens")
        if not all(isinstance(v, Var) for v in ov):
            raise TypeError("out_vars must be Var instances")
        if len({v.name for v in ov}) != len(ov):
            raise ValueError(f"out_vars need distinct names, got {[v.name for v in ov]}")
        if len(ex) != len(il):
            raise ValueError(f"{len(ex)} expressions for an input of rank {len(il)}")
        names = {v.name for v in ov}
        for e in ex:
            stray = {v.name for v in free_vars(e)} - names
            if stray:
                raise ValueError(f"expression {e} uses variables {sorted(stray)} not in out_vars")
        object.__setattr__(self, "out_vars", ov)
        object.__setattr__(self, "exprs", ex)
        object.__setattr__(self, "in_lens", il)
        object.__setattr__(self, "_inverse_fn", inverse)
        object.__setattr__(self, "_inverse_cache", None)
        object.__setattr__(self, "_inverse_known", False)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("IndexMap is immutable")

    # -- shape -----------------------------------------------------------------------
    @property
    def out_lens(self) -> Lens:
        """Shape of the domain (the view's output for an input map)."""
        return tuple(v.extent for v in self.out_vars)

    @property
    def out_rank(self) -> int:
        return len(self.out_vars)

    # -- structure -------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IndexMap):
            return NotImplemented
        return (self.out_vars, self.exprs, self.in_lens) == (other.out_vars, other.exprs, other.in_lens)

    def __hash__(self) -> int:
        return hash((self.out_vars, self.exprs, self.in_lens))

    def __str__(self) -> str:
        dom = ", ".join(v.name for v in self.out_vars)
        cod = ", ".join(str(e) for e in self.exprs)
        return f"{{{_fmt(self.out_lens)}}} -> {{{_fmt(self.in_lens)}}}: ({dom}) -> ({cod})"

    def __repr__(self) -> str:
        return f"IndexMap({self})"

    def __reduce__(self) -> tuple:
        # The inverse thunk is not kept; a copy inverts symbolically.
        return (IndexMap, (self.out_vars, self.exprs, self.in_lens))

    def is_identity(self) -> bool:
        """Whether the map sends every index to itself (same shape, each expr its own var;
        a size-1 dim may read the constant 0)."""
        if self.out_lens != self.in_lens:
            return False
        return all(e == v or (v.extent == 1 and e == 0) for v, e in zip(self.out_vars, self.exprs))

    # -- use -------------------------------------------------------------------------
    def apply(self, index: Sequence[ExprLike], *, check: bool = True) -> tuple[Expr, ...]:
        """The codomain index for a domain index given as expressions (one per out dim),
        simplified under the ranges of the given expressions. ``check`` as in
        ``substitute``: raise if a given expression can leave its dimension's range."""
        if len(index) != self.out_rank:
            raise ValueError(f"{len(index)} indices for a map of rank {self.out_rank}")
        mapping = {v.name: as_expr(x) for v, x in zip(self.out_vars, index)}
        return tuple(substitute(e, mapping, check=check) for e in self.exprs)

    def evaluate(self, index: Sequence[Any]) -> tuple[np.ndarray, ...]:
        """Numerically map a domain index given as ints or integer arrays (one per out
        dim, broadcastable) to codomain index arrays, all of the broadcast shape."""
        if len(index) != self.out_rank:
            raise ValueError(f"{len(index)} indices for a map of rank {self.out_rank}")
        env = {v.name: np.asarray(x, dtype=np.int64) for v, x in zip(self.out_vars, index)}
        shape = np.broadcast_shapes(*(a.shape for a in env.values())) if env else ()
        return tuple(
            np.broadcast_to(np.asarray(evaluate(e, env), dtype=np.int64), shape) for e in self.exprs
        )

    def gather(self, x: np.ndarray) -> np.ndarray:
        """Materialize the view: the array of ``out_lens`` whose element at each index is
        ``x`` at the mapped index (``x`` has shape ``in_lens``). Handy as a test oracle."""
        x = np.asarray(x)
        if x.shape != self.in_lens:
            raise ValueError(f"array of shape {x.shape} for a map reading {self.in_lens}")
        grid = tuple(np.indices(self.out_lens)) if self.out_rank else ()
        return np.asarray(x[self.evaluate(grid)]).reshape(self.out_lens)

    # -- algebra ---------------------------------------------------------------------
    def after(self, inner: IndexMap) -> IndexMap:
        """``self . inner``: first ``inner``, then ``self`` (``x -> self(inner(x))``).

        Needs ``inner.in_lens == self.out_lens``. For views in dataflow order
        ``producer -> A -> B``, the input map of the pair is ``mA.after(mB)``.
        """
        if inner.in_lens != self.out_lens:
            raise ValueError(
                f"cannot compose: inner map reads {{{_fmt(inner.in_lens)}}} but the outer map "
                f"is defined on {{{_fmt(self.out_lens)}}}"
            )
        mapping = {v.name: e for v, e in zip(self.out_vars, inner.exprs)}
        # The inner expressions are valid indices of self's domain by construction, so the
        # range check of substitute (sound but not tight) is skipped.
        exprs = tuple(substitute(e, mapping, check=False) for e in self.exprs)
        outer = self

        def inv() -> IndexMap | None:
            oi, ii = outer.inverse(), inner.inverse()
            if oi is None or ii is None:
                return None
            return ii.after(oi)

        return IndexMap(inner.out_vars, exprs, self.in_lens, inverse=inv)

    def inverse(self) -> IndexMap | None:
        """The map back (codomain index -> domain index) if the map is a bijection, else None.

        ``m.inverse().inverse()`` is ``m``. The result is exact on every index.
        """
        if not self._inverse_known:
            inv = self._inverse_fn() if self._inverse_fn is not None else None
            if inv is None:
                inv = _invert_strided(self)
            if inv is not None:
                object.__setattr__(inv, "_inverse_cache", self)
                object.__setattr__(inv, "_inverse_known", True)
            object.__setattr__(self, "_inverse_cache", inv)
            object.__setattr__(self, "_inverse_known", True)
        return self._inverse_cache


def _fmt(lens: Sequence[int]) -> str:
    return ", ".join(str(n) for n in lens)


def compose(outer: IndexMap, inner: IndexMap) -> IndexMap:
    """``outer . inner`` (apply ``inner`` first); same as ``outer.after(inner)``."""
    return outer.after(inner)


def chain_input_map(*view_maps: IndexMap) -> IndexMap:
    """Input map of a chain of views given in dataflow order (the view nearest the
    producer first): the map from the last view's output index to the producer's index."""
    if not view_maps:
        raise ValueError("chain_input_map needs at least one map")
    result = view_maps[0]
    for m in view_maps[1:]:
        result = result.after(m)
    return result


# ---------------------------------------------------------------------------------------
# Address helpers
# ---------------------------------------------------------------------------------------


def strides_for(lens: Sequence[int]) -> Lens:
    """Row-major (standard) strides of a shape, in elements."""
    strides = []
    acc = 1
    for n in reversed(tuple(lens)):
        strides.append(acc)
        acc *= operator.index(n)
    return tuple(reversed(strides))


def linear_offset(index: Sequence[ExprLike], strides: Sequence[int], offset: int = 0) -> Expr:
    """Flat address ``offset + sum(index[k] * strides[k])`` as a simplified expression."""
    if len(index) != len(strides):
        raise ValueError(f"{len(index)} indices for {len(strides)} strides")
    out: Expr = Const(offset)
    for x, s in zip(index, strides):
        out = out + as_expr(x) * operator.index(s)
    return out


def delinearize(flat: ExprLike, lens: Sequence[int]) -> tuple[Expr, ...]:
    """Row-major index of a flat position: ``(flat // stride_k) % lens[k]`` per dim.

    ``flat`` must lie in ``[0, prod(lens))``; the leading dim takes no modulo.
    """
    flat = as_expr(flat)
    ls = tuple(operator.index(n) for n in lens)
    out = []
    for k, (n, s) in enumerate(zip(ls, strides_for(ls))):
        q = flat // s
        out.append(q if k == 0 else q % n)
    return tuple(out)


# ---------------------------------------------------------------------------------------
# View maps (all in the gather direction: view output index -> view input index)
# ---------------------------------------------------------------------------------------


def identity_map(lens: Sequence[int]) -> IndexMap:
    """The identity on ``lens`` (its own inverse)."""
    ls = _lens(lens)
    vs = _vars(ls)
    m: IndexMap
    m = IndexMap(vs, vs, ls, inverse=lambda: m)
    return m


def reshape_map(in_lens: Sequence[int], out_lens: Sequence[int]) -> IndexMap:
    """Input map of a row-major reshape: out index -> flat offset -> in index.

    Both shapes must be concrete (ONNX 0/-1 already resolved) with equal element counts.
    Inverse: ``reshape_map(out_lens, in_lens)``.
    """
    il, ol = _lens(in_lens, "in_lens"), _lens(out_lens, "out_lens")
    if math.prod(il) != math.prod(ol):
        raise ValueError(f"cannot reshape {{{_fmt(il)}}} ({math.prod(il)} elements) to {{{_fmt(ol)}}} ({math.prod(ol)})")
    vs = _vars(ol)
    exprs = delinearize(linear_offset(vs, strides_for(ol)), il)
    return IndexMap(vs, exprs, il, inverse=lambda: reshape_map(ol, il))


def transpose_map(in_lens: Sequence[int], perm: Sequence[int] | None = None) -> IndexMap:
    """Input map of an ONNX Transpose: ``out.shape[i] = in.shape[perm[i]]`` and
    ``out[i_0, ..] = in[j]`` with ``j[perm[i]] = i_i``. ``perm=None`` reverses the dims.
    Inverse: the transpose by the inverse permutation.
    """
    il = _lens(in_lens, "in_lens")
    p = tuple(reversed(range(len(il)))) if perm is None else tuple(operator.index(k) for k in perm)
    if sorted(p) != list(range(len(il))):
        raise ValueError(f"perm {list(p)} is not a permutation of the {len(il)} dims")
    ol = tuple(il[k] for k in p)
    vs = _vars(ol)
    exprs: list[Expr] = [Const(0)] * len(il)
    for i, k in enumerate(p):
        exprs[k] = vs[i]
    inv_perm = [0] * len(p)
    for i, k in enumerate(p):
        inv_perm[k] = i
    return IndexMap(vs, exprs, il, inverse=lambda: transpose_map(ol, inv_perm))


def broadcast_map(in_lens: Sequence[int], out_lens: Sequence[int]) -> IndexMap:
    """Input map of a NumPy/ONNX multidirectional broadcast (Expand) to ``out_lens``:
    dims align on the right, leading output dims are dropped, size-1 input dims read 0.
    Invertible only when nothing is actually broadcast.
    """
    il, ol = _lens(in_lens, "in_lens"), _lens(out_lens, "out_lens")
    lead = len(ol) - len(il)
    if lead < 0:
        raise ValueError(f"cannot broadcast {{{_fmt(il)}}} to the lower rank {{{_fmt(ol)}}}")
    vs = _vars(ol)
    exprs: list[Expr] = []
    for j, n in enumerate(il):
        m = ol[lead + j]
        if n == m:
            exprs.append(vs[lead + j])
        elif n == 1:
            exprs.append(Const(0))
        else:
            raise ValueError(f"cannot broadcast {{{_fmt(il)}}} to {{{_fmt(ol)}}}: dim {j} is {n}, target {m}")
    return IndexMap(vs, exprs, il)


def slice_map(
    in_lens: Sequence[int],
    starts: Sequence[int],
    ends: Sequence[int],
    axes: Sequence[int] | None = None,
    steps: Sequence[int] | None = None,
) -> IndexMap:
    """Input map of an ONNX Slice (same clamping rules as NumPy/Python slicing, so
    negative starts/ends and negative steps work): ``in[axis] = start + step * i``.

    An empty result raises ValueError. ``out_lens`` of the result is the sliced shape.
    Invertible only when the slice keeps every element (e.g. a full reversal).
    """
    il = _lens(in_lens, "in_lens")
    r = len(il)
    ax = list(range(len(starts))) if axes is None else [operator.index(a) for a in axes]
    st = [1] * len(ax) if steps is None else [operator.index(s) for s in steps]
    if not (len(starts) == len(ends) == len(ax) == len(st)):
        raise ValueError("starts, ends, axes and steps must have the same length")
    first = [0] * r
    step = [1] * r
    ol = list(il)
    seen: set[int] = set()
    for s, e, a, k in zip(starts, ends, ax, st):
        if not -r <= a < r:
            raise ValueError(f"slice axis {a} out of range for rank {r}")
        a %= r
        if a in seen:
            raise ValueError(f"slice axis {a} repeated")
        seen.add(a)
        if k == 0:
            raise ValueError("slice step cannot be 0")
        rng = range(*slice(operator.index(s), operator.index(e), k).indices(il[a]))
        if len(rng) == 0:
            raise ValueError(f"slice of axis {a} is empty (start {s}, end {e}, step {k})")
        first[a], step[a], ol[a] = rng.start, k, len(rng)
    vs = _vars(tuple(ol))
    exprs = [vs[a] * step[a] + first[a] for a in range(r)]
    return IndexMap(vs, exprs, il)


def squeeze_map(in_lens: Sequence[int], axes: Sequence[int] | None = None) -> IndexMap:
    """Input map of Squeeze: the squeezed dims (all size-1 dims when ``axes`` is None)
    read index 0. Inverse: ``unsqueeze_map(out_lens, axes)``."""
    il = _lens(in_lens, "in_lens")
    r = len(il)
    if axes is None:
        ax = sorted(k for k, n in enumerate(il) if n == 1)
    else:
        ax = sorted({_norm_axis(a, r) for a in axes})
        if len(ax) != len(list(axes)):
            raise ValueError(f"squeeze axes {list(axes)} repeat a dim")
    for a in ax:
        if il[a] != 1:
            raise ValueError(f"cannot squeeze dim {a} of size {il[a]} in {{{_fmt(il)}}}")
    kept = [k for k in range(r) if k not in ax]
    ol = tuple(il[k] for k in kept)
    vs = _vars(ol)
    exprs: list[Expr] = [Const(0)] * r
    for i, k in enumerate(kept):
        exprs[k] = vs[i]
    return IndexMap(vs, exprs, il, inverse=lambda: unsqueeze_map(ol, ax))


def unsqueeze_map(in_lens: Sequence[int], axes: Sequence[int]) -> IndexMap:
    """Input map of Unsqueeze (``axes`` index the output, negative allowed): the inserted
    size-1 dims are dropped. Inverse: ``squeeze_map(out_lens, axes)``."""
    il = _lens(in_lens, "in_lens")
    ro = len(il) + len(axes)
    ax = sorted({_norm_axis(a, ro) for a in axes})
    if len(ax) != len(list(axes)):
        raise ValueError(f"unsqueeze axes {list(axes)} repeat a dim")
    src = iter(range(len(il)))
    kept = [k for k in range(ro) if k not in ax]
    ol = [1] * ro
    for k in kept:
        ol[k] = il[next(src)]
    vs = _vars(tuple(ol))
    exprs = [vs[k] for k in kept]
    olt = tuple(ol)
    return IndexMap(vs, exprs, il, inverse=lambda: squeeze_map(olt, ax))


def flatten_map(in_lens: Sequence[int], axis: int = 1) -> IndexMap:
    """Input map of ONNX Flatten to 2-D ``{prod(in[:axis]), prod(in[axis:])}`` (a reshape)."""
    il = _lens(in_lens, "in_lens")
    a = axis + len(il) if axis < 0 else axis
    if not 0 <= a <= len(il):
        raise ValueError(f"flatten axis {axis} out of range for rank {len(il)}")
    return reshape_map(il, (math.prod(il[:a]), math.prod(il[a:])))


def embed_map(part_lens: Sequence[int], out_lens: Sequence[int], axis: int, offset: int) -> IndexMap:
    """Scatter map of a part written into a larger buffer (concat elimination): part
    index -> buffer index, ``+offset`` along ``axis``. Injective; bijective (and
    invertible) only when the part fills the buffer."""
    pl, ol = _lens(part_lens, "part_lens"), _lens(out_lens, "out_lens")
    if len(pl) != len(ol):
        raise ValueError(f"part {{{_fmt(pl)}}} and buffer {{{_fmt(ol)}}} differ in rank")
    a = _norm_axis(axis, len(ol))
    for k, (p, o) in enumerate(zip(pl, ol)):
        if k != a and p != o:
            raise ValueError(f"part {{{_fmt(pl)}}} does not match buffer {{{_fmt(ol)}}} off axis {a}")
    if offset < 0 or offset + pl[a] > ol[a]:
        raise ValueError(f"part of {pl[a]} at offset {offset} overflows axis {a} of size {ol[a]}")
    vs = _vars(pl)
    exprs = [v + offset if k == a else v for k, v in enumerate(vs)]
    return IndexMap(vs, exprs, ol)


def _norm_axis(a: int, rank: int) -> int:
    a = operator.index(a)
    if not -rank <= a < rank:
        raise ValueError(f"axis {a} out of range for rank {rank}")
    return a % rank


# ---------------------------------------------------------------------------------------
# Symbolic inversion
# ---------------------------------------------------------------------------------------


def _invert_strided(m: IndexMap) -> IndexMap | None:
    """Invert a map whose flat input offset is ``c0 + sum(k_i * i_i)`` with the ``|k_i|``
    (over dims of extent > 1) tiling ``[0, prod(in_lens))`` exactly, i.e. a permutation
    of row-major strides, possibly reversed along some dims. Returns None otherwise.

    Given that every expression is a valid index (checked with bounds), the flat offset
    being such a bijection makes the map one; the inverse reads each domain index off
    the flat offset of the codomain index.
    """
    n_in = math.prod(m.in_lens)
    if math.prod(m.out_lens) != n_in:
        return None
    for e, n in zip(m.exprs, m.in_lens):
        lo, hi = e._bounds
        if lo < 0 or hi > n - 1:
            return None
    flat = linear_offset(m.exprs, strides_for(m.in_lens))
    if isinstance(flat, Sum):
        c0, terms = flat.const, dict(flat.terms)
    elif isinstance(flat, Const):
        c0, terms = flat.value, {}
    else:
        c0, terms = 0, {flat: 1}
    by_name = {v.name: v for v in m.out_vars}
    coeff: dict[str, int] = {}
    for a, c in terms.items():
        if not isinstance(a, Var) or by_name.get(a.name) != a:
            return None
        coeff[a.name] = c
    big = [v for v in m.out_vars if v.extent > 1]
    if any(v.name not in coeff for v in big):
        return None
    expected = 1
    for v in sorted(big, key=lambda v: abs(coeff[v.name])):
        if abs(coeff[v.name]) != expected:
            return None
        expected *= v.extent
    if expected != n_in:
        return None
    if c0 != sum(-coeff[v.name] * (v.extent - 1) for v in big if coeff[v.name] < 0):
        return None
    us = _vars(m.in_lens)
    flat_in = linear_offset(us, strides_for(m.in_lens))
    exprs: list[Expr] = []
    for v in m.out_vars:
        if v.extent == 1:
            exprs.append(Const(0))
            continue
        k = coeff[v.name]
        digit = (flat_in // abs(k)) % v.extent
        exprs.append(digit if k > 0 else (v.extent - 1) - digit)
    return IndexMap(us, exprs, m.out_lens, inverse=lambda: m)
