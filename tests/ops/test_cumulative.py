"""CumSum and CumProd against ONNX Runtime (every axis, exclusive and reverse, float and integer
inputs) on the reference target unfused and fused and on the gpu target under the interpreter;
EyeLike and the window functions, which fold to literals, against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target


def cumulative_case(rng, op: str, axis: int, exclusive: int, reverse: int, dtype=np.float32):
    if np.dtype(dtype).kind == "f":
        x = (rng.random((3, 4, 5)) + 0.5).astype(dtype)
    else:
        x = rng.integers(-3, 4, (3, 4, 5)).astype(dtype)
    node = helper.make_node(op, ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)
    opset = 26 if op == "CumProd" else 18  # CumProd is new in opset 26
    return model_of([node], {"x": x}, ["y"], {"a": np.array(axis, np.int64)}, opset=opset), {"x": x}


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis", [0, -1, 1])
@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
def test_cumulative(op, axis, exclusive, reverse, dtype):
    check_ref(*cumulative_case(np.random.default_rng(), op, axis, exclusive, reverse, dtype))


@needs_gpu_target
@pytest.mark.parametrize("op,dtype", [("CumSum", np.float32), ("CumSum", np.int64), ("CumProd", np.float32)])
def test_gpu_cumulative(op, dtype):
    check_gpu(*cumulative_case(np.random.default_rng(), op, 1, 1, 1, dtype))
    check_gpu(*cumulative_case(np.random.default_rng(), op, 2, 0, 0, dtype))


@pytest.mark.parametrize("k,dtype", [(0, None), (1, 7), (-2, 1)])
def test_eye_like(k, dtype):
    x = np.zeros((4, 5), np.float32)
    node = helper.make_node("EyeLike", ["x"], ["y"], k=k, **({"dtype": dtype} if dtype else {}))
    check_ref(model_of([node], {"x": x}, ["y"]), {"x": x})


@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
def test_windows(op, periodic):
    x = np.zeros((1,), np.float32)  # a graph input so the model has one; the window ignores it
    nodes = [helper.make_node(op, ["n"], ["w"], periodic=periodic), helper.make_node("Add", ["w", "x"], ["y"])]
    check_ref(model_of(nodes, {"x": x}, ["y"], {"n": np.array(10, np.int64)}, opset=17), {"x": x})
