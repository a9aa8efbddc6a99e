"""Det against ONNX Runtime on fresh random matrices: one matrix and batches, orders 1 to 7,
on the reference target unfused and fused and on the gpu target under the interpreter.
The cofactor expansion sums products in another order than ONNX Runtime's LU factorization:
relative 1e-4 with an absolute floor for determinants near zero (float32)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import api, parse_onnx
from fusegraph.errors import ParseError
from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target


def case(shape):
    x = np.random.default_rng().standard_normal(shape).astype(np.float32)
    return model_of([helper.make_node("Det", ["x"], ["y"])], {"x": x}, ["y"]), {"x": x}


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (1, 1), (2, 3, 2, 2), (5, 5), (3, 7, 7)])
def test_det(shape):
    check_ref(*case(shape), rtol=1e-4, atol=1e-4)


@needs_gpu_target
def test_gpu_det():
    model, feeds = case((4, 5, 5))
    check_gpu(model, feeds, rtol=1e-4, atol=1e-4)
    kernels = api.compile(parse_onnx(model), "gpu", tune=False).kernels
    assert len(kernels) <= 3 * 4, [k.src.template for k in kernels]  # a few kernels per level


@pytest.mark.parametrize("shape,message", [((3, 4), "square"), ((11, 11), "order 11")])
def test_bad_matrices_name_the_node(shape, message):
    node = helper.make_node("Det", ["x"], ["y"], name="det1")
    with pytest.raises(ParseError, match=message) as err:
        parse_onnx(model_of([node], {"x": np.zeros(shape, np.float32)}, ["y"]))
    assert "det1" in str(err.value)
