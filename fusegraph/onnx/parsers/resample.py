"""Resizes that are not views, as gathers at constant positions with constant weights.

A nearest resize by integer factors is an index map (`Resize.input_map`) and stays one op that
fusion folds into loads. Every other resize is separable: along each resized axis the source
positions and tap weights depend on the shapes and attributes only, so the importer computes
them (with `Resize`'s own coordinate rules) and the axis becomes a weighted sum of Gathers by
constant indices: 1 tap (nearest), 2 (linear) or 4 (cubic). Gathers and pointwise ops fuse and
have GPU kernels, so every resize runs on both targets. Integer and half inputs are resampled
in float32 and converted back, as the reference rounds once.
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction
from fusegraph.ops.movement import Gather, Resize
from fusegraph.onnx.context import ImportContext
from fusegraph.onnx.parsers.elementwise import binary


def _taps(op: Resize, axis: int, n: int) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """(input index, weight) of each tap, per output position along `axis`."""
    c = op.source_coords(axis, n)
    if op.mode == "nearest":
        return [(op.nearest_index(c, n), None)]
    if op.mode == "linear":
        c = np.clip(c, 0, n - 1)
        i0 = np.floor(c).astype(np.int64)
        t = c - i0
        return [(i0, 1 - t), (np.minimum(i0 + 1, n - 1), t)]
    f = np.floor(c)
    w = op.cubic_weights(c - f)
    idx = f.astype(np.int64)[:, None] + np.arange(-1, 3)[None, :]
    if op.exclude_outside:
        w = np.where((idx >= 0) & (idx < n), w, 0.0)
        w = w / w.sum(axis=1, keepdims=True)
    idx = np.clip(idx, 0, n - 1)
    return [(idx[:, k], w[:, k]) for k in range(4)]


def resample(ctx: ImportContext, x: Instruction, op: Resize) -> Instruction:
    """`x` resized by `op`: the op itself when it is a view, else gathers (see the module)."""
    if x.shape.elements == 0 or op.input_map(x.shape.lens, op.out_lens) is not None:
        return ctx.add(op, [x])
    dtype = x.shape.dtype
    work = dtype if op.mode == "nearest" or dtype in (DType.float32, DType.float64) else DType.float32
    y = ctx.convert(x, work)
    r = x.shape.ndim
    for axis, n in enumerate(x.shape.lens):
        if op.out_lens[axis] == n and op.scales[axis] == 1.0:
            continue
        total = None
        for idx, w in _taps(op, axis, n):
            part = ctx.add(Gather(axis), [y, ctx.literal(idx.astype(np.int64))])
            if w is not None:
                weight = np.asarray(w, work.numpy).reshape([len(w) if d == axis else 1 for d in range(r)])
                part = binary(ctx, "mul", part, ctx.literal(weight))
            total = part if total is None else binary(ctx, "add", total, part)
        assert total is not None
        y = total
    return ctx.convert(y, dtype)
