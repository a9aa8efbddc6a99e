"""Pointwise operators: `out[i] = f(a[i], b[i], ...)` with all inputs of the output's lens.

Broadcasting is never implicit: the ONNX importer inserts `multibroadcast` views, so every
pointwise op sees one index space and fusion can treat any chain of views as an index map.
Each op gives its arity, a NumPy reference and its type rule; how a target writes it (the GPU
target's Triton spellings: targets/gpu/scalar_ops.py) is the target's business.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.shape import Shape
from fusegraph.ops.base import Op, OpKind, is_float, register, require


class PointwiseOp(Op):
    """Base of all pointwise ops; subclasses give `arity` and `fn`."""

    kind = OpKind.POINTWISE
    arity: int = 1
    result_bool: bool = False  # comparisons and logic produce bool
    right_identity: float | None = None  # `x op c == x` for this constant c (add: 0, mul: 1)

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        require(len(inputs) == self.arity, f"expects {self.arity} inputs, got {len(inputs)}")
        lens = inputs[0].lens
        for s in inputs[1:]:
            require(s.lens == lens, f"operand lens differ: {list(lens)} vs {list(s.lens)}")
        return Shape.of(self.result_dtype([s.dtype for s in inputs]), lens)

    def result_dtype(self, dtypes: Sequence[DType]) -> DType:
        if self.result_bool:
            return DType.bool
        data = [d for d in dtypes[self.type_operands()]] if self.arity > 1 else list(dtypes)
        for d in data[1:]:
            require(d == data[0], f"operand types differ: {data[0]} vs {d}")
        return data[0]

    def type_operands(self) -> slice:
        """Which operands must share the result type (where: the last two)."""
        return slice(0, None)

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        out = np.asarray(self.fn(*args))
        want = self.compute_shape_dtype([a.dtype for a in args])
        return out.astype(want, copy=False)

    def compute_shape_dtype(self, np_dtypes: Sequence[np.dtype]) -> np.dtype:
        return self.result_dtype([DType.from_numpy(d) for d in np_dtypes]).numpy

    def fn(self, *args: np.ndarray) -> np.ndarray:  # pragma: no cover - overridden
        raise NotImplementedError


class IntegerOp(PointwiseOp):
    """A pointwise op on the two's complement bits of integers; other types are an error."""

    def result_dtype(self, dtypes: Sequence[DType]) -> DType:
        out = super().result_dtype(dtypes)
        require(out.is_integer, f"{self.name} takes integers, got {out}")
        return out


def _define(name: str, arity: int, fn: Callable[..., Any], result_bool: bool = False,
            right_identity: float | None = None, base: type[PointwiseOp] = PointwiseOp,
            algebra: str = "") -> type[PointwiseOp]:
    cls = type(
        "Pw_" + name,
        (base,),
        {"name": name, "arity": arity, "result_bool": result_bool, "algebra": algebra,
         "right_identity": right_identity, "fn": lambda self, *a: fn(*a)},
    )
    return register(cls)


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        # ONNX integer division truncates toward zero, like C.
        q = np.abs(a) // np.where(b == 0, 1, np.abs(b))
        return np.where((a < 0) != (b < 0), -q, q)
    return a / b


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return np.power(a.astype(np.int64), b.astype(np.int64)).astype(a.dtype)
    return np.power(a, b.astype(a.dtype))


