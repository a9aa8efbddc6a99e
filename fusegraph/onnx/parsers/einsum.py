"""The Einsum parser: an equation becomes diagonals, sums, transposes and batched matrix
products, so a contraction runs on the GEMM template like any MatMul.

Each operand first loses its repeated letters (a diagonal: a where() against an identity mask,
summed) and the letters no one else needs (summed). Operands then contract left to right, two
at a time: the letters both share and still need are the batch, the shared ones no longer
needed are contracted, the rest are rows (left) and columns (right) of one `dot`. The result
is transposed to the output's letter order. Ellipsis dims get letters of their own, aligned
from the right as broadcasting aligns them.
"""

from __future__ import annotations

import math
import string

import numpy as np

from fusegraph.ir.program import Instruction
from fusegraph.ops import make_op
from fusegraph.ops import pointwise as pw
from fusegraph.ops import views as v
from fusegraph.onnx.context import ImportContext, onnx_op
from fusegraph.onnx.parsers.nn import matmul

_SPARE = [c for c in string.ascii_uppercase]  # ellipsis letters; equations use lower and upper case


def _terms(ctx: ImportContext, equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """The operands' letters and the output's, with every ellipsis spelled out."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ctx.error(f"equation {equation!r} names {len(terms)} operands, the node has {len(ranks)}")
    used = set(eq)
    spare = [c for c in _SPARE if c not in used]
    width = max([r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t] or [0])
    ell = "".join(spare[:width])
    spelled = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            t = t.replace("...", ell[width - (r - len(t.replace("...", ""))):])
        if len(t) != r or not all(c.isalpha() for c in t):
            raise ctx.error(f"term {t!r} of {equation!r} does not fit an operand of rank {r}")
        spelled.append(t)
    if not arrow:
        letters = "".join(spelled)
        out = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell))
    out = out.replace("...", ell)
    return spelled, out


def _diagonal(ctx: ImportContext, x: Instruction, term: str) -> tuple[Instruction, str]:
    """Repeated letters of one operand reduced to one: x[..i..i..] -> x[..i..]."""
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        p, q = term.index(c), term.index(c, term.index(c) + 1)
        n = x.shape.lens[p]
        eye = np.eye(n, dtype=bool).reshape([n if d in (p, q) else 1 for d in range(len(term))])
        zero = ctx.literal(np.zeros((), x.shape.dtype.numpy))
        masked = ctx.add(pw.Where(), ctx.broadcast(ctx.literal(eye), x, zero))
        x = ctx.add(v.Squeeze([q]), [ctx.add(make_op("reduce_sum", axes=[q]), [masked])])
        term = term[:q] + term[q + 1:]
    return x, term


def _sum_out(ctx: ImportContext, x: Instruction, term: str, keep: set[str]) -> tuple[Instruction, str]:
    axes = [k for k, c in enumerate(term) if c not in keep]
    if not axes:
        return x, term
    x = ctx.add(v.Squeeze(axes), [ctx.add(make_op("reduce_sum", axes=axes), [x])])
    return x, "".join(c for c in term if c in keep)


def _arrange(ctx: ImportContext, x: Instruction, term: str, order: str) -> Instruction:
    perm = [term.index(c) for c in order]
    return x if perm == sorted(perm) else ctx.add(v.Transpose(perm), [x])


def _contract(ctx: ImportContext, a: Instruction, ta: str, b: Instruction, tb: str,
              keep: set[str]) -> tuple[Instruction, str]:
    """a and b contracted over their shared letters not in `keep` (see the module docstring)."""
    size = {c: n for t, x in ((ta, a), (tb, b)) for c, n in zip(t, x.shape.lens) if n != 1}
    batch = "".join(c for c in ta if c in tb and c in keep)
    summed = "".join(c for c in ta if c in tb and c not in keep)
    left, right = "".join(c for c in ta if c not in tb), "".join(c for c in tb if c not in ta)

    def operand(x: Instruction, t: str, rows: str, cols: str) -> Instruction:
        order = batch + rows + cols
        x = _arrange(ctx, x, t, order)
        lens = [size.get(c, 1) for c in order]
        if list(x.shape.lens) != lens:
            x = ctx.add(v.MultiBroadcast(lens), [x])
        dims = [math.prod(size.get(c, 1) for c in part) for part in (batch, rows, cols)]
        return ctx.add(v.Reshape(dims), [x])

    product = matmul(ctx, operand(a, ta, left, summed), operand(b, tb, summed, right))
    term = batch + left + right
    return ctx.add(v.Reshape([size.get(c, 1) for c in term]), [product]), term


@onnx_op("Einsum")
def parse_einsum(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    xs = [x for x in ins if x is not None]
    equation = ctx.attr("equation")
    if not xs or not isinstance(equation, str):
        raise ctx.error("needs operands and an equation")
    terms, out = _terms(ctx, equation, [x.shape.ndim for x in xs])
    if len(set(out)) != len(out) or not set(out) <= set("".join(terms)):
        raise ctx.error(f"output {out!r} of {equation!r} repeats a letter or names one no operand has")
    parts = []
    for k, (x, t) in enumerate(zip(xs, terms)):
        x, t = _diagonal(ctx, x, t)
        needed = set(out).union(*(terms[j] for j in range(len(xs)) if j != k))
        parts.append(_sum_out(ctx, x, t, needed))
    x, t = parts[0]
    for k, (y, u) in enumerate(parts[1:], start=1):
        keep = set(out).union(*(terms[j] for j in range(k + 1, len(xs))))
        x, t = _contract(ctx, x, t, y, u, keep)
    x, t = _sum_out(ctx, x, t, set(out))
    return _arrange(ctx, x, t, out)
