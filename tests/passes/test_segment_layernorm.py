"""A layernorm over a product's output channels inside the product's epilogue
(passes/reduction_epilogue.py `segment_layernorm`, applied by FuseAnchors): legal when each of
its rows is an aligned run of the anchor's output channels of at most 256, its scale and bias
constant; the group then computes a `segment_layernorm` in the anchor's index space and stores
the normalized tensor (and the value it normalizes, when that is read elsewhere too)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import parse_onnx
from fusegraph.ops.base import is_fused
from fusegraph.ops.reduce import LayerNorm, SegmentLayerNorm
from fusegraph.passes.pipeline import fuse
from tests.helpers import assert_same_results, make_model, rand

TOLERANCE = 1e-5


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


def stem_model(channels: int = 24, also_pre_norm: bool = False, affine: bool = True):
    """ConvNeXt's stem: a stride-2 conv + bias, channels-last, a layernorm over the channels,
    back to channels-first for a 3x3 conv. `also_pre_norm` returns the conv's output
    too; without `affine` the norm has unit scale and no bias."""
    nodes = [node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2]), node("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
             node("LayerNormalization", ["t", "g"] + (["beta"] if affine else []), ["n"], axis=-1, epsilon=1e-6),
             node("Transpose", ["n"], ["back"], perm=[0, 3, 1, 2]),
             node("Conv", ["back", "w2"], ["y"], pads=[1, 1, 1, 1])]
    scale = rand(channels, seed=3) if affine else np.ones(channels, np.float32)
    inits = {"w": rand(channels, 16, 2, 2, seed=1, scale=0.2), "b": rand(channels, seed=2), "g": scale,
             "beta": rand(channels, seed=4), "w2": rand(8, channels, 3, 3, seed=5, scale=0.2)}
    return make_model(nodes, {"x": [1, 16, 10, 12]}, ["y", "n"] + (["c"] if also_pre_norm else []), inits)


def residual_norm_model(n: int = 96, rows: int = 12, axis: int = -1, rms: bool = False):
    """A product + bias + residual, then a layernorm (an RMS norm, opset 23) over its n output
    features (post-norm)."""
    norm = (node("RMSNormalization", ["s", "gamma"], ["y"], axis=axis) if rms else
            node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=axis))
    nodes = [node("MatMul", ["x", "w"], ["g"]), node("Add", ["g", "b"], ["a"]), node("Add", ["a", "r"], ["s"]), norm]
    inits = {"w": rand(32, n, seed=1), "b": rand(n, seed=2), "gamma": rand(*([n] if axis == -1 else [rows, n]), seed=3),
             "beta": rand(*([n] if axis == -1 else [rows, n]), seed=4)}
    if rms:
        del inits["beta"]
    return make_model(nodes, {"x": [1, rows, 32], "r": [1, rows, n]}, ["y"], inits, opset=23 if rms else 17)


def fused_kernels(model) -> tuple[list[str], object, object]:
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    return [ins.op.attrs["kernel"] for ins in after.main if is_fused(ins)], before, after


def test_the_stem_norm_joins_its_convolution():
    names, before, after = fused_kernels(stem_model())
    assert names == ["conv_add_transpose_layernorm", "conv"]
    (group,) = [ins for ins in after.main if is_fused(ins) and ins.op.attrs["kernel"] == "conv_add_transpose_layernorm"]
    sub = [ins.op for ins in group.op.module]
    norms = [op for op in sub if isinstance(op, SegmentLayerNorm)]
    assert len(norms) == 1 and norms[0].attrs == {"axis": 1, "length": 24, "epsilon": pytest.approx(1e-6), "center": True}
    assert not any(isinstance(op, LayerNorm) for op in sub)
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_norm_without_affine_and_a_pre_norm_value_read_elsewhere():
    """The conv kernel stores both the conv's output and its channels-last norm."""
    names, before, after = fused_kernels(stem_model(also_pre_norm=True, affine=False))
    assert names == ["conv_add_transpose_layernorm", "conv"]
    assert sum(ins.op.name == "fused_output" for ins in after.main) == 1
    assert_same_results(before, after, tolerance=TOLERANCE)


@pytest.mark.parametrize("rms", [False, True])
def test_a_post_norm_over_a_padded_row_joins_the_product(rms):
    names, before, after = fused_kernels(residual_norm_model(96, rms=rms))
    assert names == ["dot_add_rmsnorm" if rms else "dot_add_layernorm"]
    (group,) = [ins for ins in after.main if is_fused(ins)]
    (norm,) = [ins.op for ins in group.op.module if isinstance(ins.op, SegmentLayerNorm)]
    assert norm.attrs["center"] is not rms
    assert_same_results(before, after, tolerance=TOLERANCE)


@pytest.mark.parametrize("model,why", [
    (lambda: residual_norm_model(320), "a row of 320 channels is wider than the widest tile"),
    (lambda: residual_norm_model(96, axis=-2), "the norm spans rows of the product, not one run of channels"),
])
def test_norms_the_epilogue_cannot_hold_keep_their_kernel(model, why):
    names, before, after = fused_kernels(model())
    assert any(n.endswith("layernorm") and n.startswith("layernorm") for n in names), why
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_segment_layernorm_reference_normalizes_each_run():
    x = np.random.default_rng(0).standard_normal((2, 12, 3)).astype(np.float32)
    scale, bias = (np.random.default_rng(k).standard_normal((2, 12, 3)).astype(np.float32) for k in (1, 2))
    got = SegmentLayerNorm(1, 4, 1e-5).reference([x, scale, bias])
    runs = x.astype(np.float64).reshape(2, 3, 4, 3)
    mean, var = runs.mean(axis=2, keepdims=True), runs.var(axis=2, keepdims=True)
    want = ((runs - mean) / np.sqrt(var + 1e-5)).reshape(2, 12, 3) * scale + bias
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
