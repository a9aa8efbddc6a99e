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
from fusegraph.ops.base import is_literal
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


def _masked_fill() -> Program:
    """y = (1 - keep) * float32's lowest, as exporters write a padding mask, and a literal with
    real infinities."""
    p = Program()
    m = p.main
    keep = add_param(m, "keep", Shape.of(DType.float32, [4]))
    fill = m.add(MultiBroadcast((4,)), [add_literal(m, np.array([np.finfo(np.float32).min], np.float32))])
    one = m.add(MultiBroadcast((4,)), [add_literal(m, np.array([1.0], np.float32))])
    y = m.add(make_op("mul"), [m.add(make_op("sub"), [one, keep]), fill])
    inf = add_literal(m, np.array([np.inf, -np.inf, 1e6, -2.5], np.float32))
    m.set_returns([y, inf], ["y", "inf"])
    return p


def test_a_float32_mask_fill_stays_finite_in_half():
    """In float16 or bfloat16 the fill must stay finite, or a kept token's 0 * -inf is NaN;
    real infinities stay infinite, finite values past the range become its largest."""
    from fusegraph import api

    for dtype, top in ((DType.float16, 65504.0), (DType.bfloat16, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max))):
        p = _masked_fill()
        ToHalf(dtype).apply(p.main)
        fill, inf = [i.op.value for i in p.main if is_literal(i) and i.op.value.size in (1, 4) and i.op.value.reshape(-1)[0] != 1]
        assert float(fill.reshape(-1)[0]) == -top
        assert [float(v) for v in inf] == [np.inf, -np.inf, float(np.float32(min(1e6, top)).astype(dtype.numpy)), -2.5]
        keep = np.array([1, 0, 1, 0], np.float32).astype(dtype.numpy)
        out = api.run(p, {"keep": keep})["y"].astype(np.float64)
        assert not np.isnan(out).any() and list(out) == [0, -top, 0, -top]


def test_a_half_literal_keeps_its_float32_values_for_folds():
    """A layernorm's scale folded into a half program's weights is computed from the float32
    weights and scale the half ones were narrowed from (`Literal.wide`), so the folded weights
    are rounded once: exactly what zero_sum_columns makes of gamma * W in float64. Fusion
    forgets those values after its passes: the compiled program holds its weights once."""
    from onnx import helper

    from fusegraph import parse_onnx
    from fusegraph.ir.zero_sum_columns import zero_sum_columns
    from fusegraph.passes.literal_values import broadcast_literal
    from fusegraph.passes.manager import run_passes
    from fusegraph.passes.pipeline import canonicalize_passes
    from tests.helpers import make_model, rand

    k, n = 48, 16
    gamma, beta, w = 1 + 0.3 * rand(k, seed=1), rand(k, seed=2), rand(k, n, seed=3)
    model = make_model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["t"], axis=-1),
                        helper.make_node("MatMul", ["t", "w"], ["y"])], {"x": [1, 5, k]}, ["y"], {"g": gamma, "b": beta, "w": w})
    p = parse_onnx(model)
    ToHalf(DType.float16, keep_wide=True).apply(p.main)  # as the compiler converts before fusing
    (lit,) = [i for i in p.main if i.op.name == "@literal" and i.shape.lens[-2:] == (k, n)]
    np.testing.assert_array_equal(lit.op.wide.reshape(k, n), w)  # kept beside the narrowed value
    run_passes(p, canonicalize_passes())
    (dot,) = [i for i in p.main if i.op.name == "dot"]
    folded = broadcast_literal(dot.inputs[1]).reshape(k, n)
    want = zero_sum_columns(gamma.astype(np.float64)[:, None] * w.astype(np.float64), np.float16)
    np.testing.assert_array_equal(folded, want)
    twice = zero_sum_columns(gamma.astype(np.float16).astype(np.float64)[:, None] * w.astype(np.float16), np.float16)
    assert not np.array_equal(folded, twice)  # what folding the narrowed values gave
    from fusegraph.passes.pipeline import fuse
    fuse(p)
    assert all(i.op.wide is None for i in p.main if i.op.name == "@literal")


def test_a_batch_norm_folds_into_half_weights_from_their_float32_values():
    """conv + BatchNormalization in a half program: the folded weights are the float32 weights
    times the float32 factor, rounded once (not the rounded weights times the rounded factor)."""
    from onnx import helper

    from fusegraph import parse_onnx
    from fusegraph.passes.literal_values import broadcast_literal
    from fusegraph.passes.manager import run_passes
    from fusegraph.passes.pipeline import canonicalize_passes
    from tests.helpers import make_model, rand

    c, m = 8, 16
    w = rand(m, c, 3, 3, seed=1)
    scale, bias, mean, var = 1 + 0.3 * rand(m, seed=2), rand(m, seed=3), rand(m, seed=4), 1 + np.abs(rand(m, seed=5))
    model = make_model([helper.make_node("Conv", ["x", "w"], ["t"], pads=[1, 1, 1, 1]),
                        helper.make_node("BatchNormalization", ["t", "s", "b", "mu", "v"], ["y"], epsilon=1e-5)],
                       {"x": [1, c, 20, 20]}, ["y"], {"w": w, "s": scale, "b": bias, "mu": mean, "v": var})
    p = parse_onnx(model)
    ToHalf(DType.float16, keep_wide=True).apply(p.main)
    run_passes(p, canonicalize_passes())
    (conv,) = [i for i in p.main if i.op.name == "convolution"]
    factor = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + 1e-5)
    want = (w.astype(np.float64) * factor[:, None, None, None]).astype(np.float16)
    np.testing.assert_array_equal(broadcast_literal(conv.inputs[1]).reshape(want.shape), want)
