"""The reference target is the oracle of every other test: check it against ONNX Runtime on
whole models, with fresh random inputs, at the tolerance `fusegraph verify` states."""

from __future__ import annotations

import pytest

from fusegraph import api, parse_onnx, zoo
from fusegraph.driver.inputs import input_ranges, random_inputs
from fusegraph.driver.verify import compare, run_onnxruntime
from tests.zoo_params import exported

SMALL = ["yolov5s-160", "yolov5s-bn-160", "light_bvlc_alexnet", "light_densenet121", "light_inception_v1",
         "light_inception_v2", "light_resnet50", "light_shufflenet", "light_squeezenet", "light_zfnet512"]
# EfficientNet-B1 with the zoo's weights is ill-conditioned in float32 on some inputs: at seed 7
# the ref target is 8.6e-6 and ONNX Runtime 2.2e-5 away from a float64 evaluation of the graph.
TOLERANCE = {"efficientnet_b1": 5e-5}
SLOW = [pytest.param(n, marks=pytest.mark.slow) for n in ("yolov5s", "yolov5s-bn", "light_vgg19")]


@pytest.mark.parametrize("name", SMALL + SLOW + exported())
def test_ref_matches_onnxruntime(name):
    model = zoo.load(name)
    program = parse_onnx(model)
    inputs = random_inputs(program.input_shapes, seed=7, ranges=input_ranges(program))
    ours = api.run(program, inputs)
    theirs = run_onnxruntime(model.SerializeToString(), inputs)
    for out, value in ours.items():
        c = compare(out, value, theirs[out], TOLERANCE.get(name, 1e-5))
        assert c.passed, c.line()
