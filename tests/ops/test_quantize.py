"""QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear against ONNX Runtime: per-tensor,
per-axis and blocked scales, int8/uint8/int16/int32, values that round half to even and that
saturate, on the reference target unfused and fused and on the gpu target under the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target


def _scale_like(rng, x: np.ndarray, form: str, axis: int, block: int) -> np.ndarray:
    if form == "tensor":
        return np.array(0.25 + rng.random(), np.float32)
    if form == "axis":
        return (0.1 + rng.random(x.shape[axis])).astype(np.float32)
    shape = list(x.shape)
    shape[axis] = -(-shape[axis] // block)
    return (0.1 + rng.random(shape)).astype(np.float32)


def quantize_case(rng, form: str, dtype, axis: int = 1, block: int = 0):
    x = (rng.standard_normal((2, 6, 3)) * 60).astype(np.float32)
    x.reshape(-1)[:4] = [0.5, 1.5, 2.5, -0.5]  # ties, rounded to even
    scale = _scale_like(rng, x, form, axis, block)
    info = np.iinfo(dtype)
    zero = rng.integers(max(info.min, -20), min(info.max, 20), scale.shape).astype(dtype)
    if form == "tensor":
        scale, zero = np.array(1.0, np.float32), np.array(zero, dtype)
    attrs = {"axis": axis, **({"block_size": block} if block else {})}
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], **attrs)
    return model_of([node], {"x": x}, ["y"], {"s": scale, "z": zero}, opset=21), {"x": x}


def dequantize_case(rng, form: str, dtype, axis: int = 1, block: int = 0):
    info = np.iinfo(dtype)
    x = rng.integers(max(info.min, -1000), min(info.max, 1000), (2, 6, 3)).astype(dtype)
    scale = _scale_like(rng, x, form, axis, block)
    zero = rng.integers(max(info.min, -20), min(info.max, 20), scale.shape).astype(dtype)
    attrs = {"axis": axis, **({"block_size": block} if block else {})}
    node = helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], **attrs)
    return model_of([node], {"x": x}, ["y"], {"s": scale, "z": zero}, opset=21), {"x": x}


FORMS = [("tensor", 1, 0), ("axis", 1, 0), ("axis", 2, 0), ("block", 1, 4), ("block", 1, 3)]


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("form,axis,block", FORMS)
def test_quantize(form, axis, block, dtype):
    check_ref(*quantize_case(np.random.default_rng(), form, dtype, axis, block), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("form,axis,block", FORMS)
def test_dequantize(form, axis, block, dtype):
    check_ref(*dequantize_case(np.random.default_rng(), form, dtype, axis, block))


def test_dynamic_quantize():
    x = (np.random.default_rng().standard_normal((3, 5)) * 4 + 1).astype(np.float32)
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    check_ref(model_of([node], {"x": x}, ["y", "s", "z"], opset=11), {"x": x})


@needs_gpu_target
def test_gpu_quantize():
    rng = np.random.default_rng()
    check_gpu(*quantize_case(rng, "axis", np.int8), rtol=0, atol=0)
    check_gpu(*quantize_case(rng, "block", np.uint8, 1, 4), rtol=0, atol=0)
    check_gpu(*dequantize_case(rng, "axis", np.int8, 2))
    x = (rng.standard_normal((3, 5)) * 4).astype(np.float32)
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    check_gpu(model_of([node], {"x": x}, ["y", "s", "z"], opset=11), {"x": x})
