"""Parsers of the integer products: MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv.

The zero points are subtracted and the product runs in float32 on the GEMM template; integer
operands of up to 8 bits and the sizes models use keep every partial sum below 2^24, where
float32 is exact, so the int32 result is ONNX's. The QLinear forms then requantize the way
ONNX Runtime does: round(acc * (a_scale * b_scale / y_scale)) + y_zero_point, saturated.
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction
from fusegraph.ops import make_op
from fusegraph.ops import views as v
from fusegraph.onnx.context import ImportContext, onnx_op
from fusegraph.onnx.parsers.elementwise import binary
from fusegraph.onnx.parsers.nn import matmul, parse_conv
from fusegraph.onnx.parsers.quantize import saturate

F32 = DType.float32


def _shifted(ctx: ImportContext, x: Instruction, zero: Instruction | None, axis: int | None = None) -> Instruction:
    """x - zero in float32; a per-row or per-channel zero point lies along `axis`."""
    xf = ctx.convert(x, F32)
    if zero is None:
        return xf
    z = ctx.convert(zero, F32)
    if z.shape.elements > 1 and axis is not None:
        z = ctx.add(v.Reshape([z.shape.elements if d == axis else 1 for d in range(x.shape.ndim)]), [z])
    elif z.shape.ndim:
        z = ctx.add(v.Reshape([]), [z]) if z.shape.elements == 1 else z
    return binary(ctx, "sub", xf, z)


def _arg(ins: list[Instruction | None], k: int) -> Instruction | None:
    return ins[k] if len(ins) > k else None


def _requantize(ctx: ImportContext, acc: Instruction, a_scale: Instruction, b_scale: Instruction,
                y_scale: Instruction, y_zero: Instruction | None, channel_axis: int | None) -> Instruction:
    b = ctx.convert(b_scale, F32)
    if b.shape.elements > 1 and channel_axis is not None:
        b = ctx.add(v.Reshape([b.shape.elements if d == channel_axis else 1 for d in range(acc.shape.ndim)]), [b])
    scale = binary(ctx, "div", binary(ctx, "mul", ctx.convert(a_scale, F32), b), ctx.convert(y_scale, F32))
    q = ctx.add(make_op("round"), [binary(ctx, "mul", acc, scale)])
    target = y_zero.shape.dtype if y_zero is not None else DType.uint8
    return saturate(ctx, q, y_zero, target)


@onnx_op("MatMulInteger")
def parse_matmul_integer(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    a, b = ins[0], ins[1]
    assert a is not None and b is not None
    product = matmul(ctx, _shifted(ctx, a, _arg(ins, 2), a.shape.ndim - 2), _shifted(ctx, b, _arg(ins, 3), b.shape.ndim - 1))
    return ctx.convert(product, DType.int32)


@onnx_op("QLinearMatMul")
def parse_qlinear_matmul(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    a, a_scale, a_zero, b, b_scale, b_zero, y_scale = ins[:7]
    assert a is not None and b is not None and a_scale is not None and b_scale is not None and y_scale is not None
    acc = matmul(ctx, _shifted(ctx, a, a_zero, a.shape.ndim - 2), _shifted(ctx, b, b_zero, b.shape.ndim - 1))
    return _requantize(ctx, acc, a_scale, b_scale, y_scale, _arg(ins, 7), acc.shape.ndim - 1)


@onnx_op("ConvInteger")
def parse_conv_integer(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    product = parse_conv(ctx, [_shifted(ctx, x, _arg(ins, 2)), _shifted(ctx, w, _arg(ins, 3), 0)])
    return ctx.convert(product, DType.int32)


@onnx_op("QLinearConv")
def parse_qlinear_conv(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x, x_scale, x_zero, w, w_scale, w_zero, y_scale = ins[:7]
    assert x is not None and w is not None and x_scale is not None and w_scale is not None and y_scale is not None
    bias = _arg(ins, 8)
    acc = parse_conv(ctx, [_shifted(ctx, x, x_zero), _shifted(ctx, w, w_zero, 0),
                           ctx.convert(bias, F32) if bias is not None else None])
    return _requantize(ctx, acc, x_scale, w_scale, y_scale, _arg(ins, 7), 1)
