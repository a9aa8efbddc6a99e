"""Integer index expressions with range-aware, exact simplification.

Every view op (reshape, transpose, slice, broadcast, ...) is an index map, and an index
map is a tuple of the expressions defined here (see ``index_map.py`` and DESIGN.md,
"Views are index maps"). A fused kernel computes its load and store addresses from them,
so they must be *exact* (a wrong simplification is a wrong address) and *small* (every
``//`` and ``%`` left in costs instructions and breaks store coalescing).

Representation
--------------
An expression is immutable and hashable. There are few node kinds:

* ``Var(name, extent)``: an index variable whose value lies in ``0 .. extent-1``.
* ``Const(value)``.
* ``Sum``: a normalized linear form ``const + sum(coeff * atom)``.
* atoms: ``Var``, ``FloorDiv(arg, d)``, ``Mod(arg, d)`` (``d`` a positive int constant)
  and ``Prod`` (a product of two or more atoms, for the rare non-linear case).

The Python operators (``+ - * // %``, with ints too) and the functions ``floordiv`` and
``mod`` are *smart constructors*: they return the simplest form they can prove equal for
every value of the variables in their ranges. The node classes themselves build raw
nodes without any simplification; use the operators (or ``simplify``) to build
expressions.

Invariants kept by the smart constructors
-----------------------------------------
* A ``Var`` of extent 1 is the constant 0 inside any arithmetic (a bare ``Var`` stays a
  ``Var``, so index maps keep their variables).
* Sums have no zero coefficients, their atoms are sorted by a canonical key, and a sum of
  a single atom with coefficient 1 and no constant is the atom itself, so structural
  equality (``==``) is a useful (sound, not complete) equality test.
* The argument of every ``FloorDiv``/``Mod`` node has a lower bound >= 0. Floor and
  truncating division then agree, so the text from ``to_source`` is also correct in
  languages whose ``//`` and ``%`` truncate toward zero (C, and Triton on integers).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Iterable, Mapping
from typing import Any, Union

import numpy as np

__all__ = [
    "Expr",
    "Var",
    "Const",
    "Sum",
    "FloorDiv",
    "Mod",
    "Prod",
    "ExprLike",
    "as_expr",
    "floordiv",
    "mod",
    "bounds",
    "evaluate",
    "free_vars",
    "substitute",
    "simplify",
    "to_source",
    "is_affine_in",
    "coefficient",
    "divmod_args_nonnegative",
]

# Rank of each node kind in the canonical ordering key (atoms sort by kind, then content).
_K_CONST, _K_VAR, _K_FLOORDIV, _K_MOD, _K_PROD, _K_SUM = range(6)

# A bound on the rewrite loop of sums; each rewrite is exact, the bound only guarantees
# termination should two rules ever feed each other.
_MAX_SUM_REWRITES = 64


class Expr:
    """Base class of all index expressions (immutable, hashable, comparable by structure)."""

    __slots__ = ("_key", "_hash", "_bounds")
    _key: tuple
    _hash: int
    _bounds: tuple[int, int]

    # -- structure -------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if isinstance(other, Expr):
            return self._hash == other._hash and self._key == other._key
        if isinstance(other, (int, np.integer)) and not isinstance(other, bool):
            return isinstance(self, Const) and self.value == int(other)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __hash__(self) -> int:
        return self._hash

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _init(self, key: tuple, hash_value: int, bnds: tuple[int, int]) -> None:
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash_value)
        object.__setattr__(self, "_bounds", bnds)

    # -- arithmetic (smart constructors) ---------------------------------------------
    def __add__(self, other: ExprLike) -> Expr:
        return _add(self, as_expr(other))

    def __radd__(self, other: ExprLike) -> Expr:
        return _add(as_expr(other), self)

    def __sub__(self, other: ExprLike) -> Expr:
        return _add(self, _mul(as_expr(other), _MINUS_ONE))

    def __rsub__(self, other: ExprLike) -> Expr:
        return _add(as_expr(other), _mul(self, _MINUS_ONE))

    def __neg__(self) -> Expr:
        return _mul(self, _MINUS_ONE)

    def __pos__(self) -> Expr:
        return self

    def __mul__(self, other: ExprLike) -> Expr:
        return _mul(self, as_expr(other))

    def __rmul__(self, other: ExprLike) -> Expr:
        return _mul(as_expr(other), self)

    def __floordiv__(self, other: ExprLike) -> Expr:
        return floordiv(self, _const_divisor(other))

    def __mod__(self, other: ExprLike) -> Expr:
        return mod(self, _const_divisor(other))

    def __rfloordiv__(self, other: ExprLike) -> Expr:
        if isinstance(self, Const):
            return floordiv(as_expr(other), _const_divisor(self))
        raise TypeError("division by a non-constant expression is not supported")

    def __rmod__(self, other: ExprLike) -> Expr:
        if isinstance(self, Const):
            return mod(as_expr(other), _const_divisor(self))
        raise TypeError("modulo by a non-constant expression is not supported")

    # -- printing --------------------------------------------------------------------
    def __str__(self) -> str:
        return _src(self, {}, top=True)

    def __repr__(self) -> str:
        return f"Expr({_src(self, {}, top=True)})"


ExprLike = Union[Expr, int, np.integer]


class Const(Expr):
    """An integer constant. ``Const(3) == 3`` is True and both hash alike."""

    __slots__ = ("value",)
    value: int

    def __init__(self, value: int) -> None:
        v = operator.index(value)
        object.__setattr__(self, "value", v)
        self._init((_K_CONST, v), hash(v), (v, v))

    def __repr__(self) -> str:
        return f"Const({self.value})"

    def __reduce__(self) -> tuple:
        return (Const, (self.value,))


class Var(Expr):
    """An index variable ranging over ``0 .. extent-1`` (extent >= 1).

    Two variables are the same expression when both name and extent agree; ``evaluate``
    and ``substitute`` address variables by name.
    """

    __slots__ = ("name", "extent")
    name: str
    extent: int

    def __init__(self, name: str, extent: int) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"variable name must be an identifier, got {name!r}")
        ext = operator.index(extent)
        if ext < 1:
            raise ValueError(f"variable {name!r} needs an extent >= 1, got {ext}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "extent", ext)
        self._init((_K_VAR, name, ext), hash((_K_VAR, name, ext)), (0, ext - 1))

    def __repr__(self) -> str:
        return f"Var({self.name!r}, {self.extent})"

    def __reduce__(self) -> tuple:
        return (Var, (self.name, self.extent))


class _ByConstant(Expr):
    """Shared shape of the two raw nodes that take an expression and a positive int divisor.

    Subclasses give `_KIND` and `_range(lo, hi, d)`, the bounds of the node for an argument in
    [lo, hi]; `arg` and `divisor` are set here, and copies rebuild through the subclass.
    """

    __slots__ = ("arg", "divisor")
    arg: Expr
    divisor: int
    _KIND: int

    def __init__(self, arg: Expr, divisor: int) -> None:
        d = _check_divisor(divisor)
        object.__setattr__(self, "arg", arg)
        object.__setattr__(self, "divisor", d)
        kind = type(self)._KIND
        self._init((kind, arg._key, d), hash((kind, arg._hash, d)), self._range(*arg._bounds, d))

    @staticmethod
    def _range(lo: int, hi: int, d: int) -> tuple[int, int]:  # pragma: no cover - overridden
        raise NotImplementedError

    def __reduce__(self) -> tuple:
        return (type(self), (self.arg, self.divisor))


class FloorDiv(_ByConstant):
    """Raw node ``floor(arg / divisor)``, divisor a positive int. Build it with ``//``."""

    __slots__ = ()
    _KIND = _K_FLOORDIV

    @staticmethod
    def _range(lo: int, hi: int, d: int) -> tuple[int, int]:
        return lo // d, hi // d


