"""Pointwise operators: `out[i] = f(a[i], b[i], ...)` with all inputs of the output's lens.

Broadcasting is never implicit: the ONNX importer inserts `multibroadcast` views, so every
pointwise op sees one index space and fusion can treat any chain of views as an index map.
Each op gives a NumPy reference and a scalar template (`{0}`, `{1}` are its operands) that the
GPU code generator turns into Triton code.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.shape import Shape
from fusegraph.ops.base import Op, OpKind, is_float, register, require


class PointwiseOp(Op):
    """Base of all pointwise ops; subclasses give `arity`, `fn` and `template`."""

    kind = OpKind.POINTWISE
    arity: int = 1
    template: str = ""
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

    def scalar(self, *operands: str) -> str:
        """The op applied to operand source texts, as a Triton expression."""
        return self.template.format(*operands, **{k: literal(v) for k, v in self.attrs.items()})


def literal(v: Any) -> str:
    """A Python/Triton source literal for an attribute value (infinities as `float('inf')`)."""
    if isinstance(v, float):
        if math.isinf(v):
            return "float('inf')" if v > 0 else "float('-inf')"
        return repr(v)
    return str(v)


def _define(name: str, arity: int, fn: Callable[..., Any], template: str, result_bool: bool = False,
            right_identity: float | None = None) -> type[PointwiseOp]:
    cls = type(
        "Pw_" + name,
        (PointwiseOp,),
        {"name": name, "arity": arity, "template": template, "result_bool": result_bool,
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


_define("add", 2, np.add, "({0} + {1})", right_identity=0)
_define("sub", 2, np.subtract, "({0} - {1})", right_identity=0)
_define("mul", 2, np.multiply, "({0} * {1})", right_identity=1)
_define("div", 2, _int_div, "({0} / {1})", right_identity=1)
_define("pow", 2, _pow, "libdevice.pow({0}, {1})")
_define("max", 2, np.maximum, "tl.maximum({0}, {1})")
_define("min", 2, np.minimum, "tl.minimum({0}, {1})")
_define("equal", 2, np.equal, "({0} == {1})", True)
_define("less", 2, np.less, "({0} < {1})", True)
_define("greater", 2, np.greater, "({0} > {1})", True)
_define("less_or_equal", 2, np.less_equal, "({0} <= {1})", True)
_define("greater_or_equal", 2, np.greater_equal, "({0} >= {1})", True)
_define("logical_and", 2, np.logical_and, "({0} & {1})", True)
_define("logical_or", 2, np.logical_or, "({0} | {1})", True)
_define("logical_xor", 2, np.logical_xor, "({0} ^ {1})", True)
_define("not", 1, np.logical_not, "({0} == 0)", True)
_define("neg", 1, np.negative, "(-{0})")
_define("abs", 1, np.abs, "tl.abs({0})")
_define("exp", 1, np.exp, "tl.exp({0})")
_define("log", 1, np.log, "tl.log({0})")
_define("sqrt", 1, np.sqrt, "tl.sqrt({0})")
_define("recip", 1, np.reciprocal, "(1.0 / {0})")
_define("sigmoid", 1, _sigmoid, "tl.sigmoid({0})")
_define("tanh", 1, np.tanh, "libdevice.tanh({0})")
_define("relu", 1, lambda a: np.maximum(a, np.zeros((), a.dtype)), "tl.maximum({0}, 0.0)")
_define("erf", 1, _erf, "libdevice.erf({0})")
_define("floor", 1, np.floor, "tl.floor({0})")
_define("ceil", 1, np.ceil, "tl.ceil({0})")
_define("round", 1, _round_half_even, "libdevice.rint({0})")
_define("sin", 1, np.sin, "tl.sin({0})")
_define("cos", 1, np.cos, "tl.cos({0})")
_define("sign", 1, np.sign, "tl.where({0} > 0, 1.0, tl.where({0} < 0, -1.0, 0.0))")
_define("tan", 1, np.tan, "libdevice.tan({0})")
_define("asin", 1, np.arcsin, "libdevice.asin({0})")
_define("acos", 1, np.arccos, "libdevice.acos({0})")
_define("atan", 1, np.arctan, "libdevice.atan({0})")
_define("sinh", 1, np.sinh, "libdevice.sinh({0})")
_define("cosh", 1, np.cosh, "libdevice.cosh({0})")
_define("asinh", 1, np.arcsinh, "libdevice.asinh({0})")
_define("acosh", 1, np.arccosh, "libdevice.acosh({0})")
_define("atanh", 1, np.arctanh, "libdevice.atanh({0})")
# log(1 + e^x) without overflow for large x
_define("softplus", 1, lambda a: np.logaddexp(a.dtype.type(0), a),
        "(tl.maximum({0}, 0.0) + libdevice.log1p(tl.exp(-tl.abs({0}))))")
_define("softsign", 1, lambda a: a / (a.dtype.type(1) + np.abs(a)), "({0} / (1.0 + tl.abs({0})))")
_define("isnan", 1, np.isnan, "({0} != {0})", True)
# ONNX Mod: the remainder takes the divisor's sign (integers only); Fmod takes the dividend's (C fmod)
_define("mod", 2, np.mod, "tl.where((({0} % {1}) != 0) & ((({0} % {1}) < 0) != ({1} < 0)), ({0} % {1}) + {1}, {0} % {1})")
_define("fmod", 2, np.fmod, "({0} % {1})")


@register
class Where(PointwiseOp):
    """`cond ? a : b`; the condition is bool, the other two share the result type."""

    name = "where"
    arity = 3
    template = "tl.where({0}, {1}, {2})"

    def type_operands(self) -> slice:
        return slice(1, None)

    def fn(self, c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.where(c, a, b)


@register
class Clip(PointwiseOp):
    """`min(max(x, lo), hi)` with lo and hi as operands (ONNX passes them as inputs)."""

    name = "clip"
    arity = 3
    template = "tl.minimum(tl.maximum({0}, {1}), {2})"

    def fn(self, x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        return np.minimum(np.maximum(x, lo), hi)


@register
class LeakyRelu(PointwiseOp):
    name = "leaky_relu"
    template = "tl.where({0} >= 0, {0}, {0} * {alpha})"

    def __init__(self, alpha: float = 0.01) -> None:
        super().__init__(alpha=float(alpha))

    def fn(self, x: np.ndarray) -> np.ndarray:
        return np.where(x >= 0, x, x * x.dtype.type(self.alpha))


@register
class HardSigmoid(PointwiseOp):
    name = "hard_sigmoid"
    template = "tl.minimum(tl.maximum({0} * {alpha} + {beta}, 0.0), 1.0)"

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
    template = "(({0} == float('inf')) & {detect_positive} | ({0} == float('-inf')) & {detect_negative})"

    def __init__(self, detect_negative: bool = True, detect_positive: bool = True) -> None:
        super().__init__(detect_negative=bool(detect_negative), detect_positive=bool(detect_positive))

    def fn(self, x: np.ndarray) -> np.ndarray:
        return (np.isposinf(x) & self.detect_positive) | (np.isneginf(x) & self.detect_negative)


@register
class Elu(PointwiseOp):
    """x for x > 0, else alpha * (e^x - 1); scaled by `gamma` it is also Selu."""

    name = "elu"
    template = "({gamma} * tl.where({0} > 0, {0}, {alpha} * (tl.exp({0}) - 1.0)))"

    def __init__(self, alpha: float = 1.0, gamma: float = 1.0) -> None:
        super().__init__(alpha=float(alpha), gamma=float(gamma))

    def fn(self, x: np.ndarray) -> np.ndarray:
        t = x.dtype.type
        return t(self.gamma) * np.where(x > 0, x, t(self.alpha) * np.expm1(x))


@register
class Celu(PointwiseOp):
    """max(0, x) + min(0, alpha * (e^(x/alpha) - 1))."""

    name = "celu"
    template = "(tl.maximum({0}, 0.0) + tl.minimum({alpha} * (tl.exp({0} / {alpha}) - 1.0), 0.0))"

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__(alpha=float(alpha))

    def fn(self, x: np.ndarray) -> np.ndarray:
        a = x.dtype.type(self.alpha)
        return np.maximum(x, 0) + np.minimum(a * np.expm1(x / a), 0)


@register
class ThresholdedRelu(PointwiseOp):
    name = "thresholded_relu"
    template = "tl.where({0} > {alpha}, {0}, 0.0)"

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__(alpha=float(alpha))

    def fn(self, x: np.ndarray) -> np.ndarray:
        return np.where(x > x.dtype.type(self.alpha), x, x.dtype.type(0))


@register
class Shrink(PointwiseOp):
    """x + bias below -lambd, x - bias above lambd, 0 between."""

    name = "shrink"
    template = "tl.where({0} < -{lambd}, {0} + {bias}, tl.where({0} > {lambd}, {0} - {bias}, 0.0))"

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
    template = "({0} * tl.minimum(tl.maximum({0} / 6.0 + 0.5, 0.0), 1.0))"

    def fn(self, x: np.ndarray) -> np.ndarray:
        t = x.dtype.type
        return x * np.clip(x / t(6) + t(0.5), t(0), t(1))


@register
class Convert(PointwiseOp):
    """Element type conversion (ONNX Cast)."""

    name = "convert"
    converts_type = True
    template = "{0}"  # the code generator emits the cast itself, from the target dtype

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
class BatchNorm(PointwiseOp):
    """Inference batch normalization on operands already broadcast to x: (x-mean)/sqrt(var+eps)*scale+bias.

    Kept as one op (rather than five) so the canonicalizer can fold it into a preceding convolution.
    """

    name = "batch_norm"
    short_name = "bn"
    arity = 5
    template = "(({0} - {3}) * ({1} / tl.sqrt({4} + {epsilon})) + {2})"

    def __init__(self, epsilon: float = 1e-5) -> None:
        super().__init__(epsilon=float(epsilon))

    def fn(self, x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
        t = x.dtype.type
        return (x - mean) * (scale / np.sqrt(var + t(self.epsilon))) + bias

