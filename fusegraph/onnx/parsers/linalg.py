"""The Det parser: determinants of small matrices by cofactor expansion, level by level.

The minors of the last k rows are indexed by their column sets; each level's minors, for all
sets of k columns at once, are sums of k products of a row element (a Gather by constant
column indices) and a minor of the level below (a Gather by constant set indices), signs
alternating: two gathers, a product and a sum per level, with n * 2^(n-1) products per
matrix in all, fine for the small matrices Det is used on and refused above `MAX_ORDER`.
Half inputs are expanded in float32 and converted back once.
"""

from __future__ import annotations

import itertools

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction
from fusegraph.ops import make_op
from fusegraph.ops import views as v
from fusegraph.ops.movement import Gather
from fusegraph.onnx.context import ImportContext, onnx_op
from fusegraph.onnx.parsers.elementwise import binary

#: The largest order expanded (its last level holds 2^(n-1) products per matrix and term).
MAX_ORDER = 10


@onnx_op("Det")
def parse_det(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None
    lens = x.shape.lens
    if x.shape.ndim < 2 or lens[-1] != lens[-2]:
        raise ctx.error(f"needs square matrices [..., n, n], got {list(lens)}")
    n = lens[-1]
    if not x.shape.dtype.is_float:
        raise ctx.error(f"needs a float input, got {x.shape.dtype}")
    if not 1 <= n <= MAX_ORDER:
        raise ctx.error(f"matrices of order {n} are not supported (1 to {MAX_ORDER}: the expansion grows as 2^n)")
    work = DType.float32 if x.shape.dtype in (DType.float16, DType.bfloat16) else x.shape.dtype
    y = ctx.convert(x, work)
    r = y.shape.ndim

    def row(i: int) -> Instruction:
        return ctx.add(v.Squeeze([r - 2]), [ctx.add(v.Slice([r - 2], [i], [i + 1]), [y])])

    below = {(j,): j for j in range(n)}  # column set -> position in the last row's minors
    minors = row(n - 1)
    for k in range(2, n + 1):
        sets = list(itertools.combinations(range(n), k))
        cols = ctx.literal(np.array([s[t] for t in range(k) for s in sets], np.int64))
        rest = ctx.literal(np.array([below[s[:t] + s[t + 1:]] for t in range(k) for s in sets], np.int64))
        signs = ctx.literal(np.repeat((-1.0) ** np.arange(k), len(sets)).astype(work.numpy))
        terms = binary(ctx, "mul", ctx.add(Gather(r - 2), [row(n - k), cols]), ctx.add(Gather(r - 2), [minors, rest]))
        terms = ctx.add(v.Reshape([*y.shape.lens[:-2], k, len(sets)]), [binary(ctx, "mul", terms, signs)])
        minors = ctx.add(v.Squeeze([r - 2]), [ctx.add(make_op("reduce_sum", axes=[r - 2]), [terms])])
        below = {s: i for i, s in enumerate(sets)}
    return ctx.convert(ctx.add(v.Squeeze([r - 2]), [minors]), x.shape.dtype)
