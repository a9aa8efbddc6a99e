"""The index map of each view instruction (and of resizes that are views in disguise)."""

from __future__ import annotations

import numpy as np

from fusegraph.ir.index_expr import Const
from fusegraph.ir.index_map import (IndexMap, broadcast_map, flatten_map, reshape_map, slice_map, squeeze_map,
                                    transpose_map, unsqueeze_map)
from fusegraph.ir.program import Instruction


def view_input_map(ins: Instruction) -> IndexMap | None:
    """The map from an index of `ins`'s output to the index of its input it reads, or None
    when `ins` is not a view (or has an empty dimension, which needs no map)."""
    if ins.shape.elements == 0 or not ins.inputs or ins.inputs[0].shape.elements == 0:
        return None
    op, a = ins.op.name, ins.op.attrs
    src = ins.inputs[0].shape.lens
    if op == "reshape":
        return reshape_map(src, ins.shape.lens)
    if op == "transpose":
        return transpose_map(src, a["permutation"])
    if op == "multibroadcast":
        return broadcast_map(src, ins.shape.lens)
    if op == "slice":
        return slice_map(src, a["starts"], a["ends"], a["axes"], a["steps"])
    if op == "squeeze":
        return squeeze_map(src, a["axes"])
    if op == "unsqueeze":
        return unsqueeze_map(src, a["axes"])
    if op == "flatten":
        return flatten_map(src, a["axis"])
    if op == "resize":
        return _nearest_resize_map(ins)
    return None


def _nearest_resize_map(ins: Instruction) -> IndexMap | None:
    """A nearest-neighbour resize by integer factors reads input index `o // k`: a view."""
    op = ins.op
    if op.attrs["mode"] != "nearest":
        return None
    src = ins.inputs[0].shape.lens
    out_lens = ins.shape.lens
    vars_ = reshape_map(out_lens, out_lens).out_vars
    exprs = []
    for axis, (n, o) in enumerate(zip(src, out_lens)):
        picks = op._nearest(op.source_coords(axis, n), n) if (o != n or op.scales[axis] != 1.0) else np.arange(n)  # type: ignore[attr-defined]
        if o % n == 0 and np.array_equal(picks, np.arange(o) // (o // n)):
            exprs.append(vars_[axis] // (o // n))
        elif n == 1:
            exprs.append(Const(0))
        else:
            return None
    return IndexMap(vars_, exprs, src)
