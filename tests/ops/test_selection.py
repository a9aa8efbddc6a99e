"""TopK, Hardmax, OneHot and Compress against ONNX Runtime on the reference target unfused and
fused and on the gpu target under the interpreter. TopK gets ties (equal values must come out
lowest index first), both directions and integer inputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target


def top_k_case(rng, axis: int, largest: int, k: int, dtype=np.float32):
    x = rng.integers(-4, 5, (3, 6, 4)).astype(dtype)  # small integers: many ties
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    return model_of([node], {"x": x}, ["v", "i"], {"k": np.array([k], np.int64)}), {"x": x}


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("axis,k", [(-1, 2), (1, 6), (0, 1), (1, 0)])
def test_top_k(axis, k, largest, dtype):
    check_ref(*top_k_case(np.random.default_rng(), axis, largest, k, dtype))


@pytest.mark.parametrize("axis,opset", [(-1, 13), (0, 13), (1, 11), (2, 11)])
def test_hardmax(axis, opset):
    x = np.random.default_rng().integers(-3, 4, (2, 3, 4)).astype(np.float32)
    node = helper.make_node("Hardmax", ["x"], ["y"], axis=axis)
    check_ref(model_of([node], {"x": x}, ["y"], opset=opset), {"x": x})


def one_hot_case(rng, axis: int):
    idx = rng.integers(-6, 8, (2, 3)).astype(np.int64)  # negatives count back, >= depth gives all off
    inputs = {"i": idx, "vals": np.array([-1.5, 2.0], np.float32)}
    node = helper.make_node("OneHot", ["i", "d", "vals"], ["y"], axis=axis)
    return model_of([node], inputs, ["y"], {"d": np.array(5, np.int64)}), inputs


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis):
    check_ref(*one_hot_case(np.random.default_rng(), axis))


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress(axis):
    x = np.random.default_rng().standard_normal((3, 4)).astype(np.float32)
    node = helper.make_node("Compress", ["x", "c"], ["y"], **({} if axis is None else {"axis": axis}))
    check_ref(model_of([node], {"x": x}, ["y"], {"c": np.array([True, False, True])}), {"x": x})


@needs_gpu_target
def test_gpu_selection():
    rng = np.random.default_rng()
    check_gpu(*top_k_case(rng, 1, 1, 3))
    check_gpu(*top_k_case(rng, -1, 0, 2, np.int64))
    check_gpu(*one_hot_case(rng, 1))
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    check_gpu(model_of([helper.make_node("Hardmax", ["x"], ["y"], axis=1)], {"x": x}, ["y"], opset=13), {"x": x})
