"""Kernels are named by what they compute, so a model's repeated blocks build and tune once.

Runs without a GPU: code generation only, plus one run under the interpreter to show that
kernels sharing one function still compute their own instruction's values.
"""

from __future__ import annotations

import re

import numpy as np
from onnx import helper

from fusegraph import api
from fusegraph.targets.gpu.codegen import program_kernels
from tests.helpers import make_model, ort_run, rand


def _blocks_model():
    """Four conv + relu blocks: the middle two equal (repeated blocks: the first reads the model's
    NCHW input, the others channels-last activations), the last with other channel counts."""
    nodes, weights = [], {}
    shapes = [(8, 8), (8, 8), (8, 8), (16, 8)]
    x = "x"
    for i, (cout, cin) in enumerate(shapes):
        weights[f"w{i}"] = rand(cout, cin, 3, 3, seed=i, scale=0.2)
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x = f"r{i}"
    return make_model(nodes, {"x": [1, 8, 10, 10]}, [x], weights)


def test_equal_groups_get_one_kernel_and_other_shapes_another():
    program = api.fuse(api.parse_onnx(_blocks_model()))
    kernels = program_kernels(program)
    assert len(kernels) == 4
    assert all(re.fullmatch(r"k_[0-9a-f]{10}_conv_relu", k.name) for k in kernels)
    assert kernels[1].name == kernels[2].name and kernels[1].digest == kernels[2].digest
    assert kernels[1].source == kernels[2].source
    assert len({k.name for k in kernels}) == 3  # the NCHW reader and the 16-channel block differ
    assert sum(f"def {kernels[1].name}(" in k.source for k in kernels) == 2


def test_kernels_sharing_a_function_compute_their_own_values():
    """The two equal kernels run one Triton function (interpreter here) on their own buffers:
    the model's output matches ONNX Runtime's on random inputs."""
    model = _blocks_model()
    compiled = api.compile(api.parse_onnx(model), "gpu")
    assert len({k.src.digest for k in compiled.kernels}) == 3 and len(compiled.kernels) == 4
    assert compiled.kernels[1].fn is compiled.kernels[2].fn
    x = np.random.default_rng().standard_normal((1, 8, 10, 10)).astype(np.float32)
    got = np.asarray(compiled.run({"x": x})[compiled.program.main.return_names[0]])
    expected = ort_run(model, {"x": x})[0]
    assert np.abs(got - expected).max() <= 1e-4 * max(1.0, float(np.abs(expected).max()))