def _erf(a: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(a.astype(np.float64)).astype(a.dtype)


def _sigmoid(a: np.ndarray) -> np.ndarray:
    x = a.astype(np.float64)
    return (np.exp(-np.logaddexp(0.0, -x))).astype(a.dtype)


def _round_half_even(a: np.ndarray) -> np.ndarray:
    return np.round(a)


_define("add", 2, np.add, right_identity=0, algebra="sum")
_define("sub", 2, np.subtract, right_identity=0)
_define("mul", 2, np.multiply, right_identity=1, algebra="product")
_define("div", 2, _int_div, right_identity=1, algebra="quotient")
_define("pow", 2, _pow)
_define("max", 2, np.maximum)
_define("min", 2, np.minimum)
_define("equal", 2, np.equal, True)
_define("less", 2, np.less, True)
_define("greater", 2, np.greater, True)
_define("less_or_equal", 2, np.less_equal, True)
_define("greater_or_equal", 2, np.greater_equal, True)
_define("logical_and", 2, np.logical_and, True)
_define("logical_or", 2, np.logical_or, True)
_define("logical_xor", 2, np.logical_xor, True)
_define("not", 1, np.logical_not, True)
_define("neg", 1, np.negative)
_define("abs", 1, np.abs)
_define("exp", 1, np.exp)
_define("log", 1, np.log)
_define("sqrt", 1, np.sqrt)
_define("recip", 1, np.reciprocal)
_define("sigmoid", 1, _sigmoid)
_define("tanh", 1, np.tanh)
_define("relu", 1, lambda a: np.maximum(a, np.zeros((), a.dtype)))
_define("erf", 1, _erf)
_define("floor", 1, np.floor)
_define("ceil", 1, np.ceil)
_define("round", 1, _round_half_even)
_define("sin", 1, np.sin)
_define("cos", 1, np.cos)
_define("sign", 1, np.sign)
_define("tan", 1, np.tan)
_define("asin", 1, np.arcsin)
_define("acos", 1, np.arccos)
_define("atan", 1, np.arctan)
_define("sinh", 1, np.sinh)
_define("cosh", 1, np.cosh)
_define("asinh", 1, np.arcsinh)
_define("acosh", 1, np.arccosh)
_define("atanh", 1, np.arctanh)
_define("softplus", 1, lambda a: np.logaddexp(a.dtype.type(0), a))
_define("softsign", 1, lambda a: a / (a.dtype.type(1) + np.abs(a)))
_define("isnan", 1, np.isnan, True, algebra="nan_test")
# ONNX Mod: the remainder takes the divisor's sign (integers only); Fmod takes the dividend's (C fmod)
_define("mod", 2, np.mod)
_define("fmod", 2, np.fmod)
_define("bitwise_and", 2, np.bitwise_and, base=IntegerOp)
_define("bitwise_or", 2, np.bitwise_or, right_identity=0, base=IntegerOp)
_define("bitwise_xor", 2, np.bitwise_xor, right_identity=0, base=IntegerOp)
_define("bitwise_not", 1, np.invert, base=IntegerOp)


@register
class BitShift(IntegerOp):
    """`x << y` or `x >> y` (arithmetic for signed x). A shift by a negative amount or by at
    least the bit width leaves only the sign fill: -1 for a right shift of a negative x, 0
    otherwise (ONNX's rule since opset 28, and what ONNX Runtime computes for unsigned x)."""

    name = "bit_shift"
    arity = 2
    right_identity = 0

    def __init__(self, direction: str = "left") -> None:
        require(direction in ("left", "right"), f"direction must be left or right, got {direction!r}")
        super().__init__(direction=direction)

    def fn(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        bits = 8 * x.dtype.itemsize
        in_range = (y >= 0) & (y < bits)
        amount = np.where(in_range, y, 0).astype(x.dtype)
        if self.direction == "right":
            fill = np.where(x < 0, -1, 0).astype(x.dtype)
            return np.where(in_range, np.right_shift(x, amount), fill)
        # shifted as unsigned: bits past the top one (the sign bit too) are dropped, never undefined
        unsigned = np.dtype(f"u{x.dtype.itemsize}")
        shifted = np.left_shift(x.view(unsigned), amount.view(unsigned)).view(x.dtype)
        return np.where(in_range, shifted, np.zeros((), x.dtype))


@register
class Where(PointwiseOp):
    """`cond ? a : b`; the condition is bool, the other two share the result type."""

    name = "where"
    arity = 3
    algebra = "select"

    def type_operands(self) -> slice:
        return slice(1, None)

    def fn(self, c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.where(c, a, b)


@register
class Clip(PointwiseOp):
    """`min(max(x, lo), hi)` with lo and hi as operands (ONNX passes them as inputs)."""

    name = "clip"
    arity = 3

    def fn(self, x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        return np.minimum(np.maximum(x, lo), hi)


@register
class LeakyRelu(PointwiseOp):
    name = "leaky_relu"

    def __init__(self, alpha: float = 0.01) -> None:
        super().__init__(alpha=float(alpha))

    def fn(self, x: np.ndarray) -> np.ndarray:
        return np.where(x >= 0, x, x * x.dtype.type(self.alpha))


@register
class HardSigmoid(PointwiseOp):
    name = "hard_sigmoid"

    def __init__(self, alpha: float = 0.2, beta: float = 0.5) -> None:
        super().__init__(alpha=float(alpha), beta=float(beta))

    def fn(self, x: np.ndarray) -> np.ndarray:
        t = x.dtype.type
        return np.clip(x * t(self.alpha) + t(self.beta), t(0), t(1))


@register
class IsInf(PointwiseOp):
    """Whether x is infinite; each sign can be switched off, as ONNX's attributes allow."""

    name = "isinf"
    result_bool = True

    def __init__(self, detect_negative: bool = True, detect_positive: bool = True) -> None:
        super().__init__(detect_negative=bool(detect_negative), detect_positive=bool(detect_positive))

    def fn(self, x: np.ndarray) -> np.ndarray:
        return (np.isposinf(x) & self.detect_positive) | (np.isneginf(x) & self.detect_negative)


@register
class Elu(PointwiseOp):
    """x for x > 0, else alpha * (e^x - 1); scaled by `gamma` it is also Selu."""

    name = "elu"

    def __init__(self, alpha: float = 1.0, gamma: float = 1.0) -> None:
        super().__init__(alpha=float(alpha), gamma=float(gamma))

    def fn(self, x: np.ndarray) -> np.ndarray:
        t = x.dtype.type
        return t(self.gamma) * np.where(x > 0, x, t(self.alpha) * np.expm1(x))


@register
class Celu(PointwiseOp):
    """max(0, x) + min(0, alpha * (e^(x/alpha) - 1))."""

    name = "celu"

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__(alpha=float(alpha))

    def fn(self, x: np.ndarray) -> np.ndarray:
        a = x.dtype.type(self.alpha)
        return np.maximum(x, 0) + np.minimum(a * np.expm1(x / a), 0)


@register
class ThresholdedRelu(PointwiseOp):
    name = "thresholded_relu"

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__(alpha=float(alpha))

    def fn(self, x: np.ndarray) -> np.ndarray:
        return np.where(x > x.dtype.type(self.alpha), x, x.dtype.type(0))


@register
class Shrink(PointwiseOp):
    """x + bias below -lambd, x - bias above lambd, 0 between."""

    name = "shrink"

    def __init__(self, bias: float = 0.0, lambd: float = 0.5) -> None:
        super().__init__(bias=float(bias), lambd=float(lambd))

    def fn(self, x: np.ndarray) -> np.ndarray:
        # compare and shift in float64 so integer inputs follow the float attributes, then cast back
        xf = x.astype(np.float64)
        out = np.where(xf < -self.lambd, xf + self.bias, np.where(xf > self.lambd, xf - self.bias, 0.0))
        return out.astype(x.dtype)


@register
class HardSwish(PointwiseOp):
    name = "hard_swish"

    def fn(self, x: np.ndarray) -> np.ndarray:
        t = x.dtype.type
        return x * np.clip(x / t(6) + t(0.5), t(0), t(1))


@register
class Convert(PointwiseOp):
    """Element type conversion (ONNX Cast)."""

    name = "convert"
    converts_type = True

    def __init__(self, target: DType | str) -> None:
        super().__init__(target=DType(target) if isinstance(target, str) else target)

    def result_dtype(self, dtypes: Sequence[DType]) -> DType:
        return self.attrs["target"]

    def fn(self, x: np.ndarray) -> np.ndarray:
        target = self.attrs["target"].numpy
        if np.issubdtype(target, np.integer) and is_float(x.dtype):
            with np.errstate(invalid="ignore"):
                return np.trunc(x).astype(target)
        return x.astype(target)


@register
class BitCast(PointwiseOp):
    """The same bits read as another element type of the same size (ONNX BitCast)."""

    name = "bitcast"

    def __init__(self, target: DType | str) -> None:
        super().__init__(target=DType(target) if isinstance(target, str) else target)

    def result_dtype(self, dtypes: Sequence[DType]) -> DType:
        target = self.attrs["target"]
        require(dtypes[0].itemsize == target.itemsize and DType.bool not in (dtypes[0], target),
                f"cannot reinterpret {dtypes[0]} as {target}: the sizes differ or one is bool")
        return target

    def fn(self, x: np.ndarray) -> np.ndarray:
        return x.copy().view(self.attrs["target"].numpy)  # a copy is contiguous and keeps 0-d values 0-d


@register
class BatchNorm(PointwiseOp):
    """Inference batch normalization on operands already broadcast to x: (x-mean)/sqrt(var+eps)*scale+bias.

    Kept as one op (rather than five) so the canonicalizer can fold it into a preceding convolution.
    """

    name = "batch_norm"
    short_name = "bn"
    arity = 5

    def __init__(self, epsilon: float = 1e-5) -> None:
        super().__init__(epsilon=float(epsilon))

    def fn(self, x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
        t = x.dtype.type
        return (x - mean) * (scale / np.sqrt(var + t(self.epsilon))) + bias