class Mod(_ByConstant):
    """Raw node ``arg mod divisor`` (floor semantics), divisor a positive int. Build it with ``%``."""

    __slots__ = ()
    _KIND = _K_MOD

    @staticmethod
    def _range(lo: int, hi: int, d: int) -> tuple[int, int]:
        if lo // d == hi // d:
            return lo % d, hi % d
        if lo >= 0:
            return 0, min(d - 1, hi)
        return 0, d - 1


class Prod(Expr):
    """Raw node: product of two or more atoms (non-linear; opaque to the simplifier)."""

    __slots__ = ("factors",)
    factors: tuple[Expr, ...]

    def __init__(self, factors: Iterable[Expr]) -> None:
        fs = tuple(factors)
        if len(fs) < 2:
            raise ValueError("Prod needs at least two factors")
        object.__setattr__(self, "factors", fs)
        lo, hi = fs[0]._bounds
        for f in fs[1:]:
            flo, fhi = f._bounds
            cands = (lo * flo, lo * fhi, hi * flo, hi * fhi)
            lo, hi = min(cands), max(cands)
        self._init(
            (_K_PROD, tuple(f._key for f in fs)),
            hash((_K_PROD, tuple(f._hash for f in fs))),
            (lo, hi),
        )

    def __reduce__(self) -> tuple:
        return (Prod, (self.factors,))


