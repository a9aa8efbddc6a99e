"""Parsers of linear quantization: QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear,
as float32 arithmetic with rounding half to even and saturation to the integer type.

Scale and zero point are a scalar (per tensor), a vector along `axis` (per channel) or, with
`block_size`, a tensor of the input's rank whose `axis` holds one value per block; the last
two are brought to the input's shape by views (a block value repeated `block_size` times).
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction
from fusegraph.ops import make_op
from fusegraph.ops import pointwise as pw
from fusegraph.ops import views as v
from fusegraph.onnx.context import ImportContext, onnx_dtype, onnx_op
from fusegraph.onnx.parsers.elementwise import binary


def _spread(ctx: ImportContext, p: Instruction, x: Instruction) -> Instruction:
    """A scale or zero point laid out like `x` (see the module docstring)."""
    r = x.shape.ndim
    if p.shape.elements == 1 and not ctx.attr("block_size", 0):
        return ctx.add(v.Reshape([]), [p]) if p.shape.ndim else p
    a = ctx.axis(ctx.attr("axis", 1), r)
    n = x.shape.lens[a]
    block = ctx.attr("block_size", 0)
    if not block:
        if p.shape.lens != (n,):
            raise ctx.error(f"a per-axis scale or zero point needs shape [{n}], got {list(p.shape.lens)}")
        return ctx.add(v.Reshape([n if d == a else 1 for d in range(r)]), [p])
    blocks = -(-n // block)
    want = tuple(blocks if d == a else x.shape.lens[d] for d in range(r))
    if p.shape.lens != want:
        raise ctx.error(f"a blocked scale or zero point needs shape {list(want)}, got {list(p.shape.lens)}")
    lens = [*want[:a + 1], block, *want[a + 1:]]
    repeated = ctx.add(v.MultiBroadcast(lens), [ctx.add(v.Unsqueeze([a + 1]), [p])])
    joined = ctx.add(v.Reshape([*want[:a], blocks * block, *want[a + 1:]]), [repeated])
    return ctx.add(v.Slice([a], [0], [n]), [joined]) if blocks * block != n else joined


def quantize(ctx: ImportContext, x: Instruction, scale: Instruction, zero: Instruction | None,
             target: DType) -> Instruction:
    """saturate(round(x / scale) + zero) in `target`, computed in float32."""
    f32 = DType.float32
    q = ctx.add(make_op("round"), [binary(ctx, "div", ctx.convert(x, f32), ctx.convert(scale, f32))])
    return saturate(ctx, q, zero, target)


def saturate(ctx: ImportContext, q: Instruction, zero: Instruction | None, target: DType) -> Instruction:
    """q + zero (float32, already rounded) clipped to `target`'s range and converted to it."""
    if zero is not None:
        q = binary(ctx, "add", q, ctx.convert(zero, DType.float32))
    info = np.iinfo(target.numpy)
    lo, hi = (ctx.literal(np.array(b, np.float32)) for b in (info.min, info.max))
    return ctx.convert(ctx.add(pw.Clip(), ctx.broadcast(q, lo, hi)), target)


def _target(ctx: ImportContext, zero: Instruction | None) -> DType:
    if ctx.attr("output_dtype", 0):
        target = onnx_dtype(ctx.attr("output_dtype"), ctx.where)
    else:
        target = zero.shape.dtype if zero is not None else DType.uint8
    if not target.is_integer:
        raise ctx.error(f"quantizing to {target} is not supported (integer types only)")
    if ctx.attr("precision", 0):
        raise ctx.error("attribute precision is not supported")
    return target


@onnx_op("QuantizeLinear")
def parse_quantize_linear(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x, scale = ins[0], ins[1]
    assert x is not None and scale is not None
    zero = ins[2] if len(ins) > 2 else None
    target = _target(ctx, zero)
    return quantize(ctx, x, _spread(ctx, scale, x), _spread(ctx, zero, x) if zero is not None else None, target)


@onnx_op("DequantizeLinear")
def parse_dequantize_linear(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """(x - zero) * scale in float32, returned in the scale's type."""
    x, scale = ins[0], ins[1]
    assert x is not None and scale is not None
    zero = ins[2] if len(ins) > 2 else None
    f32 = DType.float32
    y = ctx.convert(x, f32)
    if zero is not None:
        y = binary(ctx, "sub", y, ctx.convert(_spread(ctx, zero, x), f32))
    out = binary(ctx, "mul", y, ctx.convert(_spread(ctx, scale, x), f32))
    dtype = onnx_dtype(ctx.attr("output_dtype"), ctx.where) if ctx.attr("output_dtype", 0) else scale.shape.dtype
    return ctx.convert(out, dtype)


@onnx_op("DynamicQuantizeLinear")
def parse_dynamic_quantize_linear(ctx: ImportContext, ins: list[Instruction | None]) -> list[Instruction]:
    """uint8 quantization over the range of x widened to include 0 (ONNX's definition)."""
    x = ins[0]
    assert x is not None
    f32 = DType.float32
    xf = ctx.convert(x, f32)
    every = range(x.shape.ndim)
    zero = ctx.literal(np.array(0, np.float32))
    lo = binary(ctx, "min", ctx.add(v.Reshape([]), [ctx.add(make_op("reduce_min", axes=every), [xf])]), zero)
    hi = binary(ctx, "max", ctx.add(v.Reshape([]), [ctx.add(make_op("reduce_max", axes=every), [xf])]), zero)
    scale = binary(ctx, "div", binary(ctx, "sub", hi, lo), ctx.literal(np.array(255, np.float32)))
    point = quantize(ctx, ctx.add(make_op("neg"), [lo]), scale, None, DType.uint8)
    return [quantize(ctx, x, scale, point, DType.uint8), scale, point]
