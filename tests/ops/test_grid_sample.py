"""GridSample against ONNX Runtime: every mode, padding mode and corner alignment, coordinates
inside and well outside the input (where the padding modes differ), 2-d and 3-d, on the
reference target unfused and fused and on the gpu target under the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target


def grid_sample_case(rng, mode: str, padding: str, align: int, spatial=(4, 5)):
    x = rng.standard_normal((2, 3, *spatial)).astype(np.float32)
    grid = (rng.random((2, 3, 4, len(spatial)) if len(spatial) == 2 else (2, 2, 3, 2, 3)) * 3.4 - 1.7).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding, align_corners=align)
    return model_of([node], {"x": x, "g": grid}, ["y"], opset=20), {"x": x, "g": grid}


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_grid_sample(mode, padding, align):
    check_ref(*grid_sample_case(np.random.default_rng(), mode, padding, align), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("padding", ["zeros", "reflection"])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_grid_sample_3d(mode, padding):
    check_ref(*grid_sample_case(np.random.default_rng(), mode, padding, 0, (3, 4, 5)), rtol=1e-4, atol=1e-5)


@needs_gpu_target
@pytest.mark.parametrize("mode,padding", [("linear", "zeros"), ("cubic", "reflection"), ("nearest", "border")])
def test_gpu_grid_sample(mode, padding):
    check_gpu(*grid_sample_case(np.random.default_rng(), mode, padding, 0), rtol=1e-4, atol=1e-5)