class Sum(Expr):
    """Raw node: linear form ``const + sum(coeff * atom for atom, coeff in terms)``."""

    __slots__ = ("const", "terms")
    const: int
    terms: tuple[tuple[Expr, int], ...]

    def __init__(self, const: int, terms: Iterable[tuple[Expr, int]]) -> None:
        ts = tuple((a, operator.index(c)) for a, c in terms)
        c0 = operator.index(const)
        object.__setattr__(self, "const", c0)
        object.__setattr__(self, "terms", ts)
        lo = hi = c0
        for a, c in ts:
            alo, ahi = a._bounds
            if c >= 0:
                lo += c * alo
                hi += c * ahi
            else:
                lo += c * ahi
                hi += c * alo
        self._init(
            (_K_SUM, c0, tuple((a._key, c) for a, c in ts)),
            hash((_K_SUM, c0, tuple((a._hash, c) for a, c in ts))),
            (lo, hi),
        )

    def __reduce__(self) -> tuple:
        return (Sum, (self.const, self.terms))


_MINUS_ONE = Const(-1)
_ZERO = Const(0)


# ---------------------------------------------------------------------------------------
# Conversions and checks
# ---------------------------------------------------------------------------------------


def as_expr(x: ExprLike) -> Expr:
    """Return ``x`` as an expression (ints become ``Const``)."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        raise TypeError("bool is not an index expression")
    try:
        return Const(operator.index(x))
    except TypeError:
        raise TypeError(f"cannot use {type(x).__name__} as an index expression") from None


def _check_divisor(d: Any) -> int:
    v = operator.index(d)
    if v <= 0:
        raise ValueError(f"divisor must be a positive integer, got {v}")
    return v


def _const_divisor(x: ExprLike) -> int:
    if isinstance(x, Expr):
        if isinstance(x, Const):
            return _check_divisor(x.value)
        raise TypeError("division by a non-constant expression is not supported")
    return _check_divisor(x)


# ---------------------------------------------------------------------------------------
# Linear forms
# ---------------------------------------------------------------------------------------

_Lin = tuple[int, dict[Expr, int]]


def _lin(e: Expr) -> _Lin:
    """The linear form (const, {atom: coeff}) of ``e``; extent-1 variables are 0."""
    if isinstance(e, Const):
        return e.value, {}
    if isinstance(e, Sum):
        return e.const, dict(e.terms)
    if isinstance(e, Var) and e.extent == 1:
        return 0, {}
    return 0, {e: 1}


def _terms_bounds(terms: Mapping[Expr, int]) -> tuple[int, int]:
    lo = hi = 0
    for a, c in terms.items():
        alo, ahi = a._bounds
        if c >= 0:
            lo += c * alo
            hi += c * ahi
        else:
            lo += c * ahi
            hi += c * alo
    return lo, hi


def _accumulate(terms: dict[Expr, int], other: Mapping[Expr, int], scale: int) -> None:
    for a, c in other.items():
        v = terms.get(a, 0) + scale * c
        if v:
            terms[a] = v
        else:
            terms.pop(a, None)


def _build(const: int, terms: Mapping[Expr, int]) -> Expr:
    """Canonical expression of a linear form, after the sum rewrites (see ``_rewrite_sum``)."""
    ts = {a: c for a, c in terms.items() if c}
    const, ts = _rewrite_sum(const, ts)
    if not ts:
        return Const(const)
    if const == 0 and len(ts) == 1:
        ((a, c),) = ts.items()
        if c == 1:
            return a
    return Sum(const, sorted(ts.items(), key=lambda ac: ac[0]._key))


def _rewrite_sum(const: int, terms: dict[Expr, int]) -> _Lin:
    """Fold quotient/remainder pairs in a sum, exactly.

    Rule 1 (recombine): ``m*(y % d) + m*d*(y // d) -> m*y``.
    Rule 2 (remainder): ``m*y - m*d*(y // d) -> m*(y % d)``.
    Both are identities of integer floor division, valid for all values. A rule only
    fires when the whole matching group of terms is present with exactly the needed
    coefficients, so nothing is ever split in a way that grows the sum.
    """
    for _ in range(_MAX_SUM_REWRITES):
        changed = False
        for atom, m in list(terms.items()):
            if terms.get(atom) != m:
                continue
            if isinstance(atom, Mod):
                y, d = atom.arg, atom.divisor
                cq, tq = _lin(floordiv(y, d))
                if tq and all(terms.get(a) == m * d * c for a, c in tq.items()):
                    del terms[atom]
                    _accumulate(terms, tq, -m * d)
                    cy, ty = _lin(y)
                    _accumulate(terms, ty, m)
                    const += m * cy - m * d * cq
                    changed = True
            elif isinstance(atom, FloorDiv) and m % atom.divisor == 0:
                y, d = atom.arg, atom.divisor
                mm = -(m // d)
                cy, ty = _lin(y)
                if ty and all(terms.get(a) == mm * c for a, c in ty.items()):
                    del terms[atom]
                    _accumulate(terms, ty, -mm)
                    cr, tr = _lin(mod(y, d))
                    _accumulate(terms, tr, mm)
                    const += mm * cr - mm * cy
                    changed = True
        if not changed:
            break
    return const, terms


# ---------------------------------------------------------------------------------------
# Smart constructors
# ---------------------------------------------------------------------------------------


def _add(a: Expr, b: Expr) -> Expr:
    if isinstance(b, Const) and b.value == 0:
        return a if not (isinstance(a, Var) and a.extent == 1) else _ZERO
    ca, ta = _lin(a)
    cb, tb = _lin(b)
    _accumulate(ta, tb, 1)
    return _build(ca + cb, ta)


def _atom_factors(a: Expr) -> tuple[Expr, ...]:
    return a.factors if isinstance(a, Prod) else (a,)


def _mul(a: Expr, b: Expr) -> Expr:
    ca, ta = _lin(a)
    cb, tb = _lin(b)
    if not ta or not tb:  # scaling by a constant
        k, c, t = (ca, cb, tb) if not ta else (cb, ca, ta)
        if k == 0:
            return _ZERO
        return _build(k * c, {x: k * v for x, v in t.items()})
    # Non-linear: expand (ca + ta) * (cb + tb) into products of atoms.
    terms: dict[Expr, int] = {}
    _accumulate(terms, ta, cb)
    _accumulate(terms, tb, ca)
    for x, cx in ta.items():
        for y, cy in tb.items():
            p = Prod(sorted(_atom_factors(x) + _atom_factors(y), key=lambda f: f._key))
            _accumulate(terms, {p: 1}, cx * cy)
    return _build(ca * cb, terms)


def _split_const(const: int, terms: Mapping[Expr, int], d: int) -> tuple[int, int, int]:
    """Write ``const = q*d + r`` with ``r`` chosen so that ``terms + r`` has its lower bound
    in ``[0, d)``. Returns ``(q, r, hi)`` where ``hi`` is the upper bound of ``terms + r``."""
    lo, hi = _terms_bounds(terms)
    q = (lo + const) // d
    r = const - q * d
    return q, r, hi + r


def _gcd_candidates(terms: Mapping[Expr, int], d: int) -> list[int]:
    cands = {math.gcd(c, d) for c in terms.values()}
    cands.add(math.gcd(d, *terms.values()) if terms else d)
    return sorted((g for g in cands if 1 < g < d), reverse=True)


@functools.lru_cache(maxsize=1 << 16)
def floordiv(e: Expr, d: int) -> Expr:
    """``floor(e / d)`` for a positive int ``d``, simplified exactly using variable ranges.

    Rules, in order (each exact for every value in range):
    ``e // 1 -> e``; constant result when ``e``'s range lies in one quotient interval;
    ``(d*a + b) // d -> a + b // d`` (terms whose coefficient is a multiple of ``d``);
    ``(G*X + S) // d -> X // (d/G)`` when ``G`` divides ``d`` and ``0 <= S < G``;
    ``(x // a + r) // d -> (x + r*a) // (a*d)``; ``(x % (a*d)) // d -> (x // d) % a``.
    """
    e = as_expr(e)
    d = _check_divisor(d)
    if d == 1:
        return e
    lo, hi = e._bounds
    if lo // d == hi // d:
        return Const(lo // d)
    const, terms = _lin(e)
    mult = {a: c // d for a, c in terms.items() if c % d == 0}
    rest = {a: c for a, c in terms.items() if c % d != 0}
    q, r, _ = _split_const(const, rest, d)
    if mult or q:
        return _add(_build(q, mult), floordiv(_build(r, rest), d))
    # Now e = rest + r, with no multiple of d among the coefficients and lower bound in [0, d).
    for g in _gcd_candidates(rest, d):
        big = {a: c // g for a, c in rest.items() if c % g == 0}
        small = {a: c for a, c in rest.items() if c % g != 0}
        qs, _rs, hi_s = _split_const(r, small, g)
        if hi_s < g:
            return floordiv(_build(qs, big), d // g)
    if len(rest) == 1:
        ((a, c),) = rest.items()
        if c == 1 and isinstance(a, FloorDiv):
            return floordiv(_add(a.arg, Const(r * a.divisor)), a.divisor * d)
        if c == 1 and r == 0 and isinstance(a, Mod) and a.divisor % d == 0:
            return mod(floordiv(a.arg, d), a.divisor // d)
    return FloorDiv(_build(r, rest), d)


@functools.lru_cache(maxsize=1 << 16)
def mod(e: Expr, d: int) -> Expr:
    """``e mod d`` (floor semantics, result in ``[0, d)``) for a positive int ``d``, simplified
    exactly using variable ranges.

    Rules: ``e % 1 -> 0``; ``e - q*d`` when ``e``'s range lies in one quotient interval
    (so ``x % c -> x`` for ``0 <= x < c``); coefficients and constant reduced modulo ``d``
    (``(a*d + b) % d -> b % d``); ``(x % (k*d)) % d -> x % d`` inside the sum;
    ``(G*X + S) % d -> G*(X % (d/G)) + S`` when ``G`` divides ``d`` and ``0 <= S < G``.
    """
    e = as_expr(e)
    d = _check_divisor(d)
    if d == 1:
        return _ZERO
    lo, hi = e._bounds
    if lo // d == hi // d:
        return _add(e, Const(-(lo // d) * d))
    const, terms = _lin(e)
    changed = False
    new: dict[Expr, int] = {}
    new_const = const
    for a, c in terms.items():
        if isinstance(a, Mod) and a.divisor % d == 0:
            cy, ty = _lin(a.arg)
            _accumulate(new, ty, c)
            new_const += c * cy
            changed = True
            continue
        c2 = c % d if c > 0 else -((-c) % d)
        if c2 != c:
            changed = True
        if c2:
            _accumulate(new, {a: c2}, 1)
    if changed:
        return mod(_build(new_const, new), d)
    q, r, hi_r = _split_const(const, terms, d)
    if hi_r < d:
        return _build(r, terms)
    for g in _gcd_candidates(terms, d):
        big = {a: c // g for a, c in terms.items() if c % g == 0}
        small = {a: c for a, c in terms.items() if c % g != 0}
        qs, rs, hi_s = _split_const(r, small, g)
        if hi_s < g:
            return _add(_mul(mod(_build(qs, big), d // g), Const(g)), _build(rs, small))
    return Mod(_build(r, terms), d)


# ---------------------------------------------------------------------------------------
# Queries
# ---------------------------------------------------------------------------------------


def bounds(e: ExprLike) -> tuple[int, int]:
    """Inclusive ``(lo, hi)`` containing every value of ``e`` over its variables' ranges.

    Sound, not always tight: correlated atoms (the same variable in several terms) are
    bounded independently.
    """
    return as_expr(e)._bounds


def evaluate(e: ExprLike, env: Mapping[str, Any]) -> Any:
    """Value of ``e`` with variables bound by name in ``env`` to ints or integer numpy arrays.

    Arrays broadcast against each other; ``//`` and ``%`` use floor semantics (Python and
    NumPy agree). A constant expression returns a Python int.
    """
    e = as_expr(e)
    cache: dict[Expr, Any] = {}

    def ev(x: Expr) -> Any:
        if x in cache:
            return cache[x]
        if isinstance(x, Const):
            v: Any = x.value
        elif isinstance(x, Var):
            try:
                v = env[x.name]
            except KeyError:
                raise KeyError(f"no value for index variable {x.name!r}") from None
        elif isinstance(x, Sum):
            v = x.const
            for a, c in x.terms:
                v = v + c * ev(a)
        elif isinstance(x, FloorDiv):
            v = ev(x.arg) // x.divisor
        elif isinstance(x, Mod):
            v = ev(x.arg) % x.divisor
        elif isinstance(x, Prod):
            v = 1
            for f in x.factors:
                v = v * ev(f)
        else:  # pragma: no cover - closed set of node kinds
            raise TypeError(f"unknown expression node {type(x).__name__}")
        cache[x] = v
        return v

    return ev(e)


def _walk(e: Expr) -> Iterable[Expr]:
    stack = [e]
    seen: set[Expr] = set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        yield x
        if isinstance(x, Sum):
            stack.extend(a for a, _ in x.terms)
        elif isinstance(x, (FloorDiv, Mod)):
            stack.append(x.arg)
        elif isinstance(x, Prod):
            stack.extend(x.factors)


def subexpressions(e: ExprLike) -> Iterable[Expr]:
    """Every node of ``e``, each once (a code generator looks for ``//`` and ``%`` patterns)."""
    return _walk(as_expr(e))


def free_vars(e: ExprLike) -> frozenset[Var]:
    """The variables occurring in ``e``."""
    return frozenset(x for x in _walk(as_expr(e)) if isinstance(x, Var))


def divmod_args_nonnegative(e: ExprLike) -> bool:
    """Whether every ``//``/``%`` argument in ``e`` is provably >= 0, i.e. whether
    truncating division (C, Triton) computes the same value as floor division.

    Always true for expressions built by the smart constructors; a code generator can
    assert it before emitting ``to_source`` text.
    """
    return all(x.arg._bounds[0] >= 0 for x in _walk(as_expr(e)) if isinstance(x, (FloorDiv, Mod)))


def substitute(
    e: ExprLike, mapping: Mapping[str, ExprLike], *, check: bool = True
) -> Expr:
    """Replace variables (by name) with expressions, simultaneously, and re-simplify.

    ``e`` was simplified under its variables' ranges, so the result is exact only where
    each replacement stays inside the range of the variable it replaces. With
    ``check=True`` (default) a replacement whose bounds leave ``[0, extent)`` raises
    ValueError; pass ``check=False`` when the caller knows better than the (sound but
    not always tight) bounds, e.g. when composing index maps whose indices are valid by
    construction.
    """
    e = as_expr(e)
    repl = {k: as_expr(v) for k, v in mapping.items()}
    checked: set[Var] = set()
    cache: dict[Expr, Expr] = {}

    def sub(x: Expr) -> Expr:
        if x in cache:
            return cache[x]
        if isinstance(x, Const):
            out: Expr = x
        elif isinstance(x, Var):
            out = repl.get(x.name, x)
            if check and out is not x and x not in checked:
                lo, hi = out._bounds
                if lo < 0 or hi > x.extent - 1:
                    raise ValueError(
                        f"substituting {out} (range {lo}..{hi}) for {x.name} "
                        f"(range 0..{x.extent - 1}) would leave the range the expression "
                        "was simplified under"
                    )
                checked.add(x)
        elif isinstance(x, Sum):
            out = Const(x.const)
            for a, c in x.terms:
                out = _add(out, _mul(sub(a), Const(c)))
        elif isinstance(x, FloorDiv):
            out = floordiv(sub(x.arg), x.divisor)
        elif isinstance(x, Mod):
            out = mod(sub(x.arg), x.divisor)
        elif isinstance(x, Prod):
            out = Const(1)
            for f in x.factors:
                out = _mul(out, sub(f))
        else:  # pragma: no cover
            raise TypeError(f"unknown expression node {type(x).__name__}")
        cache[x] = out
        return out

    return sub(e)


def simplify(e: ExprLike) -> Expr:
    """Rebuild ``e`` through the smart constructors (useful for hand-built raw nodes)."""
    return substitute(e, {}, check=False)


def _affine_split(e: Expr, var: Var | str) -> tuple[bool, int]:
    name = var.name if isinstance(var, Var) else var
    _, terms = _lin(e)
    coeff = 0
    for a, c in terms.items():
        if isinstance(a, Var) and a.name == name:
            coeff += c
        elif any(v.name == name for v in free_vars(a)):
            return False, 0
    return True, coeff


def is_affine_in(e: ExprLike, var: Var | str) -> bool:
    """Whether ``e == coeff * var + (terms free of var)`` over var's whole range.

    This is what makes a store contiguous along a kernel's vector dimension. It is a
    structural test on the simplified form, so simplify under the ranges you mean (e.g.
    substitute ``n = 85*t + j`` with ``j < 85`` to ask about a tile aligned to a split).
    """
    return _affine_split(as_expr(e), var)[0]


def coefficient(e: ExprLike, var: Var | str) -> int | None:
    """The stride of ``e`` along ``var`` (0 if absent) when ``e`` is affine in it, else None."""
    ok, c = _affine_split(as_expr(e), var)
    return c if ok else None


# ---------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------


def _src(e: Expr, names: Mapping[str, str], top: bool) -> str:
    """Source text of ``e``. With ``top=False`` the text is self-delimited (safe as an
    operand of any operator); with ``top=True`` a sum or product is left unwrapped."""
    if isinstance(e, Const):
        return str(e.value) if (e.value >= 0 or top) else f"({e.value})"
    if isinstance(e, Var):
        return names.get(e.name, e.name)
    if isinstance(e, (FloorDiv, Mod)):
        op = "//" if isinstance(e, FloorDiv) else "%"
        return f"({_src(e.arg, names, top=False)} {op} {e.divisor})"
    if isinstance(e, Prod):
        text = " * ".join(_src(f, names, top=False) for f in e.factors)
        return text if top else f"({text})"
    if isinstance(e, Sum):
        # Print the largest strides first: reads like an address polynomial.
        ordered = sorted(e.terms, key=lambda ac: (-abs(ac[1]), ac[0]._key))
        parts: list[str] = []
        for a, c in ordered:
            body = _src(a, names, top=False)
            mag = abs(c)
            text = body if mag == 1 else f"{mag} * {body}"
            if not parts:
                parts.append(text if c > 0 else f"-{text}")
            else:
                parts.append(f"+ {text}" if c > 0 else f"- {text}")
        if e.const:
            parts.append(f"+ {e.const}" if e.const > 0 else f"- {-e.const}")
        text = " ".join(parts)
        return text if top else f"({text})"
    raise TypeError(f"unknown expression node {type(e).__name__}")  # pragma: no cover


def to_source(e: ExprLike, names: Mapping[str, str] | None = None) -> str:
    """Python/Triton source text for ``e``, self-delimited (sums come wrapped in parens),
    so it can be pasted as an operand anywhere. ``names`` renames variables.

    Uses ``//`` and ``%``; every such argument built by the smart constructors is >= 0,
    so truncating integer division gives the same result (see ``divmod_args_nonnegative``).
    """
    return _src(as_expr(e), names or {}, top=False)
