"""Resize against ONNX Runtime: linear and cubic under every coordinate transformation mode,
exclude_outside, nearest at non-integer factors, up and down, float and uint8 images, on the
reference target unfused and fused and on the gpu target under the interpreter; a returned
view that has no buffer (a nearest resize by whole factors, a depth-to-space) gets a copy
kernel on the gpu target."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target

MODES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]


def resize_case(rng, mode: str, coord: str, scales, dtype=np.float32, **attrs):
    x = (rng.random((1, 2, 4, 5)) * 200).astype(dtype)
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode=mode, coordinate_transformation_mode=coord, **attrs)
    return model_of([node], {"x": x}, ["y"], {"s": np.array(scales, np.float32)}, opset=19), {"x": x}


@pytest.mark.parametrize("scales", [[1, 1, 1.5, 0.6], [1, 1, 2, 3]], ids=["mixed", "up"])
@pytest.mark.parametrize("coord", MODES)
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize(mode, coord, scales):
    check_ref(*resize_case(np.random.default_rng(), mode, coord, scales), rtol=1e-4, atol=1e-3)


def test_cubic_exclude_outside_and_nearest_fractional():
    rng = np.random.default_rng()
    check_ref(*resize_case(rng, "cubic", "half_pixel", [1, 1, 0.8, 1.7], exclude_outside=1, cubic_coeff_a=-0.5),
              rtol=1e-4, atol=1e-3)
    check_ref(*resize_case(rng, "nearest", "asymmetric", [1, 1, 1.5, 0.6], nearest_mode="ceil"), rtol=0, atol=0)


def test_uint8_image():
    check_ref(*resize_case(np.random.default_rng(), "linear", "half_pixel", [1, 1, 2, 2], np.uint8), rtol=0, atol=1)


@needs_gpu_target
@pytest.mark.parametrize("mode,coord", [("linear", "align_corners"), ("cubic", "half_pixel"), ("nearest", "asymmetric")])
def test_gpu_resize(mode, coord):
    check_gpu(*resize_case(np.random.default_rng(), mode, coord, [1, 1, 1.5, 0.6]), rtol=1e-4, atol=1e-3)


@needs_gpu_target
def test_gpu_returned_bufferless_views():
    rng = np.random.default_rng()
    check_gpu(*resize_case(rng, "nearest", "asymmetric", [1, 1, 2, 2]), rtol=0, atol=0)
    x = rng.standard_normal((1, 8, 2, 3)).astype(np.float32)
    check_gpu(model_of([helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2)], {"x": x}, ["y"]), {"x": x})
