"""BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot and BitShift on integer tensors.

Each op is checked on fresh random integers spanning the whole range of its type, with
broadcasting, against an independent reference: ONNX Runtime, except for BitShift on signed
types, which ONNX defines only from opset 28, newer than ONNX Runtime reads, where onnx's own
reference evaluator is the oracle. Every result is compared on the reference target unfused
and fused, and on the gpu target (Triton's interpreter without a GPU) alone and fused behind
an Add or a Where into one kernel. Integers compare exactly.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from fusegraph import api, parse_onnx
from fusegraph.errors import FusegraphError
from fusegraph.passes.pipeline import fuse
from fusegraph.targets.ref.runner import run_program
from tests.helpers import make_model, ort_run

INTEGERS = [np.int8, np.int16, np.int32, np.int64, np.uint8]
SIGNED = [np.int8, np.int16, np.int32, np.int64]
BINARY = ["BitwiseAnd", "BitwiseOr", "BitwiseXor"]
# (x, y): equal shapes, y broadcast along leading axes, both broadcast
SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 5))]

needs_gpu_target = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None,
    reason="the gpu target needs torch and triton (the 'gpu' extra)")


def _model(nodes, inputs: dict[str, tuple[int, ...]], dtype, opset: int, initializers=None):
    model = make_model(nodes, inputs, ["z"], initializers, opset=opset,
                       dtype=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    if "c" in inputs:  # Where's condition is bool
        model.graph.input[list(inputs).index("c")].type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(bool))
    return model


def _full_range(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def _amounts(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Shift amounts in range and out of it: negative (signed types) and at or past the width."""
    bits = 8 * np.dtype(dtype).itemsize
    lo = -3 if np.dtype(dtype).kind == "i" else 0
    return rng.integers(lo, bits + 4, shape).astype(dtype)


def _check(model, inputs: dict[str, np.ndarray], want: np.ndarray) -> None:
    """The reference target unfused and fused gives `want` exactly."""
    program = parse_onnx(model)
    np.testing.assert_array_equal(run_program(program, inputs)["z"], want)
    fuse(program)
    np.testing.assert_array_equal(run_program(program, inputs)["z"], want)


def _check_gpu(model, inputs: dict[str, np.ndarray], want: np.ndarray, kernels: int = 1) -> None:
    compiled = api.compile(parse_onnx(model), "gpu", tune=False)
    assert len(compiled.kernels) == kernels, [k.src.template for k in compiled.kernels]
    compiled.poison()
    np.testing.assert_array_equal(np.asarray(compiled.run(inputs)["z"]), want)


def _binary_case(op: str, dtype, shapes, rng: np.random.Generator):
    (xs, ys) = shapes
    inputs = {"x": _full_range(rng, xs, dtype), "y": _full_range(rng, ys, dtype)}
    model = _model([helper.make_node(op, ["x", "y"], ["z"])], {"x": xs, "y": ys}, dtype, 18)
    return model, inputs


