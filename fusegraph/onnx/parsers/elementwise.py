"""Parsers of ONNX elementwise ops: each maps to one pointwise op after broadcasting."""

from __future__ import annotations

import math

import numpy as np
import onnx

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction
from fusegraph.ops import pointwise as pw
from fusegraph.ops.base import is_float, make_op
from fusegraph.onnx.context import ImportContext, onnx_dtype, onnx_op, prod

_BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div",
    "Equal": "equal", "Less": "less", "Greater": "greater",
    "LessOrEqual": "less_or_equal", "GreaterOrEqual": "greater_or_equal",
    "And": "logical_and", "Or": "logical_or", "Xor": "logical_xor",
    "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor",
}
_UNARY = {
    "Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Reciprocal": "recip",
    "Sigmoid": "sigmoid", "Tanh": "tanh", "Relu": "relu", "Erf": "erf", "Floor": "floor", "Ceil": "ceil",
    "Round": "round", "Sin": "sin", "Cos": "cos", "Sign": "sign", "Not": "not", "HardSwish": "hard_swish",
    "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh",
    "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh", "Softplus": "softplus", "Softsign": "softsign",
    "IsNaN": "isnan", "BitwiseNot": "bitwise_not",
}
_VARIADIC = {"Sum": "add", "Max": "max", "Min": "min"}


def binary(ctx: ImportContext, name: str, a: Instruction, b: Instruction) -> Instruction:
    a, b = ctx.broadcast(a, b)
    return ctx.add(make_op(name), [a, b])


