"""Half precision (passes/to_half.py): float32 parameters and literals become float16 (or
bfloat16), converts to float32 convert to the new type, and every shape is inferred again;
integer values are left alone."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Program
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.pointwise import Convert
from fusegraph.ops.source import add_literal, add_param
from fusegraph.ops.views import MultiBroadcast
from fusegraph.passes.to_half import ToHalf
from tests.helpers import assert_same_results, printed


def mixed() -> Program:
    """y = tanh(x * w) + float(k), with an int32 input k converted to float32."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [2, 3]))
    k = add_param(m, "k", Shape.of(DType.int32, [2, 3]))
    w = m.add(MultiBroadcast((2, 3)), [add_literal(m, np.array([0.5, -1.25, 2.0], np.float32))])
    t = m.add(make_op("tanh"), [m.add(make_op("mul"), [x, w])])
    y = m.add(make_op("add"), [t, m.add(Convert(DType.float32), [k])])
    m.set_returns([y], ["y"])
    return p


def test_float32_values_become_float16():
    before, after = mixed(), mixed()
    assert printed(before.main)[3] == "@2 = @literal{0.5, -1.25, 2} -> float_type, {3}, {1}"
    assert ToHalf().apply(after.main)
    assert printed(after.main) == [
        'module: "main"',
        "@0 = @param:x -> half_type, {2, 3}, {3, 1}",
        "@1 = @param:k -> int32_type, {2, 3}, {3, 1}",
        "@2 = @literal{0.5, -1.25, 2} -> half_type, {3}, {1}",
        "@3 = multibroadcast[out_lens={2,3}](@2) -> half_type, {2, 3}, {0, 1}",
        "@4 = mul(@0,@3) -> half_type, {2, 3}, {3, 1}",
        "@5 = tanh(@4) -> half_type, {2, 3}, {3, 1}",
        "@6 = convert[target=half_type](@1) -> half_type, {2, 3}, {3, 1}",
        "@7 = add(@5,@6) -> half_type, {2, 3}, {3, 1}",
        "@8 = @return(@7)",
    ]
    assert after.main.instructions[2].op.value.dtype == np.float16
    # the float16 program reads the same inputs rounded to float16: a few half ulps apart
    assert_same_results(before, after, tolerance=2e-3)


def test_bfloat16_is_the_other_half_type():
    before, after = mixed(), mixed()
    assert ToHalf(DType.bfloat16).apply(after.main)
    assert after.main.params["x"].shape.dtype == DType.bfloat16
    assert after.main.instructions[2].op.value.dtype == ml_dtypes.bfloat16
    assert after.main.returns[0].shape.dtype == DType.bfloat16
    assert_same_results(before, after, tolerance=2e-2)


def test_an_integer_program_is_left_as_it_is():
    def build() -> Program:
        p = Program()
        m = p.main
        k = add_param(m, "k", Shape.of(DType.int64, [4]))
        c = add_literal(m, np.arange(4, dtype=np.int64))
        f = m.add(Convert(DType.int32), [m.add(make_op("add"), [k, c])])
        m.set_returns([f], ["y"])
        return p

    before, p = build(), build()
    text = str(p)
    assert not ToHalf().apply(p.main)
    assert str(p) == text
    assert_same_results(before, p, tolerance=0.0)
