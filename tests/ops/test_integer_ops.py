"""MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv against ONNX Runtime (uint8 and
int8 operands, scalar and per-channel zero points and scales) on the reference target unfused
and fused and on the gpu target under the interpreter. Integer products compare exactly; the
requantized QLinear outputs within one step, where a product lands on a rounding tie that
float32 may see on either side."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target


def _ints(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def matmul_integer_case(rng, dtype):
    a, b = _ints(rng, (2, 3, 8), dtype), _ints(rng, (8, 5), dtype)
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    consts = {"az": np.array(3, dtype), "bz": _ints(rng, (5,), dtype)}
    return model_of([node], {"a": a, "b": b}, ["y"], consts, opset=10), {"a": a, "b": b}


def conv_integer_case(rng):
    x, w = _ints(rng, (1, 2, 5, 5), np.uint8), _ints(rng, (3, 2, 3, 3), np.uint8)
    node = helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"], pads=[1, 1, 1, 1])
    return model_of([node], {"x": x}, ["y"], {"w": w, "xz": np.array(7, np.uint8)}, opset=10), {"x": x}


def qlinear_matmul_case(rng, dtype):
    a, b = _ints(rng, (3, 8), dtype), _ints(rng, (8, 4), dtype)
    consts = {"as": np.array(0.02, np.float32), "az": np.array(1, dtype), "bs": np.array(0.03, np.float32),
              "bz": np.array(-2 if dtype == np.int8 else 5, dtype), "ys": np.array(0.5, np.float32),
              "yz": np.array(3, dtype)}
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    return model_of([node], {"a": a, "b": b}, ["y"], consts, opset=10), {"a": a, "b": b}


def qlinear_conv_case(rng):
    x = _ints(rng, (1, 2, 5, 5), np.uint8)
    consts = {"xs": np.array(0.05, np.float32), "xz": np.array(10, np.uint8), "w": _ints(rng, (3, 2, 3, 3), np.uint8),
              "ws": np.array([0.01, 0.02, 0.03], np.float32), "wz": np.array([4, 5, 6], np.uint8),
              "ys": np.array(0.7, np.float32), "yz": np.array(9, np.uint8), "b": rng.integers(-50, 50, 3).astype(np.int32)}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], pads=[1, 0, 1, 0])
    return model_of([node], {"x": x}, ["y"], consts, opset=10), {"x": x}


@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=lambda d: np.dtype(d).name)
def test_matmul_integer(dtype):
    check_ref(*matmul_integer_case(np.random.default_rng(), dtype), rtol=0, atol=0)


def test_conv_integer():
    check_ref(*conv_integer_case(np.random.default_rng()), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=lambda d: np.dtype(d).name)
def test_qlinear_matmul(dtype):
    check_ref(*qlinear_matmul_case(np.random.default_rng(), dtype), rtol=0, atol=1)


def test_qlinear_conv():
    check_ref(*qlinear_conv_case(np.random.default_rng()), rtol=0, atol=1)


@needs_gpu_target
def test_gpu_integer_ops():
    rng = np.random.default_rng()
    check_gpu(*matmul_integer_case(rng, np.uint8), rtol=0, atol=0)
    check_gpu(*conv_integer_case(rng), rtol=0, atol=0)
    check_gpu(*qlinear_matmul_case(rng, np.int8), rtol=0, atol=1)
    check_gpu(*qlinear_conv_case(rng), rtol=0, atol=1)
