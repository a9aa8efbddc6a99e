"""Where a stored fused group's loads and stores may reach: inside their buffers.

A fused program read from a file has index maps that fusion did not compute here; the kernel
generated from a map addresses memory through it without checking, so a map reaching past its
buffer would read or write device memory the program does not own. Each memory op's map is
therefore bounded by the ranges of its variables (`index_expr.bounds`, sound: the true range
lies within), narrowed by the op's domain (the kernel touches only indices inside it): a
condition `lo <= v < hi` on a variable narrows that variable, and one `lo <= d < hi` on an
expression that differs from the map's by a constant c bounds the map's to lo+c .. hi-1+c.
Where these bounds leave the buffer (a domain over sums of several variables, as a shifted
window's), the map is evaluated at every index of its domain that uses its variables, when
there are at most EXACT_LIMIT of them. Anything still outside is refused.
"""

from __future__ import annotations

import math

import numpy as np

from fusegraph.errors import SavedProgramError
from fusegraph.ir.index_expr import Expr, Var, bounds, evaluate, free_vars, substitute
from fusegraph.ir.program import Instruction
from fusegraph.ops.fused import domain_mask

#: the most indices of a map's variables evaluated one by one when its bounds say too little
EXACT_LIMIT = 1 << 22


def check_in_bounds(ins: Instruction, where: str) -> None:
    """Raise a SavedProgramError when a load's or store's map can leave the buffer it addresses.
    Each step below runs only for an axis the cheaper ones before it could not bound."""
    m = ins.op.attrs.get("map")
    if m is None:
        return
    domain = ins.op.attrs.get("domain", ())
    for axis, (e, n) in enumerate(zip(m.exprs, m.in_lens)):
        lo, hi = bounds(e)
        if (lo < 0 or hi >= n) and domain:
            lo, hi = _within_domain(e, domain, n)
        if lo < 0 or hi >= n:
            raise SavedProgramError(f"{where}: its index map reaches {lo}..{hi} on axis {axis} of a buffer "
                                    f"of {n}: it would address memory outside the buffer; refused")


def _within_domain(e: Expr, domain: tuple, n: int) -> tuple[int, int]:
    """Bounds of `e` where `domain` holds: its variables narrowed, then each condition on an
    expression differing from `e` by a constant, then (when that is not enough) evaluation."""
    narrowed = _narrowed(domain)
    lo, hi = bounds(substitute(e, narrowed)) if narrowed else bounds(e)
    for d, dlo, dhi in domain:
        c_lo, c_hi = bounds(e - d)
        if c_lo == c_hi:  # e = d + c on the domain, where dlo <= d < dhi
            lo, hi = max(lo, dlo + c_lo), min(hi, dhi - 1 + c_lo)
    if 0 <= lo and hi < n:
        return lo, hi
    exact = _exact_range(e, domain)
    return exact if exact is not None else (lo, hi)


def _narrowed(domain: tuple) -> dict[str, object]:
    """Variables that a domain condition `lo <= v < hi` bounds directly, as `lo + v'` with v'
    ranging over 0 .. hi-lo-1."""
    out: dict[str, object] = {}
    for e, lo, hi in domain:
        if isinstance(e, Var) and 0 <= lo < hi <= e.extent and e.name not in out:
            out[e.name] = Var(e.name, hi - lo) + lo
    return out


def _exact_range(e: Expr, domain: tuple) -> tuple[int, int] | None:
    """The least and greatest value of `e` where `domain` holds, by evaluation; (0, 0) when
    the domain is empty, None when there are more than EXACT_LIMIT indices to evaluate."""
    variables = sorted(set(free_vars(e)).union(*(free_vars(d) for d, _, _ in domain)), key=lambda v: v.name)
    if math.prod(v.extent for v in variables) > EXACT_LIMIT:
        return None
    lens = tuple(v.extent for v in variables)
    grid = {v.name: a for v, a in zip(variables, np.indices(lens, sparse=True))} if lens else {}
    values = np.broadcast_to(np.asarray(evaluate(e, grid)), lens)[domain_mask(domain, grid, lens)]
    return (int(values.min()), int(values.max())) if values.size else (0, 0)
