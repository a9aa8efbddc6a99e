"""Parsers of ops that select elements by comparison: TopK, Hardmax, OneHot and Compress.

They are composed of ops that fuse and have GPU kernels. TopK ranks each element by counting
the elements that beat it (larger, or equal at a lower index: ONNX's order), then the k-th
output picks the element of rank k; that compares every pair along the axis, n times the
input's work, fine for the short axes of node tests and of classification heads. Hardmax and
OneHot compare an index against a constant iota; Compress, whose condition must be known at
import, is a Gather by the positions it keeps.
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction
from fusegraph.ops import make_op
from fusegraph.ops import pointwise as pw
from fusegraph.ops import reduce
from fusegraph.ops import views as v
from fusegraph.ops.movement import Gather
from fusegraph.onnx.context import ImportContext, onnx_op
from fusegraph.onnx.parsers.elementwise import binary


def _iota(ctx: ImportContext, n: int, axis: int, rank: int, dtype: np.dtype = np.dtype(np.int64)) -> Instruction:
    """0..n-1 along `axis` of a rank-`rank` literal whose other dims are 1."""
    return ctx.literal(np.arange(n, dtype=dtype).reshape([n if d == axis else 1 for d in range(rank)]))


def _pick(ctx: ImportContext, chosen: Instruction, x: Instruction, axis: int) -> Instruction:
    """sum over `axis` of where(chosen, x, 0): the one element `chosen` marks on each line."""
    zero = ctx.literal(np.zeros((), x.shape.dtype.numpy))
    c, xb, z = ctx.broadcast(chosen, x, zero)
    total = ctx.add(make_op("reduce_sum", axes=[axis]), [ctx.add(pw.Where(), [c, xb, z])])
    return ctx.add(v.Squeeze([axis]), [total])


@onnx_op("TopK")
def parse_top_k(ctx: ImportContext, ins: list[Instruction | None]) -> list[Instruction]:
    x = ins[0]
    assert x is not None
    r = x.shape.ndim
    a = ctx.axis(ctx.attr("axis", -1), r)
    n = x.shape.lens[a]
    if ctx.opset < 10:
        k = int(ctx.attr("k", -1))
    else:
        k_value = ctx.require_const(ins[1], "k").reshape(-1)
        k = int(k_value[0]) if k_value.size == 1 and k_value.dtype.kind in "iu" else -1
    if not 0 <= k <= n:
        raise ctx.error(f"k must be one integer in [0, {n}] for axis {a} of {list(x.shape.lens)}")
    # element i at axis a, its rivals j at axis a + 1
    xi, xj = ctx.add(v.Unsqueeze([a + 1]), [x]), ctx.add(v.Unsqueeze([a]), [x])
    better = binary(ctx, "greater" if ctx.attr("largest", 1) else "less", xj, xi)
    tie = ctx.add(make_op("logical_and"), ctx.broadcast(
        binary(ctx, "equal", xj, xi), binary(ctx, "less", _iota(ctx, n, a + 1, r + 1), _iota(ctx, n, a, r + 1))))
    beats = ctx.convert(ctx.add(make_op("logical_or"), ctx.broadcast(better, tie)), DType.int64)
    rank = ctx.add(make_op("reduce_sum", axes=[a + 1]), [beats])  # [.., n, 1, ..]: element i's place
    # output slot s at axis a, element i at axis a + 1
    chosen = binary(ctx, "equal", ctx.add(v.Reshape([*x.shape.lens[:a], 1, n, *x.shape.lens[a + 1:]]), [rank]),
                    _iota(ctx, k, a, r + 1))
    values = _pick(ctx, chosen, ctx.add(v.Unsqueeze([a]), [x]), a + 1)
    indices = _pick(ctx, chosen, _iota(ctx, n, a + 1, r + 1), a + 1)
    return [values, indices]


@onnx_op("Hardmax")
def parse_hardmax(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """1 at the first largest element along the axis (before opset 13: of the input flattened
    to 2-d at `axis`), 0 elsewhere."""
    x = ins[0]
    assert x is not None
    r = x.shape.ndim
    if ctx.opset >= 13:
        a, y = ctx.axis(ctx.attr("axis", -1), r), x
    else:
        y, a = ctx.add(v.Flatten(ctx.axis(ctx.attr("axis", 1), r + 1 if r == 0 else r)), [x]), 1
    first = ctx.add(reduce.ArgReduce(True, a), [y])
    hot = ctx.convert(binary(ctx, "equal", first, _iota(ctx, y.shape.lens[a], a, y.shape.ndim)), x.shape.dtype)
    return hot if hot.shape.lens == x.shape.lens else ctx.add(v.Reshape(x.shape.lens), [hot])


@onnx_op("OneHot")
def parse_one_hot(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    idx, values = ins[0], ins[2]
    assert idx is not None and values is not None
    depth_value = ctx.require_const(ins[1], "depth").reshape(-1)
    if depth_value.size != 1 or not depth_value[0] >= 1:
        raise ctx.error(f"depth must be one positive number, got {depth_value.tolist()}")
    depth = int(depth_value[0])
    if values.shape.elements != 2:
        raise ctx.error(f"values must hold [off, on], got shape {list(values.shape.lens)}")
    r = idx.shape.ndim + 1
    a = ctx.axis(ctx.attr("axis", -1), r)
    i = ctx.convert(idx, DType.int64)
    wrapped = ctx.add(pw.Where(), ctx.broadcast(binary(ctx, "less", i, ctx.literal(np.array(0, np.int64))),
                                                binary(ctx, "add", i, ctx.literal(np.array(depth, np.int64))), i))
    hot = binary(ctx, "equal", ctx.add(v.Unsqueeze([a]), [wrapped]), _iota(ctx, depth, a, r))
    flat = ctx.add(v.Reshape([2]), [values])
    off, on = (ctx.add(v.Reshape([]), [ctx.add(v.Slice([0], [j], [j + 1]), [flat])]) for j in (0, 1))
    return ctx.add(pw.Where(), ctx.broadcast(hot, on, off))


@onnx_op("Compress")
def parse_compress(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None
    cond = ctx.require_const(ins[1], "the condition").reshape(-1).astype(bool)
    if ctx.has_attr("axis"):
        a = ctx.axis(ctx.attr("axis"), x.shape.ndim)
    else:
        x, a = ctx.add(v.Reshape([x.shape.elements]), [x]), 0
    if cond.size > x.shape.lens[a]:
        raise ctx.error(f"condition of {cond.size} is longer than axis {a} of {list(x.shape.lens)}")
    keep = np.flatnonzero(cond).astype(np.int64)
    if keep.size == 0:
        raise ctx.error("the condition keeps nothing: empty outputs are not supported")
    return ctx.add(Gather(a), [x, ctx.literal(keep)])
