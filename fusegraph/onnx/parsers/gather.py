"""Parsers of the element-wise gathers: GatherElements and GatherND.

Indices known at import are checked against the data's lengths there, so a bad model is refused
naming the node instead of failing at run time; constant data with constant indices folds.
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.program import Instruction
from fusegraph.ops.gather import GatherElements, GatherND
from fusegraph.onnx.context import ImportContext, onnx_op


def _check_range(ctx: ImportContext, values: np.ndarray | None, lens: np.ndarray | int, what: str) -> None:
    if values is not None and values.size and (np.any(values < -lens) or np.any(values >= lens)):
        raise ctx.error(f"{what} index out of range for lengths {np.asarray(lens).tolist()}")


@onnx_op("GatherElements")
def parse_gather_elements(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    data, idx = ins[0], ins[1]
    assert data is not None and idx is not None
    axis = ctx.axis(ctx.attr("axis", 0), data.shape.ndim)
    _check_range(ctx, ctx.const(idx), data.shape.lens[axis], f"axis {axis}")
    return ctx.add(GatherElements(axis), [data, idx])


@onnx_op("GatherND")
def parse_gather_nd(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    data, idx = ins[0], ins[1]
    assert data is not None and idx is not None
    b = ctx.attr("batch_dims", 0)
    k = idx.shape.lens[-1] if idx.shape.ndim else 0
    if idx.shape.ndim and 0 <= b and b + k <= data.shape.ndim:
        _check_range(ctx, ctx.const(idx), np.array(data.shape.lens[b:b + k]), "an")
    return ctx.add(GatherND(b), [data, idx])
