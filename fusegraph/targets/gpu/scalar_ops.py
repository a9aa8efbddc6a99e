"""Triton spellings of the pointwise ops and of the element types.

The ops themselves (ops/pointwise.py) are target-neutral: a name, an arity, a NumPy reference.
This table says how Triton writes each one: an expression template over its operands (`{0}`,
`{1}`) and attributes (`{alpha}`), and the cases where the operands' types or values call for
other code (integer division truncates, libdevice's pow takes floats only, a square needs no
pow). Reductions fold with the same ops, so the table also spells folding a tile along an axis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from fusegraph.ir.dtypes import DType
from fusegraph.ops.base import Op
from fusegraph.targets.gpu.errors import CodegenError

TRITON_TYPES = {
    DType.float32: "tl.float32", DType.float16: "tl.float16", DType.bfloat16: "tl.bfloat16",
    DType.float64: "tl.float64", DType.int64: "tl.int64", DType.int32: "tl.int32", DType.int16: "tl.int16",
    DType.int8: "tl.int8", DType.uint8: "tl.uint8", DType.uint16: "tl.uint16", DType.uint32: "tl.uint32",
    DType.uint64: "tl.uint64", DType.bool: "tl.int1",
}


def compute_type(dtype: DType) -> DType:
    """Half and bf16 values are computed in fp32 inside a kernel and rounded when stored."""
    return DType.float32 if dtype in (DType.float16, DType.bfloat16) else dtype


def literal(v: Any) -> str:
    """A Python/Triton source literal for a value (infinities and NaN as `float('...')`)."""
    if isinstance(v, float):
        if math.isnan(v):
            return "float('nan')"
        if math.isinf(v):
            return "float('inf')" if v > 0 else "float('-inf')"
        return repr(v)
    return str(v)


@dataclass(frozen=True)
class Operands:
    """An op's operands as a special case sees them: their code, the first one's type (integer
    ops spell differently), the result type and the operands that are inlined constants."""

    codes: tuple[str, ...]
    first: DType
    out: DType
    constants: Mapping[str, float]


Case = Callable[[Op, Operands], "str | None"]  # the op's code, or None where the case does not apply


@dataclass
class Spelling:
    """How Triton writes one op. `infix` is a binary operator's symbol: the template is then
    `({0} infix {1})`, and a right-hand side of its own drops the parentheses. `across` folds a
    tile along an axis (`{0}` the tile, `{1}` the axis), for ops that combine reductions."""

    template: str = ""
    infix: str = ""
    across: str = ""
    cases: list[Case] = field(default_factory=list)


SPELLINGS: dict[str, Spelling] = {}


def spell(name: str, template: str = "", across: str = "") -> None:
    if name in SPELLINGS:
        raise ValueError(f"Triton spelling of {name!r} given twice")
    SPELLINGS[name] = Spelling(template, across=across)


def infix(name: str, symbol: str, across: str = "") -> None:
    spell(name, f"({{0}} {symbol} {{1}})", across)
    SPELLINGS[name].infix = symbol


def case(name: str) -> Callable[[Case], Case]:
    """Decorator: a special case of op `name`, tried before its template."""

    def deco(fn: Case) -> Case:
        _spelling(name).cases.append(fn)
        return fn

    return deco


def _spelling(name: str) -> Spelling:
    try:
        return SPELLINGS[name]
    except KeyError:
        raise CodegenError(f"the GPU target has no Triton spelling for op {name}") from None


def pointwise(op: Op, operands: Operands) -> str:
    """The Triton expression of pointwise op `op` applied to `operands`."""
    spelling = _spelling(op.name)
    for special in spelling.cases:
        code = special(op, operands)
        if code is not None:
            return code
    if not spelling.template:
        raise CodegenError(f"the GPU target has no Triton spelling for op {op.name} on {operands.first}")
    return spelling.template.format(*operands.codes, **{k: literal(v) for k, v in op.attrs.items()})


def binary_rhs(name: str, a: str, b: str) -> str:
    """Binary op `name` on float operands as a whole right-hand side (no outer parentheses)."""
    spelling = _spelling(name)
    return f"{a} {spelling.infix} {b}" if spelling.infix else spelling.template.format(a, b)


def fold_across(name: str, tile: str, axis: int) -> str:
    """`tile` folded along `axis` with op `name` (a reduction's combine)."""
    spelling = _spelling(name)
    if not spelling.across:
        raise CodegenError(f"the GPU target cannot fold a reduction with op {name}")
    return spelling.across.format(tile, axis)


infix("add", "+", "tl.sum({0}, {1})")
infix("sub", "-")
infix("mul", "*", "tl.reduce({0}, {1}, _prod_combine)")
infix("div", "/")
spell("pow", "libdevice.pow({0}, {1})")
spell("max", "tl.maximum({0}, {1})", "tl.max({0}, {1})")
spell("min", "tl.minimum({0}, {1})", "tl.min({0}, {1})")
infix("equal", "==")
infix("less", "<")
infix("greater", ">")
infix("less_or_equal", "<=")
infix("greater_or_equal", ">=")
infix("logical_and", "&")
infix("logical_or", "|")
infix("logical_xor", "^")
spell("not", "({0} == 0)")
spell("neg", "(-{0})")
spell("abs", "tl.abs({0})")
spell("exp", "tl.exp({0})")
spell("log", "tl.log({0})")
spell("sqrt", "tl.sqrt({0})")
spell("recip", "(1.0 / {0})")
spell("sigmoid", "tl.sigmoid({0})")
spell("tanh", "libdevice.tanh({0})")
spell("relu", "tl.maximum({0}, 0.0)")
spell("erf", "libdevice.erf({0})")
spell("floor", "tl.floor({0})")
spell("ceil", "tl.ceil({0})")
spell("round", "libdevice.rint({0})")
spell("sin", "tl.sin({0})")
spell("cos", "tl.cos({0})")
spell("sign", "tl.where({0} > 0, 1.0, tl.where({0} < 0, -1.0, 0.0))")
for _name in ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"):
    spell(_name, f"libdevice.{_name}({{0}})")
# log(1 + e^x) without overflow for large x
spell("softplus", "(tl.maximum({0}, 0.0) + libdevice.log1p(tl.exp(-tl.abs({0}))))")
spell("softsign", "({0} / (1.0 + tl.abs({0})))")
spell("isnan", "({0} != {0})")
# ONNX Mod: the remainder takes the divisor's sign (integers only); Fmod takes the dividend's (C fmod)
spell("mod", "tl.where((({0} % {1}) != 0) & ((({0} % {1}) < 0) != ({1} < 0)), ({0} % {1}) + {1}, {0} % {1})")
infix("fmod", "%")
infix("bitwise_and", "&")
infix("bitwise_or", "|")
infix("bitwise_xor", "^")
spell("bitwise_not", "(~{0})")
spell("bit_shift")  # an amount out of range needs a guard: its one case below
spell("where", "tl.where({0}, {1}, {2})")
spell("clip", "tl.minimum(tl.maximum({0}, {1}), {2})")
spell("leaky_relu", "tl.where({0} >= 0, {0}, {0} * {alpha})")
spell("hard_sigmoid", "tl.minimum(tl.maximum({0} * {alpha} + {beta}, 0.0), 1.0)")
spell("isinf", "(({0} == float('inf')) & {detect_positive} | ({0} == float('-inf')) & {detect_negative})")
spell("elu", "({gamma} * tl.where({0} > 0, {0}, {alpha} * (tl.exp({0}) - 1.0)))")
spell("celu", "(tl.maximum({0}, 0.0) + tl.minimum({alpha} * (tl.exp({0} / {alpha}) - 1.0), 0.0))")
spell("thresholded_relu", "tl.where({0} > {alpha}, {0}, 0.0)")
spell("shrink", "tl.where({0} < -{lambd}, {0} + {bias}, tl.where({0} > {lambd}, {0} - {bias}, 0.0))")
spell("hard_swish", "({0} * tl.minimum(tl.maximum({0} / 6.0 + 0.5, 0.0), 1.0))")
spell("convert")  # the cast comes from the result type: its one case below
spell("batch_norm", "(({0} - {3}) * ({1} / tl.sqrt({4} + {epsilon})) + {2})")


@case("convert")
def _convert(op: Op, x: Operands) -> str:
    if x.out == DType.bool:
        return f"({x.codes[0]} != 0)"
    return f"{x.codes[0]}.to({TRITON_TYPES[compute_type(x.out)]})"


spell("bitcast")  # the types come from the operand and the result: its one case below


@case("bitcast")
def _bitcast(op: Op, x: Operands) -> str:
    """Half types are computed in fp32: back to the stored type first (exact), reinterpreted,
    and the result widened again if it is a half type."""
    code = f"{x.codes[0]}.to({TRITON_TYPES[x.first]}).to({TRITON_TYPES[x.out]}, bitcast=True)"
    return code if compute_type(x.out) == x.out else f"{code}.to({TRITON_TYPES[compute_type(x.out)]})"


@case("div")
def _integer_div(op: Op, x: Operands) -> str | None:
    return f"({x.codes[0]} // {x.codes[1]})" if x.first.is_integer else None


@case("div")
def _rounded_div(op: Op, x: Operands) -> str | None:
    """Triton's `/` on fp32 is the GPU's approximate division (up to 2 ulp off), which is enough
    to flip a quantizer's round-half-to-even (DynamicQuantizeLinear's -2.5 / (5/255) lands on
    -127.5 instead of just above it); ONNX's Div is IEEE division, so fp32 divides correctly rounded.
    A constant divisor multiplies by its reciprocal where that loses nothing the result keeps:
    correctly rounded division costs a dozen instructions an element, which in a product's
    epilogue (GELU's x / sqrt(2) after fc1) is as much time as the product's own loop."""
    if x.first.is_integer or compute_type(x.out) != DType.float32:
        return None
    divisor = x.constants.get(x.codes[1])
    if divisor is not None and _reciprocal_suffices(divisor, x.out):
        return f"({x.codes[0]} * {literal(1.0 / divisor)})"
    return f"tl.math.div_rn({x.codes[0]}, {x.codes[1]})"


def _reciprocal_suffices(divisor: float, out: DType) -> bool:
    """A power of two's reciprocal is exact, so the product is the quotient; any other finite
    divisor's fp32 reciprocal puts the product within 1.5 ulp of the fp32 quotient, which a half
    or bf16 result (2^13 or 2^16 times coarser) rounds away except on exact ties."""
    if not math.isfinite(divisor) or divisor == 0.0:
        return False
    return math.frexp(divisor)[0] == 0.5 or out in (DType.float16, DType.bfloat16)


@case("relu")
def _integer_relu(op: Op, x: Operands) -> str | None:
    return f"tl.maximum({x.codes[0]}, 0)" if x.first.is_integer else None


@case("pow")
def _integer_pow(op: Op, x: Operands) -> str | None:
    """libdevice's pow is for floats; integers raise exactly in float64."""
    if not x.first.is_integer:
        return None
    return f"libdevice.pow({x.codes[0]}.to(tl.float64), {x.codes[1]}.to(tl.float64)).to({TRITON_TYPES[x.out]})"


@case("pow")
def _small_power(op: Op, x: Operands) -> str | None:
    """A constant exponent of 1 or 2 (a box size squared) needs no pow."""
    exponent = x.constants.get(x.codes[1])
    if exponent == 1.0:
        return x.codes[0]
    if exponent == 2.0:
        return f"({x.codes[0]} * {x.codes[0]})"
    return None


@case("bit_shift")
def _bit_shift(op: Op, x: Operands) -> str:
    """A shift by an amount outside [0, bits) is undefined in LLVM (and on the GPU) but defined
    by ONNX (the sign fill: -1 or 0), so such an amount is replaced before shifting."""
    a, b = x.codes
    bits = 8 * x.first.itemsize
    symbol = "<<" if op.direction == "left" else ">>"
    signed = x.first.numpy.kind == "i"
    in_range = f"(({b} >= 0) & ({b} < {bits}))" if signed else f"({b} < {bits})"
    if signed and op.direction == "right":  # an arithmetic shift by bits - 1 gives the sign fill
        return f"({a} >> tl.where({in_range}, {b}, {bits - 1}))"
    return f"tl.where({in_range}, {a} {symbol} tl.where({in_range}, {b}, 0), 0)"
