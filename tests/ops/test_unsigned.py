"""uint16, uint32 and uint64 tensors: arithmetic, comparisons and casts (uint32, uint64) across the whole range of
each type against ONNX Runtime, on the reference target unfused and fused and on the gpu target
under the interpreter. Unsigned arithmetic wraps, as in ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target

UNSIGNED = [np.uint16, np.uint32, np.uint64]


def unsigned_case(rng, dtype):
    info = np.iinfo(dtype)
    x = rng.integers(1, info.max, (3, 4), dtype=dtype, endpoint=True)
    y = rng.integers(1, info.max, (4,), dtype=dtype, endpoint=True)
    nodes = [helper.make_node("Add", ["x", "y"], ["a"]), helper.make_node("Div", ["a", "y"], ["d"]),
             helper.make_node("Mod", ["d", "x"], ["m"]), helper.make_node("Greater", ["x", "y"], ["g"])]
    if dtype != np.uint16:  # ONNX Runtime casts neither way for uint16
        nodes.append(helper.make_node("Cast", ["m"], ["f"], to=TensorProto.DOUBLE))
    outputs = ["m", "g"] + (["f"] if dtype != np.uint16 else [])
    return model_of(nodes, {"x": x, "y": y}, outputs), {"x": x, "y": y}


@pytest.mark.parametrize("dtype", UNSIGNED, ids=lambda d: np.dtype(d).name)
def test_unsigned(dtype):
    check_ref(*unsigned_case(np.random.default_rng(), dtype), rtol=0, atol=0)


@needs_gpu_target
@pytest.mark.parametrize("dtype", UNSIGNED, ids=lambda d: np.dtype(d).name)
def test_gpu_unsigned(dtype):
    check_gpu(*unsigned_case(np.random.default_rng(), dtype), rtol=0, atol=0)
