"""`row_moments`: each row's mean and 1 / sqrt(var + eps) in one op (ops/reduce.py), what the
importer builds GroupNorm, InstanceNorm and LayerNorm's extra outputs from. Checked against
float64 NumPy on fresh inputs, through the importer against ONNX Runtime, and fused."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import parse_onnx, run
from fusegraph.ir.dtypes import DType
from fusegraph.ir.shape import Shape
from fusegraph.ops.reduce import RowMoments
from fusegraph.passes.pipeline import fuse
from tests.helpers import make_model, ort_run, rand, rel_err


def test_reference_stacks_the_mean_and_the_inverse_deviation_along_the_axis():
    x = np.random.default_rng().standard_normal((3, 4, 5, 6)).astype(np.float32) * 3 + 2
    op = RowMoments(2, 1e-5)
    assert op.compute_shape([Shape.of(DType.float16, [3, 4, 5, 6])]).lens == (3, 4, 2, 1)
    assert op.compute_shape([Shape.of(DType.float16, [3, 4, 5, 6])]).dtype == DType.float32  # statistics stay wide
    got = op.reference([x])
    wide = x.astype(np.float64)
    mean = wide.mean(axis=(2, 3))
    rstd = 1 / np.sqrt(wide.var(axis=(2, 3)) + 1e-5)
    np.testing.assert_allclose(got[:, :, 0, 0], mean, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[:, :, 1, 0], rstd, rtol=1e-6)


def test_an_axis_past_the_rank_is_refused():
    with pytest.raises(ValueError, match="axis 4 out of range"):
        RowMoments(4, 1e-5).compute_shape([Shape.of(DType.float32, [2, 3, 4, 5])])


@pytest.mark.parametrize("case", ["group", "instance"])
def test_normalizations_read_both_statistics_from_one_kernel(case):
    if case == "group":
        nodes = [helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3, epsilon=1e-5)]
        opset, params = 21, {"s": rand(6, seed=1), "b": rand(6, seed=2)}
    else:
        nodes = [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)]
        opset, params = 17, {"s": rand(6, seed=1), "b": rand(6, seed=2)}
    model = make_model(nodes, {"x": [2, 6, 5, 7]}, ["y"], params, opset=opset)
    program = parse_onnx(model)
    assert sum(i.op.name == "row_moments" for i in program.main) == 1
    assert not any(i.op.name == "reduce_mean" for i in program.main)
    fused = parse_onnx(model)
    fuse(fused)
    kernels = [i.op.attrs["kernel"] for i in fused.main if i.op.name == "fused"]
    assert len(kernels) == 2 and kernels[0].startswith("row_moments"), kernels
    x = np.random.default_rng().standard_normal((2, 6, 5, 7)).astype(np.float32) * 2 + 1
    (want,) = ort_run(model, {"x": x})
    for p in (program, fused):
        assert rel_err(run(p, {"x": x})["y"], want) < 1e-5


def test_layernorm_extra_outputs_come_from_the_moments():
    model = make_model([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv_std"], axis=1,
                                         epsilon=1e-5)],
                       {"x": [3, 4, 5]}, ["y", "mean", "inv_std"], {"s": rand(4, 5, seed=1), "b": rand(4, 5, seed=2)})
    program = parse_onnx(model)
    x = np.random.default_rng().standard_normal((3, 4, 5)).astype(np.float32)
    want = ort_run(model, {"x": x})
    got = run(program, {"x": x})
    for name, w in zip(["y", "mean", "inv_std"], want):
        assert rel_err(got[name], w) < 1e-5, name
