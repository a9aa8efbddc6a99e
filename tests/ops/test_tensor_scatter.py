"""TensorScatter against ONNX Runtime: updates written into a cache along the sequence axis at
per-sample write indices that are run-time inputs, linear and circular (wrapping past the
cache's end), on several axes; exact, on the reference target unfused and fused and on the
gpu target under the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import parse_onnx
from fusegraph.errors import ParseError
from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target

# (cache shape, axis, update length, mode, with write indices)
CASES = [((2, 3, 8, 4), -2, 3, "linear", True), ((3, 7, 5), 1, 4, "circular", True),
         ((2, 6, 2, 3), 1, 6, "linear", False), ((2, 2, 3, 6), 3, 2, "circular", True)]


def case(shape, axis, length, mode, with_indices):
    rng = np.random.default_rng()
    update_shape = list(shape)
    update_shape[axis] = length
    size = shape[axis]
    feeds = {"past": rng.standard_normal(shape).astype(np.float32),
             "update": rng.standard_normal(update_shape).astype(np.float32)}
    if with_indices:  # linear writes must fit; circular ones may wrap
        feeds["w"] = rng.integers(0, size if mode == "circular" else size - length + 1, shape[0]).astype(np.int64)
    node = helper.make_node("TensorScatter", list(feeds), ["y"], axis=axis, mode=mode)
    return model_of([node], feeds, ["y"], opset=24), feeds


@pytest.mark.parametrize("shape,axis,length,mode,with_indices", CASES)
def test_tensor_scatter(shape, axis, length, mode, with_indices):
    check_ref(*case(shape, axis, length, mode, with_indices), rtol=0, atol=0)


@needs_gpu_target
def test_gpu_tensor_scatter():
    check_gpu(*case(*CASES[1]), rtol=0, atol=0)


def test_bad_update_names_the_node():
    feeds = {"past": np.zeros((2, 4, 3), np.float32), "update": np.zeros((2, 5, 3), np.float32)}
    node = helper.make_node("TensorScatter", ["past", "update"], ["y"], name="kv1", axis=1)
    with pytest.raises(ParseError, match="does not fit cache") as err:
        parse_onnx(model_of([node], feeds, ["y"], opset=24))
    assert "kv1" in str(err.value)
