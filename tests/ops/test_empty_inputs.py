"""An op whose inputs are all empty has a value that shapes alone decide (a sum over an empty
axis is 0, a max -inf): the importer folds it to a literal, so both targets return ONNX
Runtime's result although no kernel can run on an empty tensor."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target


def reduce_case(op: str):
    x = np.zeros((2, 0, 3), np.float32)
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)
    return model_of([node], {"x": x}, ["y"], {"axes": np.array([1], np.int64)}), {"x": x}


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceProd", "ReduceLogSumExp"])
def test_reduction_over_an_empty_axis(op):
    check_ref(*reduce_case(op))


@needs_gpu_target
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMin"])
def test_gpu_reduction_over_an_empty_axis(op):
    check_gpu(*reduce_case(op))
