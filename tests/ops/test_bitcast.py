"""BitCast against ONNX Runtime: float and integer types of one size both ways (NaN and infinity
bit patterns included), bool and bytes, scalars, on the reference target unfused and fused and
on the gpu target under the interpreter (float16 too, which kernels hold in fp32); a change of
element size is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import parse_onnx
from fusegraph.errors import ParseError
from fusegraph.targets.ref.runner import run_program
from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target

PAIRS = [(np.float32, np.int32), (np.int32, np.float32), (np.float64, np.int64), (np.int64, np.float64),
         (np.int8, np.uint8), (np.float16, np.int16), (np.int16, np.float16), (np.uint32, np.int32)]


def bitcast_case(rng, source, target, shape=(3, 4)):
    raw = rng.integers(0, 256, (*shape, np.dtype(source).itemsize), dtype=np.uint8)
    x = raw.view(source).reshape(shape)
    if np.dtype(target).kind == "f":  # keep NaN payloads out: a NaN's bits need not survive arithmetic
        x = np.where(np.isnan(x.view(target)), np.zeros((), source), x).astype(source)
    elif np.dtype(source).kind == "f":
        flat = x.reshape(-1)
        flat[:2] = [np.inf, -0.0][:flat.size]
    node = helper.make_node("BitCast", ["x"], ["y"], to=helper.np_dtype_to_tensor_dtype(np.dtype(target)))
    return model_of([node], {"x": x}, ["y"], opset=26), {"x": x}


@pytest.mark.parametrize("source,target", PAIRS, ids=lambda d: np.dtype(d).name)
def test_bitcast(source, target):
    check_ref(*bitcast_case(np.random.default_rng(), source, target), rtol=0, atol=0)


def test_bitcast_scalar():
    check_ref(*bitcast_case(np.random.default_rng(), np.float32, np.int32, ()), rtol=0, atol=0)


def test_bool_to_bytes():
    """ONNX Runtime 1.31 has no bool BitCast kernel: NumPy's view of the bytes is the oracle."""
    x = np.array([True, False, True])
    node = helper.make_node("BitCast", ["x"], ["y"], to=helper.np_dtype_to_tensor_dtype(np.dtype(np.uint8)))
    program = parse_onnx(model_of([node], {"x": x}, ["y"], opset=26))
    np.testing.assert_array_equal(run_program(program, {"x": x})["y"], x.view(np.uint8))


def test_a_size_change_is_refused():
    node = helper.make_node("BitCast", ["x"], ["y"], to=helper.np_dtype_to_tensor_dtype(np.dtype(np.int64)), name="bc")
    with pytest.raises(ParseError, match="'bc'.*element size"):
        parse_onnx(model_of([node], {"x": np.zeros(2, np.float32)}, ["y"], opset=26))


@needs_gpu_target
@pytest.mark.parametrize("source,target", [PAIRS[0], PAIRS[1], PAIRS[4], PAIRS[5], PAIRS[6], PAIRS[7]], ids=lambda d: np.dtype(d).name)
def test_gpu_bitcast(source, target):
    check_gpu(*bitcast_case(np.random.default_rng(), source, target), rtol=0, atol=0)
