"""Parsers of the scatters: ScatterElements (and its old name Scatter), ScatterND, Col2Im and
TensorScatter (whose write positions stay run-time values: see its parser).

The indices must be known at import (constants, or input values a caller fixes). Then the
scatter is a gather seen from the output: each data element learns at import which update
elements write it, in order, and the result is `data` with, for the k-th write of each
element, `where(written_k, combine(result, updates[src_k]), result)`, where `updates[src_k]` is
a Gather of the flattened updates by a constant index. Gathers and wheres already fuse and
have GPU kernels; an element written m times needs m such layers (one without reduction,
which keeps the last write, as ONNX Runtime does).
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction
from fusegraph.ops import make_op
from fusegraph.ops import pointwise as pw
from fusegraph.ops import views as v
from fusegraph.ops.gather import GatherElements
from fusegraph.ops.movement import Gather
from fusegraph.onnx.context import ImportContext, onnx_op

_COMBINE = {"add": "add", "mul": "mul", "max": "max", "min": "min"}


def _indices(ctx: ImportContext, idx: Instruction | None) -> np.ndarray:
    value = ctx.require_const(idx, "the scatter indices")
    if value.dtype.kind not in "iu":
        raise ctx.error(f"indices must be integers, got {value.dtype.name}")
    return value.astype(np.int64)


def _layers(dest: np.ndarray, size: int, keep_last: bool) -> list[np.ndarray]:
    """For each write round k, the update element each data element takes (-1: none); update
    elements with a negative destination write nothing."""
    written = np.flatnonzero(dest >= 0)
    order = written[np.argsort(dest[written], kind="stable")]
    sorted_dest = dest[order]
    starts = np.searchsorted(sorted_dest, sorted_dest, side="left")
    rank = np.arange(order.size) - starts  # how many earlier writes hit the same element
    if keep_last:
        last = np.full(size, -1, np.int64)
        last[sorted_dest] = order  # later writes overwrite earlier ones
        return [last]
    layers = []
    for k in range(int(rank.max()) + 1 if order.size else 0):
        src = np.full(size, -1, np.int64)
        pick = rank == k
        src[sorted_dest[pick]] = order[pick]
        layers.append(src)
    return layers


def scatter(ctx: ImportContext, data: Instruction, updates: Instruction, dest: np.ndarray,
            reduction: str | None = None) -> Instruction:
    """`data` with update element j written to flat data position dest[j] (none where it is
    negative), combined by `reduction` (default: the node's attribute; see the module)."""
    if updates.shape.dtype != data.shape.dtype:
        raise ctx.error(f"updates are {updates.shape.dtype}, data {data.shape.dtype}")
    if reduction is None:
        reduction = ctx.check_attr("reduction", ctx.attr("reduction", "none"), ["none", *_COMBINE])
    if not np.any(dest >= 0):
        return data
    flat = ctx.add(v.Reshape([updates.shape.elements]), [updates])
    result = data
    for src in _layers(dest, data.shape.elements, keep_last=reduction == "none"):
        picked = ctx.add(Gather(0), [flat, ctx.literal(np.maximum(src, 0).reshape(data.shape.lens))])
        value = picked if reduction == "none" else ctx.add(make_op(_COMBINE[reduction]), [result, picked])
        result = ctx.add(pw.Where(), [ctx.literal((src >= 0).reshape(data.shape.lens)), value, result])
    return result


def _in_range(ctx: ImportContext, idx: np.ndarray, n: np.ndarray | int) -> np.ndarray:
    if idx.size and (np.any(idx < -n) or np.any(idx >= n)):
        raise ctx.error(f"index out of range for lengths {np.asarray(n).tolist()}")
    return np.where(idx < 0, idx + n, idx)


@onnx_op("ScatterElements", "Scatter")
def parse_scatter_elements(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    data, updates = ins[0], ins[2]
    assert data is not None and updates is not None
    axis = ctx.axis(ctx.attr("axis", 0), data.shape.ndim)
    idx = _indices(ctx, ins[1])
    if idx.shape != updates.shape.lens or idx.ndim != data.shape.ndim:
        raise ctx.error(f"indices {list(idx.shape)} and updates {list(updates.shape.lens)} must share one shape of rank {data.shape.ndim}")
    where = list(np.indices(idx.shape, sparse=False))
    where[axis] = _in_range(ctx, idx, data.shape.lens[axis])
    try:
        dest = np.ravel_multi_index(tuple(w.reshape(-1) for w in where), data.shape.lens)
    except ValueError:
        raise ctx.error(f"indices {list(idx.shape)} exceed data {list(data.shape.lens)}") from None
    return scatter(ctx, data, updates, dest)


@onnx_op("ScatterND")
def parse_scatter_nd(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    data, updates = ins[0], ins[2]
    assert data is not None and updates is not None
    idx = _indices(ctx, ins[1])
    r = data.shape.ndim
    k = idx.shape[-1] if idx.ndim else r + 1
    if k > r or tuple(updates.shape.lens) != (*idx.shape[:-1], *data.shape.lens[k:]):
        raise ctx.error(f"updates {list(updates.shape.lens)} do not match indices {list(idx.shape)} "
                        f"into data {list(data.shape.lens)}")
    idx = _in_range(ctx, idx.reshape(-1, k), np.array(data.shape.lens[:k]))
    block = int(np.prod(data.shape.lens[k:], dtype=np.int64))
    starts = np.ravel_multi_index(tuple(idx.T), data.shape.lens[:k]) * block if k else np.zeros(len(idx), np.int64)
    dest = (starts[:, None] + np.arange(block)[None, :]).reshape(-1)
    return scatter(ctx, data, updates, dest)


@onnx_op("Col2Im")
def parse_col2im(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """Columns [N, C * prod(block), L] summed back into an image [N, C, *image]: a scatter-add
    whose destinations follow from the window geometry alone."""
    x = ins[0]
    assert x is not None
    image = [int(d) for d in ctx.require_const(ins[1], "the image shape").reshape(-1)]
    block = [int(d) for d in ctx.require_const(ins[2], "the block shape").reshape(-1)]
    k = len(image)
    strides, dilations = ctx.attr("strides", [1] * k), ctx.attr("dilations", [1] * k)
    pads = ctx.attr("pads", [0] * 2 * k)
    taps = int(np.prod(block))
    if len(block) != k or x.shape.ndim != 3 or x.shape.lens[1] % taps:
        raise ctx.error(f"input {list(x.shape.lens)} does not hold columns of blocks {block} for an image {image}")
    n, c = x.shape.lens[0], x.shape.lens[1] // taps
    counts = [(image[d] + pads[d] + pads[d + k] - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1 for d in range(k)]
    if int(np.prod(counts)) != x.shape.lens[2]:
        raise ctx.error(f"{x.shape.lens[2]} columns, but the window fits {counts} times")
    tap = np.indices(block).reshape(k, -1)  # [k, taps]
    where = np.indices(counts).reshape(k, -1)  # [k, L]
    pos = (where[:, None, :] * np.array(strides)[:, None, None] - np.array(pads[:k])[:, None, None]
           + tap[:, :, None] * np.array(dilations)[:, None, None])  # [k, taps, L]
    inside = np.all((pos >= 0) & (pos < np.array(image)[:, None, None]), axis=0)
    pixel = np.ravel_multi_index(tuple(np.clip(pos, 0, np.array(image)[:, None, None] - 1)), image)
    pixel = np.where(inside, pixel, -1)  # [taps, L]
    size = int(np.prod(image))
    batch = (np.arange(n)[:, None, None, None] * c + np.arange(c)[None, :, None, None]) * size
    dest = np.where(pixel[None, None] >= 0, batch + pixel[None, None], -1).reshape(-1)
    zeros = ctx.add(v.MultiBroadcast([n, c, *image]), [ctx.literal(np.zeros((), x.shape.dtype.numpy))])
    return scatter(ctx, zeros, x, dest, "add")


@onnx_op("TensorScatter")
def parse_tensor_scatter(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """A KV-cache write seen from the cache: position p along `axis` of sample b takes update
    row s = p - write_indices[b] (modulo the cache length when circular) where 0 <= s < the
    update's length, else keeps the past value. The write indices stay run-time values: s is
    int64 pointwise arithmetic, the row a GatherElements of the update at index s."""
    past, update = ins[0], ins[1]
    assert past is not None and update is not None
    r = past.shape.ndim
    axis = ctx.axis(ctx.attr("axis", -2), r)
    mode = ctx.check_attr("mode", ctx.attr("mode", "linear"), ["linear", "circular"])
    size, length = past.shape.lens[axis], update.shape.lens[axis]
    off_axis = [n for a, n in enumerate(past.shape.lens) if a != axis]
    if axis == 0 or update.shape.dtype != past.shape.dtype or length > size or \
            [n for a, n in enumerate(update.shape.lens) if a != axis] != off_axis or update.shape.ndim != r:
        raise ctx.error(f"update {update.shape.dtype} {list(update.shape.lens)} does not fit cache "
                        f"{past.shape.dtype} {list(past.shape.lens)} along axis {axis} (not the batch axis 0)")
    batch = past.shape.lens[0]
    written = ins[2] if len(ins) > 2 and ins[2] is not None else ctx.literal(np.zeros(batch, np.int64))
    if written.shape.lens != (batch,):
        raise ctx.error(f"write_indices {list(written.shape.lens)} must hold one index per sample ({batch})")
    start = ctx.add(v.Reshape([batch] + [1] * (r - 1)), [ctx.convert(written, DType.int64)])
    position = ctx.literal(np.arange(size, dtype=np.int64).reshape([size if a == axis else 1 for a in range(r)]))
    row = ctx.add(make_op("sub"), ctx.broadcast(position, start))
    if mode == "circular":
        row = ctx.add(make_op("mod"), ctx.broadcast(row, ctx.literal(np.array(size, np.int64))))
    inside = ctx.add(make_op("logical_and"), [
        ctx.add(make_op("greater_or_equal"), ctx.broadcast(row, ctx.literal(np.array(0, np.int64)))),
        ctx.add(make_op("less"), ctx.broadcast(row, ctx.literal(np.array(length, np.int64))))])
    safe = ctx.add(pw.Where(), ctx.broadcast(inside, row, ctx.literal(np.array(0, np.int64))))
    taken = ctx.add(GatherElements(axis), [update, ctx.add(v.MultiBroadcast(past.shape.lens), [safe])])
    return ctx.add(pw.Where(), ctx.broadcast(inside, taken, past))


@onnx_op("MaxUnpool")
def parse_max_unpool(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """X scattered into zeros at its flat indices I (over the whole output, as MaxPool's Indices
    count them), the output's shape the pooling's inverse. Like the other scatters it needs the
    indices at import; a later write to the same element wins, as in ONNX Runtime. An
    output_shape other than that shape is refused: ONNX's reference pads the unpooled result to
    it, ONNX Runtime indexes the larger output, and the two disagree."""
    x = ins[0]
    assert x is not None
    k = x.shape.ndim - 2
    kernel = list(ctx.attr("kernel_shape", []))
    strides, pads = list(ctx.attr("strides", [1] * k)), list(ctx.attr("pads", [0] * 2 * k))
    if k < 1 or len(kernel) != k or len(strides) != k or len(pads) != 2 * k:
        raise ctx.error(f"kernel_shape {kernel}, strides {strides} and pads {pads} do not fit input {list(x.shape.lens)}")
    shape = [*x.shape.lens[:2], *((n - 1) * s - pads[d] - pads[d + k] + kk for d, (n, s, kk)
                                  in enumerate(zip(x.shape.lens[2:], strides, kernel)))]
    if len(ins) > 2 and ins[2] is not None:
        given = [int(d) for d in ctx.require_const(ins[2], "output_shape").reshape(-1)]
        if given != shape:
            raise ctx.error(f"output_shape {given} other than the unpooled shape {shape} is not supported "
                            "(ONNX's reference pads the unpooled result, ONNX Runtime indexes the larger output)")
    idx = _indices(ctx, ins[1])
    total = int(np.prod(shape))
    if len(shape) != x.shape.ndim or idx.shape != x.shape.lens or (idx.size and (idx.min() < 0 or idx.max() >= total)):
        raise ctx.error(f"indices {list(idx.shape)} must match X {list(x.shape.lens)} and lie in an output of {shape}")
    zeros = ctx.add(v.MultiBroadcast(shape), [ctx.literal(np.zeros((), x.shape.dtype.numpy))])
    return scatter(ctx, zeros, x, idx.reshape(-1), reduction="none")
