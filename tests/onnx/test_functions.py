"""Ops without a parser that ONNX defines as functions are read as their bodies
(onnx/functions.py): CenterCropPad, RotaryEmbedding and AffineGrid (whose body holds If nodes on
constant conditions, read as the branch taken) give ONNX Runtime's results on the reference
target unfused and fused and on the gpu target; an op whose body needs an unsupported op is
reported by its own name."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import parse_onnx
from fusegraph.errors import UnsupportedOpError
from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target


def center_crop_pad_case(rng):
    x = rng.standard_normal((5, 4, 3)).astype(np.float32)
    node = helper.make_node("CenterCropPad", ["x", "s"], ["y"], axes=[0, 1])
    return model_of([node], {"x": x}, ["y"], {"s": np.array([3, 6], np.int64)}, opset=18), {"x": x}


def rotary_case(rng, interleaved: int):
    x = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)  # [batch, heads, sequence, head size]
    cos, sin = (rng.standard_normal((2, 4, 4)).astype(np.float32) for _ in range(2))
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"], interleaved=interleaved)
    inputs = {"x": x, "cos": cos, "sin": sin}
    return model_of([node], inputs, ["y"], opset=23), inputs


def test_center_crop_pad():
    check_ref(*center_crop_pad_case(np.random.default_rng()))


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding(interleaved):
    check_ref(*rotary_case(np.random.default_rng(), interleaved))


def test_a_body_that_needs_an_unsupported_op_reports_the_op():
    p = np.full((2, 3), 0.5, np.float32)  # Bernoulli's body draws with RandomUniformLike
    node = helper.make_node("Bernoulli", ["p"], ["y"], name="coin")
    with pytest.raises(UnsupportedOpError, match="Bernoulli: coin"):
        parse_onnx(model_of([node], {"p": p}, ["y"], opset=20))


@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid(align):
    """AffineGrid's body branches on the input's rank with If nodes whose conditions fold."""
    theta = np.random.default_rng().standard_normal((2, 2, 3)).astype(np.float32)
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align)
    model = model_of([node], {"theta": theta}, ["grid"], {"size": np.array([2, 3, 4, 5], np.int64)}, opset=20)
    check_ref(model, {"theta": theta})


@pytest.mark.parametrize("cond", [True, False])
def test_an_if_on_a_constant_is_its_branch(cond):
    x = np.random.default_rng().standard_normal((2, 3)).astype(np.float32)

    def branch(op: str):
        return helper.make_graph([helper.make_node(op, ["x"], ["z"])], op, [], [helper.make_tensor_value_info("z", 1, [2, 3])])

    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("Relu"), else_branch=branch("Neg"))
    check_ref(model_of([node], {"x": x}, ["y"], {"c": np.array(cond)}), {"x": x})


def test_the_callers_model_is_left_alone():
    model, _ = center_crop_pad_case(np.random.default_rng())
    before = model.SerializeToString()
    parse_onnx(model)
    assert model.SerializeToString() == before


@needs_gpu_target
def test_gpu_function_bodies():
    rng = np.random.default_rng()
    check_gpu(*center_crop_pad_case(rng))
    check_gpu(*rotary_case(rng, 1))
