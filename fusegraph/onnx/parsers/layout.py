"""Parsers of ONNX shape and layout ops: views, concat, split, gather and the shape subgraph ops.

Shape-valued inputs (a Reshape's target, Slice bounds, Split sizes) must be constants; the
importer folds Shape -> Gather -> Concat chains into literals as it reads them, so they are.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import numpy_helper

from fusegraph.ir.program import Instruction
from fusegraph.ir.shape import MAX_ELEMENTS
from fusegraph.ops import views as v
from fusegraph.ops.movement import Concat, Gather
from fusegraph.onnx.context import ImportContext, onnx_op, prod


@onnx_op("Reshape")
def parse_reshape(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None
    if ctx.opset >= 5:
        dims = ctx.require_ints(ins[1], "the target shape")
    elif ctx.has_attr("shape"):  # before opset 5 the target is an attribute
        dims = list(ctx.attr("shape"))
    else:
        raise ctx.error("missing attribute 'shape'")
    allowzero = ctx.attr("allowzero", 0)
    out = []
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            if i >= x.shape.ndim:
                raise ctx.error(f"dim 0 at position {i} copies a dimension the input (rank {x.shape.ndim}) lacks")
            d = x.shape.lens[i]
        out.append(d)
    if out.count(-1) > 1:
        raise ctx.error(f"at most one -1 allowed in shape {dims}")
    if -1 in out:
        known = prod([d for d in out if d != -1])
        if known == 0 or x.shape.elements % known:
            raise ctx.error(f"cannot reshape {list(x.shape.lens)} to {dims}")
        out[out.index(-1)] = x.shape.elements // known
    return ctx.add(v.Reshape(out), [x])


@onnx_op("Transpose")
def parse_transpose(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None
    perm = ctx.attr("perm", list(range(x.shape.ndim))[::-1])
    return ctx.add(v.Transpose(perm), [x])


@onnx_op("Flatten")
def parse_flatten(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None
    axis = ctx.attr("axis", 1)
    r = x.shape.ndim
    if not -r <= axis <= r:
        raise ctx.error(f"axis {axis} out of range for rank {r}")
    return ctx.add(v.Flatten(axis + r if axis < 0 else axis), [x])


def _axes_input(ctx: ImportContext, ins: list[Instruction | None], k: int) -> list[int] | None:
    """Axes from an attribute (older opsets) or from input k (newer); None when absent."""
    if ctx.has_attr("axes"):
        return list(ctx.attr("axes"))
    if len(ins) > k and ins[k] is not None:
        return ctx.require_ints(ins[k], "axes")
    return None


@onnx_op("Squeeze")
def parse_squeeze(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None
    axes = _axes_input(ctx, ins, 1)
    if axes is None:
        axes = [i for i, n in enumerate(x.shape.lens) if n == 1]
    axes = ctx.axes(axes, x.shape.ndim)
    for a in axes:
        if x.shape.lens[a] != 1:
            raise ctx.error(f"cannot squeeze axis {a} of length {x.shape.lens[a]}")
    return ctx.add(v.Squeeze(axes), [x])


@onnx_op("Unsqueeze")
def parse_unsqueeze(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None
    axes = _axes_input(ctx, ins, 1)
    if axes is None:
        raise ctx.error("missing axes")
    axes = ctx.axes(axes, x.shape.ndim + len(axes))
    return ctx.add(v.Unsqueeze(axes), [x])


@onnx_op("Expand")
def parse_expand(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None
    shape = ctx.require_ints(ins[1], "the shape")
    try:
        lens = np.broadcast_shapes(tuple(x.shape.lens), tuple(shape))
    except ValueError:
        raise ctx.error(f"cannot expand {list(x.shape.lens)} to {shape}") from None
    if tuple(lens) == x.shape.lens:
        return x
    return ctx.add(v.MultiBroadcast(lens), [x])


@onnx_op("Slice")
def parse_slice(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None
    r = x.shape.ndim
    if ctx.opset < 10:
        if not (ctx.has_attr("starts") and ctx.has_attr("ends")):
            raise ctx.error("missing attribute 'starts' or 'ends'")
        starts, ends = list(ctx.attr("starts")), list(ctx.attr("ends"))
        axes = list(ctx.attr("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = ctx.require_ints(ins[1], "starts"), ctx.require_ints(ins[2], "ends")
        axes = ctx.require_ints(ins[3], "axes") if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
        steps = ctx.require_ints(ins[4], "steps") if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.error("starts, ends, axes and steps differ in length")
    axes = ctx.axes(axes, r)
    if any(s == 0 for s in steps):
        raise ctx.error("slice step cannot be 0")
    sl = v.Slice.normalized(x.shape.lens, axes, starts, ends, steps)
    if all(s == 0 and e == x.shape.lens[a] and st == 1 for a, s, e, st in zip(sl.axes, sl.starts, sl.ends, sl.steps)):
        return x
    return ctx.add(sl, [x])


@onnx_op("Tile")
def parse_tile(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """Tiling is a view: [d0, d1] -> unsqueeze [1, d0, 1, d1] -> broadcast [r0, d0, r1, d1] -> reshape.

    Before opset 6 the inputs were a count (`tiles`) and the one `axis` it repeats."""
    x = ins[0]
    assert x is not None
    r = x.shape.ndim
    if ctx.opset < 6:
        if len(ins) < 3 or ins[2] is None:
            raise ctx.error("needs inputs tiles and axis before opset 6")
        axis = ctx.axis(ctx.require_ints(ins[2], "axis")[0], r)
        reps = [1] * r
        reps[axis] = ctx.require_ints(ins[1], "tiles")[0]
    else:
        reps = ctx.require_ints(ins[1], "repeats")
    if len(reps) != r or any(n < 1 for n in reps):
        raise ctx.error(f"repeats {reps} must be {r} positive values")
    if all(n == 1 for n in reps):
        return x
    spread = ctx.add(v.Unsqueeze(range(0, 2 * r, 2)), [x])
    lens = [d for n, m in zip(reps, x.shape.lens) for d in (n, m)]
    tiled = ctx.add(v.MultiBroadcast(lens), [spread])
    return ctx.add(v.Reshape([n * m for n, m in zip(reps, x.shape.lens)]), [tiled])


@onnx_op("Trilu")
def parse_trilu(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """Keep the upper (or lower) triangle from diagonal k: a where() against a constant mask."""
    from fusegraph.ops.pointwise import Where

    x = ins[0]
    assert x is not None
    if x.shape.ndim < 2:
        raise ctx.error(f"input must have rank >= 2, got {list(x.shape.lens)}")
    k = int(ctx.require_const(ins[1], "k").reshape(())) if len(ins) > 1 and ins[1] is not None else 0
    ones = np.ones(x.shape.lens[-2:], dtype=bool)
    mask = np.triu(ones, k) if ctx.attr("upper", 1) else np.tril(ones, k)
    zero = ctx.literal(np.zeros((), x.shape.dtype.numpy))
    return ctx.add(Where(), ctx.broadcast(ctx.literal(mask), x, zero))


@onnx_op("Split")
def parse_split(ctx: ImportContext, ins: list[Instruction | None]) -> list[Instruction]:
    """Split becomes one slice view per output, so each part fuses like any other view."""
    x = ins[0]
    assert x is not None and ctx.node is not None
    axis = ctx.axis(ctx.attr("axis", 0), x.shape.ndim)
    n = x.shape.lens[axis]
    outs = len(ctx.node.output)
    if ctx.has_attr("split"):
        sizes = list(ctx.attr("split"))
    elif len(ins) > 1 and ins[1] is not None:
        sizes = ctx.require_ints(ins[1], "split")
    else:
        parts = ctx.attr("num_outputs", outs)
        if parts < 1:
            raise ctx.error(f"num_outputs must be positive, got {parts}")
        chunk = -(-n // parts)
        sizes = [min(chunk, n - i * chunk) for i in range(parts)]
    if sum(sizes) != n or any(s < 0 for s in sizes):
        raise ctx.error(f"split sizes {sizes} do not add up to {n} on axis {axis}")
    results, start = [], 0
    for s in sizes:
        results.append(ctx.add(v.Slice([axis], [start], [start + s]), [x]))
        start += s
    return results


@onnx_op("Concat")
def parse_concat(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    xs = [x for x in ins if x is not None]
    if not xs:
        raise ctx.error("needs at least one input")
    axis = ctx.attr("axis", 1 if ctx.opset < 4 else None)  # optional, default 1, before opset 4
    if axis is None:
        raise ctx.error("missing attribute 'axis'")
    axis = ctx.axis(axis, xs[0].shape.ndim)
    xs = [x for x in xs if x.shape.lens[axis] != 0] or xs[:1]
    if len(xs) == 1:
        return xs[0]
    return ctx.add(Concat(axis), xs)


@onnx_op("Gather")
def parse_gather(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    data, idx = ins[0], ins[1]
    assert data is not None and idx is not None
    axis = ctx.axis(ctx.attr("axis", 0), data.shape.ndim)
    values = ctx.const(idx)
    n = data.shape.lens[axis]
    if values is not None and values.size and (values.min() < -n or values.max() >= n):
        raise ctx.error(f"index out of range [{-n}, {n}) on axis {axis}")
    if values is not None and values.ndim == 0:
        # a constant scalar index is a slice plus a squeeze: two views that fuse
        i = int(values) + (n if int(values) < 0 else 0)
        part = ctx.add(v.Slice([axis], [i], [i + 1]), [data]) if n != 1 else data
        return ctx.add(v.Squeeze([axis]), [part])
    return ctx.add(Gather(axis), [data, idx])


@onnx_op("Shape")
def parse_shape(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None
    lens = list(x.shape.lens)
    start, end = ctx.attr("start", 0), ctx.attr("end", None)
    return ctx.literal(np.array(lens[slice(start, end)], dtype=np.int64))


@onnx_op("Size")
def parse_size(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    return ctx.literal(np.array(ins[0].shape.elements, dtype=np.int64))  # type: ignore[union-attr]


@onnx_op("Constant")
def parse_constant(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    assert ctx.node is not None
    for a in ctx.node.attribute:
        if a.name == "value":
            return ctx.literal(numpy_helper.to_array(a.t))
        if a.name in ("value_float", "value_int"):
            return ctx.literal(np.array(ctx.attr(a.name), np.float32 if a.name == "value_float" else np.int64))
        if a.name in ("value_floats", "value_ints"):
            return ctx.literal(np.array(ctx.attr(a.name), np.float32 if a.name == "value_floats" else np.int64))
    raise ctx.error("no supported value attribute (value, value_float(s), value_int(s))")


@onnx_op("ConstantOfShape")
def parse_constant_of_shape(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    shape = ctx.require_ints(ins[0], "the shape")
    value = ctx.attr("value")
    fill = np.asarray(value).reshape(-1)[:1] if value is not None else np.zeros(1, np.float32)
    scalar = fill.reshape(())
    if prod(shape) <= 4096:
        return ctx.literal(np.full(shape, scalar, dtype=scalar.dtype))
    return ctx.add(v.MultiBroadcast(shape), [ctx.literal(scalar)])


@onnx_op("Range")
def parse_range(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    bounds = [ctx.require_const(x, "Range bounds").reshape(-1) for x in ins[:3]]
    if any(b.size != 1 for b in bounds):
        raise ctx.error(f"start, limit and delta must be one value each, got {[b.tolist() for b in bounds]}")
    start, limit, delta = (b[0] for b in bounds)
    if delta == 0:
        raise ctx.error("delta cannot be 0")
    n = max(0, math.ceil((float(limit) - float(start)) / float(delta)))
    if n > MAX_ELEMENTS:
        raise ctx.error(f"{n} elements from {start} to {limit} by {delta}, more than the {MAX_ELEMENTS} of one tensor")
    return ctx.literal(np.arange(start, limit, delta).astype(start.dtype))


@onnx_op("NonZero")
def parse_non_zero(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """The coordinates [rank, count] of the nonzero elements: their number sets the output's
    shape, so the input must be known at import (a constant, or values a caller fixes); a
    scalar counts as one element, as in ONNX Runtime."""
    value = ctx.require_const(ins[0], "the input (the output's shape depends on its values)")
    return ctx.literal(np.array(np.nonzero(np.atleast_1d(value)), dtype=np.int64).reshape(max(value.ndim, 1), -1))


@onnx_op("DepthToSpace", "SpaceToDepth")
def parse_depth_to_space(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """Both are index maps (block rearrangements): fused kernels read and store through them."""
    x = ins[0]
    assert x is not None
    if x.shape.ndim != 4:
        raise ctx.error(f"needs a 4-d input [N, C, H, W], got rank {x.shape.ndim}")
    b = ctx.attr("blocksize", None)
    if b is None or b < 1:
        raise ctx.error(f"blocksize must be a positive integer, got {b}")
    mode = ctx.check_attr("mode", ctx.attr("mode", "DCR"), ["DCR", "CRD"])
    op = v.SpaceToDepth if ctx.node.op_type == "SpaceToDepth" else v.DepthToSpace
    return ctx.add(op(b, mode), [x])