@pytest.mark.parametrize("dtype", INTEGERS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("op", BINARY)
def test_binary_matches_onnxruntime(op, shapes, dtype):
    model, inputs = _binary_case(op, dtype, shapes, np.random.default_rng())
    (want,) = ort_run(model, inputs)
    _check(model, inputs, want)


@pytest.mark.parametrize("dtype", INTEGERS, ids=lambda d: np.dtype(d).name)
def test_not_matches_onnxruntime(dtype):
    x = _full_range(np.random.default_rng(), (2, 3, 4), dtype)
    model = _model([helper.make_node("BitwiseNot", ["x"], ["z"])], {"x": x.shape}, dtype, 18)
    (want,) = ort_run(model, {"x": x})
    _check(model, {"x": x}, want)


def _shift_case(direction: str, dtype, shapes, rng: np.random.Generator):
    """A BitShift model, its inputs and the expected result: unsigned at opset 11 from ONNX
    Runtime, signed at opset 28 from onnx's reference evaluator."""
    xs, ys = shapes
    inputs = {"x": _full_range(rng, xs, dtype), "y": _amounts(rng, ys, dtype)}
    signed = np.dtype(dtype).kind == "i"
    model = _model([helper.make_node("BitShift", ["x", "y"], ["z"], direction=direction)],
                   {"x": xs, "y": ys}, dtype, 28 if signed else 11)
    if signed:
        (want,) = ReferenceEvaluator(model).run(None, inputs)
    else:
        (want,) = ort_run(model, inputs)
    return model, inputs, want


@pytest.mark.parametrize("dtype", INTEGERS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_shift_matches_the_oracle(direction, shapes, dtype):
    model, inputs, want = _shift_case(direction, dtype, shapes, np.random.default_rng())
    _check(model, inputs, want)


def test_shift_out_of_range_gives_the_sign_fill():
    """Amounts past the width or negative: 0, or -1 for a right shift of a negative value."""
    x = np.array([-8, 4, -1, 5], np.int8)
    y = np.array([8, 9, -1, 127], np.int8)
    for direction, want in (("LEFT", [0, 0, 0, 0]), ("RIGHT", [-1, 0, -1, 0])):
        model = _model([helper.make_node("BitShift", ["x", "y"], ["z"], direction=direction)],
                       {"x": x.shape, "y": y.shape}, np.int8, 28)
        _check(model, {"x": x, "y": y}, np.array(want, np.int8))


def _fused_model(op: str, dtype, shapes, rng: np.random.Generator):
    """`op` followed by Add(op, x) (bitwise ops) or Where(c, op, x) (BitShift), so that the two
    make one fused group; the expected result comes from the oracle of `op` alone."""
    xs, ys = shapes
    out = np.broadcast_shapes(xs, ys)
    if op == "BitShift":
        model, inputs, inner = _shift_case("LEFT", dtype, shapes, rng)
        c = rng.random(out) < 0.5
        nodes = [helper.make_node("BitShift", ["x", "y"], ["s"], direction="LEFT"),
                 helper.make_node("Where", ["c", "s", "x"], ["z"])]
        opset = model.opset_import[0].version
        fused = _model(nodes, {"c": out, "x": xs, "y": ys}, dtype, opset)
        return fused, {**inputs, "c": c}, np.where(c, inner, inputs["x"])
    model, inputs = _binary_case(op, dtype, shapes, rng)
    (inner,) = ort_run(model, inputs)
    nodes = [helper.make_node(op, ["x", "y"], ["s"]), helper.make_node("Add", ["s", "x"], ["z"])]
    with np.errstate(over="ignore"):
        want = (inner + inputs["x"]).astype(dtype)  # integer addition wraps, as in ONNX Runtime
    return _model(nodes, {"x": xs, "y": ys}, dtype, 18), inputs, want


@pytest.mark.parametrize("dtype", INTEGERS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", BINARY + ["BitShift"])
def test_fused_with_a_following_op(op, dtype):
    model, inputs, want = _fused_model(op, dtype, SHAPES[1], np.random.default_rng())
    _check(model, inputs, want)


@needs_gpu_target
@pytest.mark.parametrize("dtype", INTEGERS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", BINARY)
def test_gpu_binary(op, dtype):
    model, inputs = _binary_case(op, dtype, SHAPES[2], np.random.default_rng())
    (want,) = ort_run(model, inputs)
    _check_gpu(model, inputs, want)


@needs_gpu_target
@pytest.mark.parametrize("dtype", INTEGERS, ids=lambda d: np.dtype(d).name)
def test_gpu_not(dtype):
    x = _full_range(np.random.default_rng(), (3, 5), dtype)
    model = _model([helper.make_node("BitwiseNot", ["x"], ["z"])], {"x": x.shape}, dtype, 18)
    (want,) = ort_run(model, {"x": x})
    _check_gpu(model, {"x": x}, want)


@needs_gpu_target
@pytest.mark.parametrize("dtype", INTEGERS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_gpu_shift(direction, dtype):
    model, inputs, want = _shift_case(direction, dtype, SHAPES[1], np.random.default_rng())
    _check_gpu(model, inputs, want)


@needs_gpu_target
@pytest.mark.parametrize("amount", [3, 9])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_gpu_shift_by_a_constant(direction, amount):
    """One amount for every element, in range and past the width (uint8 at opset 11, against
    ONNX Runtime): the kernel reads it once and still guards it."""
    x = _full_range(np.random.default_rng(), (4, 6), np.uint8)
    model = _model([helper.make_node("BitShift", ["x", "y"], ["z"], direction=direction)],
                   {"x": x.shape}, np.uint8, 11, {"y": np.array(amount, np.uint8)})
    (want,) = ort_run(model, {"x": x})
    _check(model, {"x": x}, want)
    _check_gpu(model, {"x": x}, want)


@needs_gpu_target
@pytest.mark.parametrize("dtype", INTEGERS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", BINARY + ["BitShift"])
def test_gpu_fused_with_a_following_op(op, dtype):
    model, inputs, want = _fused_model(op, dtype, SHAPES[1], np.random.default_rng())
    _check_gpu(model, inputs, want, kernels=1)


def test_float_inputs_are_refused_naming_the_node():
    model = make_model([helper.make_node("BitwiseAnd", ["x", "y"], ["z"], name="band")],
                       {"x": (3,), "y": (3,)}, ["z"], opset=18)
    with pytest.raises(FusegraphError, match="band"):
        parse_onnx(model)


def test_signed_shift_before_opset_28_is_refused_naming_the_node():
    model = _model([helper.make_node("BitShift", ["x", "y"], ["z"], direction="LEFT", name="shl")],
                   {"x": (3,), "y": (3,)}, np.int32, 11)
    with pytest.raises(FusegraphError, match="shl.*opset 28"):
        parse_onnx(model)
