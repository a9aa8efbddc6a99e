"""GatherElements and GatherND against ONNX Runtime: run-time indices (negative ones too) on the
reference target unfused and fused, and on the gpu target under the interpreter; constant
indices on constant data fold at import; out-of-range constant indices are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import parse_onnx
from fusegraph.errors import ParseError
from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target

DTYPES = [np.float32, np.int64, np.float16]


def _indices(rng, shape, n: int, dtype=np.int64) -> np.ndarray:
    return rng.integers(-n, n, shape).astype(dtype)


def gather_elements_case(rng, axis: int, dtype=np.float32, idx_dtype=np.int64):
    data = (rng.standard_normal((3, 4, 5)) * 10).astype(dtype)
    shape = list(data.shape)
    shape[axis] = 6
    shape[(axis + 1) % 3] -= 1  # indices may be shorter than the data off the axis
    inputs = {"x": data, "i": _indices(rng, shape, data.shape[axis], idx_dtype)}
    nodes = [helper.make_node("GatherElements", ["x", "i"], ["g"], axis=axis),
             helper.make_node("Neg", ["g"], ["y"])]  # a reader, so fusion has an epilogue
    return model_of(nodes, inputs, ["y"]), inputs


def gather_nd_case(rng, batch_dims: int, k: int, dtype=np.float32):
    data = (rng.standard_normal((2, 3, 4, 5)) * 10).astype(dtype)
    lens = data.shape[batch_dims:batch_dims + k]
    idx = np.stack([rng.integers(-n, n, (*data.shape[:batch_dims], 2, 3)) for n in lens], axis=-1)
    inputs = {"x": data, "i": idx.astype(np.int64)}
    nodes = [helper.make_node("GatherND", ["x", "i"], ["g"], batch_dims=batch_dims),
             helper.make_node("Abs", ["g"], ["y"])]
    return model_of(nodes, inputs, ["y"]), inputs


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_gather_elements(axis, dtype):
    check_ref(*gather_elements_case(np.random.default_rng(), axis, dtype))


def test_gather_elements_int32_indices():
    check_ref(*gather_elements_case(np.random.default_rng(), 1, idx_dtype=np.int32))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("batch_dims,k", [(0, 1), (0, 2), (0, 4), (1, 1), (1, 3), (2, 2)])
def test_gather_nd(batch_dims, k, dtype):
    check_ref(*gather_nd_case(np.random.default_rng(), batch_dims, k, dtype))


def test_constant_indices_on_constant_data_fold():
    rng = np.random.default_rng()
    data = rng.standard_normal((3, 4)).astype(np.float32)
    consts = {"d": data, "i": rng.integers(0, 3, (2, 4)), "j": rng.integers(0, 3, (2, 1))}
    nodes = [helper.make_node("GatherElements", ["d", "i"], ["a"]), helper.make_node("GatherND", ["d", "j"], ["b"]),
             helper.make_node("Add", ["x", "a"], ["y"]), helper.make_node("Add", ["z", "b"], ["w"])]
    inputs = {"x": rng.standard_normal((2, 4)).astype(np.float32), "z": rng.standard_normal((2, 4)).astype(np.float32)}
    model = model_of(nodes, inputs, ["y", "w"], consts)
    names = [i.op.name for i in parse_onnx(model).main]
    assert "gather_elements" not in names and "gather_nd" not in names, names
    check_ref(model, inputs)


@pytest.mark.parametrize("op,idx", [("GatherElements", [[0, 3]]), ("GatherND", [[1, -5]])])
def test_out_of_range_constant_indices_are_refused(op, idx):
    inputs = {"x": np.zeros((2, 3), np.float32)}
    model = model_of([helper.make_node(op, ["x", "i"], ["y"], name="pick")], inputs, ["y"],
                     {"i": np.array(idx, np.int64)})
    with pytest.raises(ParseError, match="'pick'.*out of range"):
        parse_onnx(model)


@needs_gpu_target
@pytest.mark.parametrize("dtype", [np.float32, np.int64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("axis", [0, 2])
def test_gpu_gather_elements(axis, dtype):
    check_gpu(*gather_elements_case(np.random.default_rng(), axis, dtype))


@needs_gpu_target
@pytest.mark.parametrize("batch_dims,k", [(0, 1), (0, 3), (1, 2), (2, 2)])
def test_gpu_gather_nd(batch_dims, k):
    check_gpu(*gather_nd_case(np.random.default_rng(), batch_dims, k))
