"""Resizes that are not views, as gathers at constant positions with constant weights.

A nearest resize by integer factors is an index map (`Resize.input_map`) and stays one op that
fusion folds into loads. Every other resize is separable: along each resized axis the source
positions and tap weights depend on the shapes and attributes only, so the importer takes
them from `Resize.taps` and the axis becomes a weighted sum of Gathers by constant indices:
1 tap (nearest), 2 (linear) or 4 (cubic), more where antialiasing widens the filter. Positions
a crop-and-resize reads outside the input then take the extrapolation value through a where()
against a constant mask per axis. Gathers and pointwise ops fuse and have GPU kernels, so
every resize runs on both targets. Integer and half inputs are resampled in float32 and
converted back, as the reference rounds once.
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction
from fusegraph.ops.movement import Gather, Resize
from fusegraph.ops.pointwise import Where
from fusegraph.onnx.context import ImportContext
from fusegraph.onnx.parsers.elementwise import binary


def _along(values: np.ndarray, axis: int, rank: int, dtype: DType) -> np.ndarray:
    """Per-position `values` shaped to broadcast along `axis` of a rank-`rank` tensor."""
    return np.asarray(values, dtype.numpy).reshape([len(values) if d == axis else 1 for d in range(rank)])


def resample(ctx: ImportContext, x: Instruction, op: Resize) -> Instruction:
    """`x` resized by `op`: the op itself when it is a view, else gathers (see the module)."""
    if x.shape.elements == 0 or op.input_map(x.shape.lens, op.out_lens) is not None:
        return ctx.add(op, [x])
    dtype = x.shape.dtype
    work = dtype if op.mode == "nearest" or dtype in (DType.float32, DType.float64) else DType.float32
    y = ctx.convert(x, work)
    r = x.shape.ndim
    for axis, n in enumerate(x.shape.lens):
        if not op.resizes(axis, n):
            continue
        total = None
        for idx, w in op.taps(axis, n):
            part = ctx.add(Gather(axis), [y, ctx.literal(idx.astype(np.int64))])
            if w is not None:
                part = binary(ctx, "mul", part, ctx.literal(_along(w, axis, r, work)))
            total = part if total is None else binary(ctx, "add", total, part)
        assert total is not None
        y = total
    fill = ctx.literal(np.array(op.extrapolation_value, work.numpy))
    for axis, n in enumerate(x.shape.lens):
        outside = op.outside(axis, n)
        if outside is not None and outside.any():
            y = ctx.add(Where(), ctx.broadcast(ctx.literal(_along(outside, axis, r, DType.bool)), fill, y))
    return ctx.convert(y, dtype)
