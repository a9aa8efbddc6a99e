"""Resize against ONNX Runtime: linear and cubic under every coordinate transformation mode,
exclude_outside, nearest at non-integer factors, up and down, float and uint8 images, on the
reference target unfused and fused and on the gpu target under the interpreter; a returned
view that has no buffer (a nearest resize by whole factors, a depth-to-space) gets a copy
kernel on the gpu target. Antialiased downscales (linear and cubic) and tf_crop_and_resize (a
constant roi, any axes, with the extrapolation value outside the input) the same way."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import parse_onnx
from fusegraph.errors import ParseError
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


@pytest.mark.parametrize("scales", [[1, 1, 0.6, 0.45], [1, 1, 0.5, 1.5]], ids=["down", "mixed"])
@pytest.mark.parametrize("coord", MODES)
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialias(mode, coord, scales):
    """A downscale's filter widens by 1/scale (8 taps at 0.45 for cubic); upscaled axes keep
    theirs; align_corners maps the ends of the output's own length, as ONNX Runtime does here."""
    rng = np.random.default_rng()
    x = rng.standard_normal((1, 2, 9, 11)).astype(np.float32)
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode=mode, antialias=1, coordinate_transformation_mode=coord,
                            exclude_outside=int(coord == "asymmetric"))
    check_ref(model_of([node], {"x": x}, ["y"], {"s": np.array(scales, np.float32)}, opset=19), {"x": x},
              rtol=1e-4, atol=1e-5)


def crop_case(rng, mode: str, roi, sizes, axes=None, extrapolation_value=0.0, **attrs):
    x = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)
    extra = {"axes": axes, **attrs} if axes else attrs
    node = helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode=mode, extrapolation_value=extrapolation_value,
                            coordinate_transformation_mode="tf_crop_and_resize", **extra)
    inits = {"roi": np.array(roi, np.float32), "sizes": np.array(sizes, np.int64)}
    return model_of([node], {"x": x}, ["y"], inits, opset=19), {"x": x}


CROPS = [("linear", [0, 0, 0.2, 0.1, 1, 1, 0.9, 0.7], [1, 2, 4, 7], None),
         ("cubic", [0, 0, -0.3, 0.4, 1, 1, 0.8, 1.6], [1, 2, 6, 3], None),  # extrapolates on both axes
         ("nearest", [0.1, 0.5, 0.9, 1.2], [4, 1], [3, 2]),  # axes in reverse, one output row
         ("linear", [0.25, 0.75], [4], [3]),
         ("cubic", [0, 0, -0.9, 0.4, 1, 1, 0.8, 2.5], [1, 2, 6, 5], None)]  # windows wholly outside


@pytest.mark.parametrize("mode,roi,sizes,axes", CROPS)
def test_tf_crop_and_resize(mode, roi, sizes, axes):
    """Cubic windows renormalized over the taps inside (exclude_outside) too."""
    check_ref(*crop_case(np.random.default_rng(), mode, roi, sizes, axes, extrapolation_value=-7.5,
                         exclude_outside=int(mode == "cubic")), rtol=1e-4, atol=1e-5)


@needs_gpu_target
def test_gpu_antialias_and_crop():
    rng = np.random.default_rng()
    x = rng.standard_normal((1, 2, 9, 11)).astype(np.float32)
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode="cubic", antialias=1)
    check_gpu(model_of([node], {"x": x}, ["y"], {"s": np.array([1, 1, 0.6, 0.45], np.float32)}, opset=19), {"x": x},
              rtol=1e-4, atol=1e-5)
    check_gpu(*crop_case(rng, *CROPS[1], extrapolation_value=3.0), rtol=1e-4, atol=1e-5)


def test_bad_antialias_and_roi_name_the_node():
    x = np.zeros((1, 1, 4, 4), np.float32)
    bad = [(dict(antialias=2), {"s": np.array([1, 1, 0.5, 0.5], np.float32)}, ["x", "", "s"], "antialias"),
           (dict(coordinate_transformation_mode="tf_crop_and_resize"), {"s": np.array([1, 1, 0.5, 0.5], np.float32)},
            ["x", "", "s"], "roi input"),
           (dict(coordinate_transformation_mode="tf_crop_and_resize"),
            {"roi": np.array([0, 1], np.float32), "s": np.array([1, 1, 0.5, 0.5], np.float32)}, ["x", "roi", "s"], "roi has 2")]
    for attrs, inits, inputs, message in bad:
        node = helper.make_node("Resize", inputs, ["y"], name="rs1", mode="linear", **attrs)
        with pytest.raises(ParseError, match=message) as err:
            parse_onnx(model_of([node], {"x": x}, ["y"], inits, opset=19))
        assert "rs1" in str(err.value)
