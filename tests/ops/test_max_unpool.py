"""MaxUnpool against ONNX Runtime: the values of a MaxPool scattered back to the positions of
its Indices (computed by ONNX Runtime on a fresh random input and given as a constant, since
the scatter needs its indices at import), non-overlapping and overlapping windows (repeated
indices: the later write wins), pads, and an output_shape equal to the unpooled shape; exact,
on the reference target unfused and fused and on the gpu target under the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import parse_onnx
from fusegraph.errors import DynamicValueError, ParseError
from tests.helpers import ort_run
from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target

CASES = [((1, 2, 6, 6), dict(kernel_shape=[2, 2], strides=[2, 2])),
         ((2, 2, 7, 5), dict(kernel_shape=[3, 2], strides=[1, 1])),  # overlapping: repeated indices
         ((1, 3, 5, 7), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))]


def case(shape, attrs, output_shape=None):
    rng = np.random.default_rng()
    x = rng.integers(-4, 5, shape).astype(np.float32)  # ties too
    pool = model_of([helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)], {"x": x}, ["y", "i"], opset=12)
    values, indices = ort_run(pool, {"x": x})
    inputs, inits = ["v", "i"], {"i": indices}
    if output_shape is not None:
        inputs.append("shape")
        inits["shape"] = np.array(output_shape, np.int64)
    node = helper.make_node("MaxUnpool", inputs, ["u"], **attrs)
    return model_of([node], {"v": values}, ["u"], inits, opset=11), {"v": values}


@pytest.mark.parametrize("shape,attrs", CASES)
def test_max_unpool(shape, attrs):
    check_ref(*case(shape, attrs), rtol=0, atol=0)


def test_output_shape_equal_to_the_unpooled_shape():
    check_ref(*case((1, 2, 6, 6), CASES[0][1], output_shape=[1, 2, 6, 6]), rtol=0, atol=0)


@needs_gpu_target
def test_gpu_max_unpool():
    check_gpu(*case(*CASES[1]), rtol=0, atol=0)


def test_refusals_name_the_node():
    model, _ = case((1, 1, 4, 4), CASES[0][1], output_shape=[1, 1, 5, 5])
    model.graph.node[0].name = "up1"
    with pytest.raises(ParseError, match="output_shape") as err:
        parse_onnx(model)
    assert "up1" in str(err.value)
    v = np.zeros((1, 1, 2, 2), np.float32)
    node = helper.make_node("MaxUnpool", ["v", "i"], ["u"], name="up2", kernel_shape=[2, 2], strides=[2, 2])
    run_time = model_of([node], {"v": v, "i": np.zeros((1, 1, 2, 2), np.int64)}, ["u"], opset=11)
    with pytest.raises(DynamicValueError, match="up2"):
        parse_onnx(run_time)
