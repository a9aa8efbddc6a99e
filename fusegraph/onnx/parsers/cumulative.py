"""Parsers of CumSum and CumProd, as a masked reduction: element o of the result folds the
inputs i that a constant triangular mask M[o, i] admits (i <= o; i < o when `exclusive`; the
other way round when `reverse`). The input is broadcast to [..., n, n, ...] and reduced over
the second n, which fuses into one reduction kernel; the work is n times the input's, fine
for the sequence lengths models take cumulative sums over."""

from __future__ import annotations

import numpy as np

from fusegraph.ir.program import Instruction
from fusegraph.ops import make_op
from fusegraph.ops import pointwise as pw
from fusegraph.ops import views as v
from fusegraph.onnx.context import ImportContext, onnx_op


@onnx_op("CumSum", "CumProd")
def parse_cumulative(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None and ctx.node is not None
    axis_value = ctx.require_const(ins[1], "axis").reshape(-1)
    if axis_value.size != 1 or axis_value.dtype.kind not in "iu":
        raise ctx.error(f"axis must be one integer, got {axis_value.tolist()}")
    r = x.shape.ndim
    a = ctx.axis(int(axis_value[0]), r)
    n = x.shape.lens[a]
    o, i = np.arange(n)[:, None], np.arange(n)[None, :]
    before = i < o if ctx.attr("exclusive", 0) else i <= o
    after = i > o if ctx.attr("exclusive", 0) else i >= o
    mask = after if ctx.attr("reverse", 0) else before
    lens = (*x.shape.lens[:a], n, n, *x.shape.lens[a + 1:])
    spread = ctx.add(v.MultiBroadcast(lens), [ctx.add(v.Unsqueeze([a]), [x])])
    admitted = ctx.add(v.MultiBroadcast(lens), [ctx.literal(mask.reshape((1,) * a + (n, n) + (1,) * (r - a - 1)))])
    product = ctx.node.op_type == "CumProd"
    neutral = ctx.add(v.MultiBroadcast(lens), [ctx.literal(np.array(1 if product else 0, x.shape.dtype.numpy))])
    masked = ctx.add(pw.Where(), [admitted, spread, neutral])
    total = ctx.add(make_op("reduce_prod" if product else "reduce_sum", axes=[a + 1]), [masked])
    return ctx.add(v.Squeeze([a + 1]), [total])
