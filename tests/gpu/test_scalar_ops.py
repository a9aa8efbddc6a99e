"""The Triton spellings of pointwise ops (targets/gpu/scalar_ops.py): every pointwise op has
one, the dtype and value cases win over the template, and a missing spelling names its op."""

from __future__ import annotations

import pytest

from fusegraph.ir.dtypes import DType
from fusegraph.ops.base import REGISTRY, OpKind, make_op
from fusegraph.ops.pointwise import PointwiseOp
from fusegraph.targets.gpu.errors import CodegenError
from fusegraph.targets.gpu.scalar_ops import SPELLINGS, Operands, binary_rhs, fold_across, pointwise


def operands(*codes: str, first: DType = DType.float32, out: DType = DType.float32, constants=None) -> Operands:
    return Operands(codes, first, out, constants or {})


def test_every_pointwise_op_has_a_spelling():
    names = {cls.name for cls in REGISTRY.values() if cls.kind == OpKind.POINTWISE}
    assert names <= set(SPELLINGS), sorted(names - set(SPELLINGS))


def test_templates_take_operands_and_attributes():
    assert pointwise(make_op("add"), operands("a", "b")) == "(a + b)"
    assert pointwise(make_op("leaky_relu", alpha=0.5), operands("x")) == "tl.where(x >= 0, x, x * 0.5)"


def test_integer_cases_win_over_the_template():
    ints = {"first": DType.int32, "out": DType.int32}
    assert pointwise(make_op("div"), operands("a", "b", **ints)) == "(a // b)"
    assert pointwise(make_op("relu"), operands("a", **ints)) == "tl.maximum(a, 0)"
    assert pointwise(make_op("pow"), operands("a", "b", **ints)) == \
        "libdevice.pow(a.to(tl.float64), b.to(tl.float64)).to(tl.int32)"


def test_float_division_is_correctly_rounded_where_triton_would_approximate():
    """The GPU's fp32 `/` is up to 2 ulp off (a quantizer's half-way case flips); fp64's is exact."""
    assert pointwise(make_op("div"), operands("a", "b")) == "tl.math.div_rn(a, b)"
    assert pointwise(make_op("div"), operands("a", "b", first=DType.float16, out=DType.float16)) == "tl.math.div_rn(a, b)"
    assert pointwise(make_op("div"), operands("a", "b", first=DType.float64, out=DType.float64)) == "(a / b)"


def test_a_constant_divisor_multiplies_where_the_result_keeps_no_difference():
    """A power of two's reciprocal is exact in any type; other constants only for half results."""
    div = make_op("div")
    half = {"first": DType.float16, "out": DType.float16}
    assert pointwise(div, operands("a", "c1", constants={"c1": 4.0})) == "(a * 0.25)"
    assert pointwise(div, operands("a", "c1", constants={"c1": 1.4140625})) == "tl.math.div_rn(a, c1)"
    assert pointwise(div, operands("a", "c1", constants={"c1": 1.4140625}, **half)) == f"(a * {1 / 1.4140625!r})"
    assert pointwise(div, operands("a", "c1", constants={"c1": 3.0}, first=DType.bfloat16, out=DType.bfloat16)) == \
        f"(a * {1 / 3.0!r})"
    for bad in (0.0, float("inf"), float("nan")):
        assert pointwise(div, operands("a", "c1", constants={"c1": bad}, **half)) == "tl.math.div_rn(a, c1)"


def test_convert_casts_to_the_compute_type_or_to_bool():
    assert pointwise(make_op("convert", target=DType.float16), operands("x", out=DType.float16)) == "x.to(tl.float32)"
    assert pointwise(make_op("convert", target=DType.bool), operands("x", out=DType.bool)) == "(x != 0)"


def test_a_constant_square_needs_no_pow():
    pow_op = make_op("pow")
    assert pointwise(pow_op, operands("a", "c1", constants={"c1": 2.0})) == "(a * a)"
    assert pointwise(pow_op, operands("a", "c1", constants={"c1": 1.0})) == "a"
    assert pointwise(pow_op, operands("a", "c1", constants={"c1": 3.0})) == "libdevice.pow(a, c1)"


def test_reduction_combines_spell_a_right_hand_side_and_a_fold():
    assert binary_rhs("add", "acc", "v") == "acc + v"
    assert binary_rhs("max", "acc", "v") == "tl.maximum(acc, v)"
    assert fold_across("mul", "acc", 1) == "tl.reduce(acc, 1, _prod_combine)"
    with pytest.raises(CodegenError, match="sub"):
        fold_across("sub", "acc", 1)


def test_a_missing_spelling_names_the_op():
    class Unspelled(PointwiseOp):
        name = "unspelled_op"

    with pytest.raises(CodegenError, match="unspelled_op"):
        pointwise(Unspelled(), operands("x"))
