"""NonZero of a constant input against ONNX Runtime: fresh random tensors with zeros among
them (rank 1 to 3, a scalar, all zero), and the coordinates feeding a Gather of a run-time
input, on the reference target unfused and fused and on the gpu target under the
interpreter; a run-time input is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import parse_onnx
from fusegraph.errors import DynamicValueError
from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target


def case(c):
    """y = x[NonZero(c)[0]]: the coordinates along the first axis pick rows of x."""
    x = np.random.default_rng().standard_normal((max(c.shape[:1] or (1,)), 3)).astype(np.float32)
    nodes = [helper.make_node("NonZero", ["c"], ["nz"]),
             helper.make_node("Gather", ["nz", "zero"], ["first"], axis=0),
             helper.make_node("Gather", ["x", "first"], ["y"], axis=0)]
    inits = {"c": c, "zero": np.array(0, np.int64)}
    return model_of(nodes, {"x": x}, ["nz", "y"], inits, opset=13), {"x": x}


@pytest.mark.parametrize("shape", [(7,), (4, 5), (2, 3, 4), (), (0,)])
def test_non_zero(shape):
    c = np.random.default_rng().integers(-1, 2, shape).astype(np.float32)
    check_ref(*case(c), rtol=0, atol=0)


def test_all_zero():
    check_ref(*case(np.zeros((3, 2), np.int32)), rtol=0, atol=0)


@needs_gpu_target
def test_gpu_non_zero():
    check_gpu(*case(np.random.default_rng().integers(0, 2, (5, 4)).astype(bool)), rtol=0, atol=0)


def test_run_time_input_is_refused():
    node = helper.make_node("NonZero", ["c"], ["nz"], name="nz1")
    with pytest.raises(DynamicValueError, match="nz1"):
        parse_onnx(model_of([node], {"c": np.zeros((3,), np.float32)}, ["nz"], opset=13))
