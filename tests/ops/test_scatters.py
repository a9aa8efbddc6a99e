"""ScatterElements, ScatterND and Col2Im (a scatter-add by the window geometry) against ONNX
Runtime: indices fixed at import (negative and repeated ones, every reduction), data and
updates at run time, on the reference target unfused and fused and on the gpu target under the
interpreter; bad indices are refused."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import parse_onnx
from fusegraph.errors import ParseError
from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target

REDUCTIONS = ["none", "add", "mul", "max", "min"]


def elements_case(rng, axis: int, reduction: str, dtype=np.float32):
    data = (rng.standard_normal((3, 4, 5)) * 4).astype(dtype)
    shape = [2, 3, 4]
    n = data.shape[axis]
    if reduction == "none":  # unique targets along the axis: duplicates are undefined without a reduction
        idx = np.moveaxis(np.stack([rng.permutation(n)[:shape[axis]] for _ in range(int(np.prod(shape)) // shape[axis])]
                                   ).reshape([s for k, s in enumerate(shape) if k != axis] + [shape[axis]]), -1, axis)
        idx = np.where(rng.random(idx.shape) < 0.5, idx - n, idx)
    else:
        idx = rng.integers(-n, n, shape)
    inputs = {"x": data, "u": (rng.standard_normal(shape) * 4).astype(dtype)}
    node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=axis, reduction=reduction)
    return model_of([node], inputs, ["y"], {"i": idx.astype(np.int64)}), inputs


def nd_case(rng, k: int, reduction: str, dtype=np.float32):
    data = (rng.standard_normal((4, 3, 2)) * 4).astype(dtype)
    lens = data.shape[:k]
    count = 3
    flat = rng.choice(int(np.prod(lens)), count, replace=reduction != "none")
    idx = np.stack(np.unravel_index(flat, lens), axis=-1).reshape(count, k)
    idx[0] -= np.array(lens)  # a negative tuple
    inputs = {"x": data, "u": (rng.standard_normal((count, *data.shape[k:])) * 4).astype(dtype)}
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)
    return model_of([node], inputs, ["y"], {"i": idx.astype(np.int64)}), inputs


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_scatter_elements(axis, reduction):
    check_ref(*elements_case(np.random.default_rng(), axis, reduction))


@pytest.mark.parametrize("dtype,reduction", [(np.int64, "add"), (np.int32, "max"), (np.float16, "none")],
                         ids=lambda d: d if isinstance(d, str) else np.dtype(d).name)
def test_scatter_elements_dtypes(dtype, reduction):
    check_ref(*elements_case(np.random.default_rng(), 1, reduction, dtype))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_scatter_nd(k, reduction):
    check_ref(*nd_case(np.random.default_rng(), k, reduction))


def test_out_of_range_indices_are_refused():
    inputs = {"x": np.zeros((2, 3), np.float32), "u": np.zeros((1, 3), np.float32)}
    model = model_of([helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="put")], inputs, ["y"],
                     {"i": np.array([[2]], np.int64)})
    with pytest.raises(ParseError, match="'put'.*out of range"):
        parse_onnx(model)


@needs_gpu_target
@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_gpu_scatters(reduction):
    rng = np.random.default_rng()
    check_gpu(*elements_case(rng, 1, reduction))
    check_gpu(*nd_case(rng, 2, reduction))


def col2im_case(rng, pads, strides, dilations):
    image, block = [5, 6], [2, 3]
    counts = [(image[d] + pads[d] + pads[d + 2] - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1 for d in range(2)]
    x = rng.standard_normal((2, 3 * 6, counts[0] * counts[1])).astype(np.float32)
    node = helper.make_node("Col2Im", ["x", "im", "bl"], ["y"], pads=pads, strides=strides, dilations=dilations)
    consts = {"im": np.array(image, np.int64), "bl": np.array(block, np.int64)}
    return model_of([node], {"x": x}, ["y"], consts), {"x": x}


@pytest.mark.parametrize("pads,strides,dilations", [([0, 0, 0, 0], [1, 1], [1, 1]), ([1, 0, 1, 2], [2, 1], [1, 2])])
def test_col2im(pads, strides, dilations):
    check_ref(*col2im_case(np.random.default_rng(), pads, strides, dilations))


@needs_gpu_target
def test_gpu_col2im():
    check_gpu(*col2im_case(np.random.default_rng(), [1, 0, 1, 2], [2, 1], [1, 2]))