def _make_binary(op_type: str, name: str) -> None:
    @onnx_op(op_type)
    def parse(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
        a, b = ins[0], ins[1]
        assert a is not None and b is not None
        return binary(ctx, name, a, ctx.legacy_broadcast(a, b))


def _make_unary(op_type: str, name: str) -> None:
    @onnx_op(op_type)
    def parse(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
        return ctx.add(make_op(name), [ins[0]])  # type: ignore[list-item]


for _t, _n in _BINARY.items():
    _make_binary(_t, _n)
for _t, _n in _UNARY.items():
    _make_unary(_t, _n)


@onnx_op("Sum", "Max", "Min", "Mean")
def parse_variadic(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    xs = [x for x in ins if x is not None]
    if not xs:
        raise ctx.error("needs at least one input")
    name = _VARIADIC.get(ctx.node.op_type, "add")  # type: ignore[union-attr]
    out = xs[0]
    for x in xs[1:]:
        out = binary(ctx, name, out, x)
    if ctx.node.op_type == "Mean" and len(xs) > 1:  # type: ignore[union-attr]
        out = binary(ctx, "div", out, ctx.literal(np.array(len(xs), out.shape.dtype.numpy)))
    return out


@onnx_op("Pow")
def parse_pow(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """The result has the base's type. An integer base with a float exponent is raised in float64
    and truncated (2 ** 0.5 -> 1), as ONNX Runtime does; converting the exponent would give 2 ** 0."""
    base, exp = ins[0], ins[1]
    assert base is not None and exp is not None
    exp = ctx.legacy_broadcast(base, exp)
    if base.shape.dtype.is_integer and exp.shape.dtype.is_float:
        wide = binary(ctx, "pow", ctx.convert(base, DType.float64), ctx.convert(exp, DType.float64))
        return ctx.convert(wide, base.shape.dtype)
    return binary(ctx, "pow", base, ctx.convert(exp, base.shape.dtype))


@onnx_op("Where")
def parse_where(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    c, a, b = ctx.broadcast(*ins)  # type: ignore[arg-type]
    return ctx.add(pw.Where(), [c, a, b])


@onnx_op("Clip")
def parse_clip(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None
    dt = x.shape.dtype.numpy
    if ctx.opset < 11:
        lo_v, hi_v = ctx.attr("min", -np.inf), ctx.attr("max", np.inf)
        lo, hi = ctx.literal(np.array(lo_v).astype(dt)), ctx.literal(np.array(hi_v).astype(dt))
    else:
        lo = ins[1] if len(ins) > 1 and ins[1] is not None else None
        hi = ins[2] if len(ins) > 2 and ins[2] is not None else None
        lo = lo if lo is not None else ctx.literal(_lowest(dt))
        hi = hi if hi is not None else ctx.literal(_highest(dt))
    x, lo, hi = ctx.broadcast(x, lo, hi)
    return ctx.add(pw.Clip(), [x, lo, hi])


def _lowest(dt: np.dtype) -> np.ndarray:
    return np.array(-np.inf if is_float(dt) else np.iinfo(dt).min, dt)


def _highest(dt: np.dtype) -> np.ndarray:
    return np.array(np.inf if is_float(dt) else np.iinfo(dt).max, dt)


#: ONNX ops that are one pointwise op with float attributes: (op class, (attribute, default)...)
_WITH_ATTRIBUTES: dict[str, tuple[type, tuple[tuple[str, float], ...]]] = {
    "LeakyRelu": (pw.LeakyRelu, (("alpha", 0.01),)),
    "HardSigmoid": (pw.HardSigmoid, (("alpha", 0.2), ("beta", 0.5))),
    "Elu": (pw.Elu, (("alpha", 1.0),)),
    "Selu": (pw.Elu, (("alpha", 1.67326319217681884765625), ("gamma", 1.05070102214813232421875))),
    "Celu": (pw.Celu, (("alpha", 1.0),)),
    "ThresholdedRelu": (pw.ThresholdedRelu, (("alpha", 1.0),)),
    "Shrink": (pw.Shrink, (("bias", 0.0), ("lambd", 0.5))),
}


@onnx_op(*_WITH_ATTRIBUTES)
def parse_with_attributes(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    cls, attrs = _WITH_ATTRIBUTES[ctx.node.op_type]  # type: ignore[union-attr]
    return ctx.add(cls(*(ctx.attr(name, default) for name, default in attrs)), [ins[0]])  # type: ignore[list-item]


@onnx_op("IsInf")
def parse_isinf(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    op = pw.IsInf(bool(ctx.attr("detect_negative", 1)), bool(ctx.attr("detect_positive", 1)))
    return ctx.add(op, [ins[0]])  # type: ignore[list-item]


@onnx_op("Mod")
def parse_mod(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """fmod=0: the remainder takes the divisor's sign (floor division); fmod=1: the dividend's (C fmod).
    Before opset 28, fmod=0 was defined for integers only."""
    a = ins[0]
    assert a is not None
    fmod = ctx.attr("fmod", 0)
    if not fmod and not a.shape.dtype.is_integer and ctx.opset < 28:
        raise ctx.error(f"fmod=0 with {a.shape.dtype.numpy.name} inputs is not defined before opset 28 (use fmod=1)")
    return binary(ctx, "fmod" if fmod else "mod", a, ins[1])  # type: ignore[arg-type]


@onnx_op("BitShift")
def parse_bit_shift(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """Shifts x by y bits; signed types are defined from opset 28, unsigned ones from 11."""
    x, y = ins[0], ins[1]
    assert x is not None and y is not None
    direction = ctx.check_attr("direction", ctx.attr("direction"), ["LEFT", "RIGHT"])
    dtype = x.shape.dtype
    if np.issubdtype(dtype.numpy, np.signedinteger) and ctx.opset < 28:
        raise ctx.error(f"signed {dtype.numpy.name} inputs are not defined before opset 28 (unsigned only)")
    a, b = ctx.broadcast(x, y)
    return ctx.add(pw.BitShift(direction.lower()), [a, b])


def _scalar(ctx: ImportContext, x: Instruction, value: float) -> Instruction:
    return ctx.literal(np.array(value, x.shape.dtype.numpy))


@onnx_op("PRelu")
def parse_prelu(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """x < 0 ? x * slope : x, the slope broadcasting to x."""
    x, slope = ins[0], ins[1]
    assert x is not None and slope is not None
    negative = binary(ctx, "less", x, _scalar(ctx, x, 0))
    return ctx.add(pw.Where(), ctx.broadcast(negative, binary(ctx, "mul", x, slope), x))


@onnx_op("Gelu")
def parse_gelu(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """0.5 x (1 + erf(x / sqrt 2)), or its tanh approximation; pointwise fusion makes it one kernel."""
    x = ins[0]
    assert x is not None
    approximate = ctx.check_attr("approximate", ctx.attr("approximate", "none"), ["none", "tanh"])
    if approximate == "tanh":
        cube = binary(ctx, "mul", binary(ctx, "mul", x, x), x)
        inner = binary(ctx, "add", x, binary(ctx, "mul", cube, _scalar(ctx, x, 0.044715)))
        t = ctx.add(make_op("tanh"), [binary(ctx, "mul", inner, _scalar(ctx, x, math.sqrt(2 / math.pi)))])
    else:
        t = ctx.add(make_op("erf"), [binary(ctx, "mul", x, _scalar(ctx, x, 1 / math.sqrt(2)))])
    half_x = binary(ctx, "mul", x, _scalar(ctx, x, 0.5))
    return binary(ctx, "mul", half_x, binary(ctx, "add", t, _scalar(ctx, x, 1)))


@onnx_op("Mish")
def parse_mish(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None
    return binary(ctx, "mul", x, ctx.add(make_op("tanh"), [ctx.add(make_op("softplus"), [x])]))


@onnx_op("Swish")
def parse_swish(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None
    alpha = ctx.attr("alpha", 1.0)
    scaled = binary(ctx, "mul", x, _scalar(ctx, x, alpha)) if alpha != 1.0 else x
    return binary(ctx, "mul", x, ctx.add(make_op("sigmoid"), [scaled]))


@onnx_op("BitCast")
def parse_bitcast(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """Same-size reinterpretation only; bool stores one byte per value, so bool <-> uint8 and
    int8 reinterpret as a conversion (ONNX Runtime reads a nonzero byte as true)."""
    x = ins[0]
    assert x is not None
    target = onnx_dtype(ctx.attr("to", 0), ctx.where)
    source = x.shape.dtype
    if source == target:
        return x
    if DType.bool in (source, target) and {source, target} <= {DType.bool, DType.uint8, DType.int8}:
        return ctx.convert(x, target)
    if source.itemsize != target.itemsize or DType.bool in (source, target):
        raise ctx.error(f"reinterpreting {source} as {target} changes the element size: not supported")
    return ctx.add(pw.BitCast(target), [x])


@onnx_op("CastLike")
def parse_cast_like(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x, like = ins[0], ins[1]
    assert x is not None and like is not None
    return ctx.convert(x, like.shape.dtype)


@onnx_op("Cast")
def parse_cast(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    to = ctx.attr("to")
    if to is None:
        raise ctx.error("missing attribute 'to'")
    if isinstance(to, str):  # before opset 6 the type is named: "FLOAT"
        if to not in onnx.TensorProto.DataType.keys():
            raise ctx.error(f"attribute to={to!r} names no element type")
        to = onnx.TensorProto.DataType.Value(to)
    x = ins[0]
    assert x is not None
    return ctx.convert(x, onnx_dtype(to, ctx.where))


@onnx_op("Identity", sequences=True)
def parse_identity(ctx: ImportContext, ins: list[Instruction | None]) -> list[Instruction | None]:
    return [ins[0]]  # in a list: the value may be a sequence or an optional


@onnx_op("Dropout")
def parse_dropout(ctx: ImportContext, ins: list[Instruction | None]) -> list[Instruction]:
    """Inference mode only (or training with ratio 0, which drops nothing): the data passes
    through and the mask is all true. Before opset 7 `is_test=1` asks for inference mode."""
    x = ins[0]
    assert x is not None
    if ctx.opset < 7 and not ctx.attr("is_test", 0):
        raise ctx.error("is_test=0 (training: drops elements at random) is not supported "
                        "(fusegraph compiles for inference; export with is_test=1)")
    training = ctx.require_const(ins[2], "training_mode") if len(ins) > 2 and ins[2] is not None else None
    if training is not None and bool(training) and not (
            len(ins) > 1 and ins[1] is not None and float(ctx.require_const(ins[1], "ratio")) == 0.0):
        raise ctx.error("training_mode=true is not supported (fusegraph compiles for inference), "
                        "except with ratio 0, which drops nothing")
    mask = ctx.add(make_op("multibroadcast", out_lens=x.shape.lens), [ctx.literal(np.array(True))])
    return [x, mask]
