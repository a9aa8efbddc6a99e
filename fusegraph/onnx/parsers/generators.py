"""Parsers of ops whose output depends only on shapes and attributes: EyeLike and the window
functions (HannWindow, HammingWindow, BlackmanWindow). Each becomes a literal at import."""

from __future__ import annotations

import numpy as np

from fusegraph.ir.program import Instruction
from fusegraph.ir.shape import MAX_ELEMENTS
from fusegraph.onnx.context import ImportContext, onnx_dtype, onnx_op


@onnx_op("EyeLike")
def parse_eye_like(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None
    if x.shape.ndim != 2:
        raise ctx.error(f"input must be 2-d, got {list(x.shape.lens)}")
    dtype = onnx_dtype(ctx.attr("dtype"), ctx.where) if ctx.has_attr("dtype") else x.shape.dtype
    rows, cols = x.shape.lens
    return ctx.literal(np.eye(rows, cols, ctx.attr("k", 0), dtype=dtype.numpy))


#: window -> cosine coefficients a_k of sum_k (-1)^k a_k cos(2 pi k n / N)
_WINDOWS = {"HannWindow": (0.5, 0.5), "HammingWindow": (25 / 46, 21 / 46), "BlackmanWindow": (0.42, 0.5, 0.08)}


@onnx_op(*_WINDOWS)
def parse_window(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    assert ctx.node is not None
    size = ctx.require_const(ins[0], "the window size").reshape(-1)
    if size.size != 1 or size.dtype.kind not in "iu" or not 0 <= int(size[0]) <= MAX_ELEMENTS:
        raise ctx.error(f"the size must be one non-negative integer, got {size.tolist()}")
    n = int(size[0])
    period = n if ctx.attr("periodic", 1) else n - 1
    t = 2 * np.pi * np.arange(n) / max(period, 1)
    w = sum((-1) ** k * a * np.cos(k * t) for k, a in enumerate(_WINDOWS[ctx.node.op_type]))
    dtype = onnx_dtype(ctx.attr("output_datatype", 1), ctx.where)
    return ctx.literal(np.asarray(w, np.float64).astype(dtype.numpy))
