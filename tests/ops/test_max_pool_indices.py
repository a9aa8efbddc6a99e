"""MaxPool's Indices output against ONNX Runtime: the flat input index of each window's max
(row-major, or column-major over the spatial axes with storage_order=1, plus the channel's
offset), the first tap in the window's order on ties. Inputs are rounded to a few values so
that ties are common; padding, strides, dilations, ceil mode, 1-d and 3-d windows. The values
output is checked alongside; both exactly, on the reference target unfused and fused and on the
gpu target under the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import parse_onnx
from fusegraph.errors import ParseError
from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target

CASES = [
    ((2, 3, 6, 7), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])),
    ((1, 2, 7, 6), dict(kernel_shape=[2, 3], strides=[2, 1], storage_order=1)),
    ((1, 2, 8, 8), dict(kernel_shape=[3, 2], dilations=[2, 2], pads=[0, 1, 2, 0], storage_order=1)),
    ((1, 1, 7, 7), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ((2, 2, 9), dict(kernel_shape=[4], strides=[3], pads=[2, 1])),
    ((1, 2, 4, 5, 6), dict(kernel_shape=[2, 3, 2], strides=[2, 2, 2], storage_order=1)),
    ((1, 2, 5, 5), dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER")),
]


def case(shape, attrs, dtype=np.float32):
    x = np.random.default_rng().integers(-3, 4, shape).astype(dtype)  # few values: ties everywhere
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    return model_of([node], {"x": x}, ["y", "i"], opset=12), {"x": x}


@pytest.mark.parametrize("shape,attrs", CASES)
def test_indices(shape, attrs):
    check_ref(*case(shape, attrs), rtol=0, atol=0)


def test_int8_indices():
    check_ref(*case((1, 2, 5, 6), dict(kernel_shape=[2, 2], pads=[1, 0, 0, 1]), np.int8), rtol=0, atol=0)


@needs_gpu_target
@pytest.mark.parametrize("shape,attrs", [CASES[0], CASES[2]])
def test_gpu_indices(shape, attrs):
    check_gpu(*case(shape, attrs), rtol=0, atol=0)


def test_bad_storage_order_names_the_node():
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], name="mp1", kernel_shape=[2, 2], storage_order=2)
    with pytest.raises(ParseError, match="storage_order") as err:
        parse_onnx(model_of([node], {"x": np.zeros((1, 1, 4, 4), np.float32)}, ["y", "i"], opset=12))
    assert "mp1" in str(err.value)
