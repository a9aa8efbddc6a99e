"""Folding into weights (passes/fold_into_weights.py): a batch norm or a per-channel scale after
a convolution or matrix product with literal weights is baked into new weights (plus a bias
add), so the anchor's kernel does no extra work."""

from __future__ import annotations

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Module, Program
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.pointwise import BatchNorm
from fusegraph.ops.source import add_literal, add_param
from fusegraph.ops.views import MultiBroadcast
from fusegraph.passes.fold_into_weights import FoldIntoWeights
from tests.helpers import assert_same_results, op_names, rand

TOLERANCE = 1e-5  # the folded weights are rounded to float32 once, the unfolded ops round per step


def _const(m: Module, value: np.ndarray, lens) -> object:
    return m.add(MultiBroadcast(lens), [add_literal(m, value.astype(np.float32))])


def _conv(m: Module, x, out_channels: int, seed: int):
    w = add_literal(m, rand(out_channels, x.shape.lens[1], 3, 3, seed=seed))
    return m.add(make_op("convolution", padding=(1, 1, 1, 1), stride=(1, 1), dilation=(1, 1)), [x, w])


def conv_bias_bn(returns_conv: bool = False) -> Program:
    """batch_norm(conv(x, W) + b) with per-channel parameters broadcast to the feature map."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [1, 2, 5, 5]))
    c = _conv(m, x, 3, seed=1)
    lens = c.shape.lens
    a = m.add(make_op("add"), [c, _const(m, rand(1, 3, 1, 1, seed=2), lens)])
    params = [rand(3, 1, 1, seed=3), rand(3, 1, 1, seed=4), rand(3, 1, 1, seed=5), np.abs(rand(3, 1, 1, seed=6)) + 0.5]
    bn = m.add(BatchNorm(1e-3), [a, *(_const(m, v, lens) for v in params)])
    m.set_returns([bn, c] if returns_conv else [bn], ["y", "c"] if returns_conv else ["y"])
    return p


def test_batch_norm_after_a_biased_conv_becomes_new_weights_and_one_bias():
    before, after = conv_bias_bn(), conv_bias_bn()
    assert op_names(before.main).count("batch_norm") == 1
    assert FoldIntoWeights().apply(after.main)
    assert op_names(after.main) == ["@param", "@literal", "convolution", "@literal", "multibroadcast", "add"]
    w0 = before.main.instructions[1].op.value
    w1 = after.main.instructions[1].op.value
    assert w1.shape == w0.shape and not np.allclose(w1, w0)
    assert after.main.instructions[3].shape.lens == (1, 3, 1, 1)  # the bias stays a vector
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_conv_read_elsewhere_keeps_its_weights():
    """The unscaled result is returned as well: folding would change it."""
    p = conv_bias_bn(returns_conv=True)
    text = str(p)
    assert not FoldIntoWeights().apply(p.main)
    assert str(p) == text


def scaled(anchor: str, scale: np.ndarray, weights_literal: bool = True) -> Program:
    """anchor(x, W) * scale, with the scale broadcast to the anchor's output."""
    p = Program()
    m = p.main
    if anchor == "convolution":
        x = add_param(m, "x", Shape.of(DType.float32, [1, 2, 4, 4]))
        out = _conv(m, x, 3, seed=7)
    else:
        x = add_param(m, "x", Shape.of(DType.float32, [2, 5, 4]))
        w = add_literal(m, rand(2, 4, 3, seed=8)) if weights_literal else add_param(m, "w", Shape.of(DType.float32, [2, 4, 3]))
        out = m.add(make_op("dot"), [x, w])
    y = m.add(make_op("mul"), [_const(m, scale, out.shape.lens), out])  # the scale may come first
    m.set_returns([m.add(make_op("relu"), [y])], ["y"])
    return p


def test_a_per_channel_scale_is_baked_into_conv_weights():
    s = rand(1, 3, 1, 1, seed=9)
    before, after = scaled("convolution", s), scaled("convolution", s)
    assert FoldIntoWeights().apply(after.main)
    assert op_names(after.main) == ["@param", "@literal", "convolution", "relu"]
    w0, w1 = before.main.instructions[1].op.value, after.main.instructions[1].op.value
    np.testing.assert_allclose(w1, w0 * s.reshape(3, 1, 1, 1), rtol=1e-6)
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_scale_along_the_last_axis_is_baked_into_dot_weights():
    s = rand(1, 1, 3, seed=10)
    before, after = scaled("dot", s), scaled("dot", s)
    assert FoldIntoWeights().apply(after.main)
    assert op_names(after.main) == ["@param", "@literal", "dot", "relu"]
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_scales_that_are_not_per_output_channel_stay():
    """A scale varying along a spatial axis, a per-row scale of a product and a product whose
    weights are an input are not folded."""
    for p in (scaled("convolution", rand(1, 1, 4, 1, seed=11)), scaled("dot", rand(1, 5, 1, seed=12)),
              scaled("dot", rand(1, 1, 3, seed=13), weights_literal=False)):
        text = str(p)
        assert not FoldIntoWeights().apply(p.main)
        assert str(p) == text
