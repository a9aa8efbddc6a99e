"""The public API (fusegraph.api, re-exported by `import fusegraph`) against ONNX Runtime.

A small convolution model is built here and run through every path the API offers (the ref
target unfused and fused, compiled for ref, compiled for gpu, which runs under Triton's
interpreter without a GPU), on fresh random inputs. A zoo light model checks the same on a real
network. Tolerances are relative norm errors against ONNX Runtime: 1e-5 on the ref target
(float32, sums in another order), 1e-4 on the gpu target (fp32 kernels), 2e-2 in fp16.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegraph
from fusegraph import api
from fusegraph.errors import ArgumentError, InputError
from fusegraph.targets.ref.runner import RefProgram
from tests.helpers import conv_silu_add_model, ort_run, rel_err


def fresh(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32),
            "y": rng.standard_normal((1, 4, 1, 1)).astype(np.float32)}


def test_the_package_re_exports_the_api() -> None:
    assert (fusegraph.parse_onnx, fusegraph.fuse, fusegraph.compile, fusegraph.run) == (
        api.parse_onnx, api.fuse, api.compile, api.run)


@pytest.mark.parametrize("seed", [3, 11])
def test_ref_paths_match_onnxruntime(seed: int) -> None:
    model, inputs = conv_silu_add_model(seed), fresh(seed + 100)
    (want,) = ort_run(model, inputs)
    program = fusegraph.parse_onnx(model)
    assert rel_err(fusegraph.run(program, inputs)["out"], want) < 1e-5
    compiled = fusegraph.compile(program, target="ref")
    assert isinstance(compiled, RefProgram) and compiled.output_names == ["out"]
    assert set(compiled.input_shapes) == {"x", "y"}
    assert rel_err(compiled.run(inputs)["out"], want) < 1e-5
    assert fusegraph.fuse(program) is program
    assert any(i.op.name == "fused" for i in program.main)
    assert rel_err(fusegraph.run(program, inputs, target="ref")["out"], want) < 1e-5
    assert rel_err(fusegraph.run(compiled, inputs)["out"], want) < 1e-5  # compiled before fusing: still right


def test_gpu_target_matches_onnxruntime() -> None:
    model, inputs = conv_silu_add_model(5), fresh(6)
    (want,) = ort_run(model, inputs)
    program = fusegraph.parse_onnx(model)
    compiled = fusegraph.compile(program, "gpu", tune=False)
    assert api.compiled_target(compiled) == "gpu"
    got = fusegraph.run(compiled, inputs, target="gpu")["out"]
    assert isinstance(got, np.ndarray) and rel_err(got, want) < 1e-4
    assert rel_err(fusegraph.run(program, inputs, target="gpu")["out"], want) < 1e-4
    assert not any(i.op.name == "fused" for i in program.main)  # compile fused a copy


def test_half_precision_on_both_targets() -> None:
    model, inputs = conv_silu_add_model(8), fresh(9)
    (want,) = ort_run(model, inputs)
    half = {k: v.astype(np.float16) for k, v in inputs.items()}
    for target in ("ref", "gpu"):
        got = fusegraph.compile(fusegraph.parse_onnx(model), target, fp16=True, tune=False).run(half)["out"]
        assert got.dtype == np.float16 and rel_err(got.astype(np.float32), want) < 2e-2, target


def test_a_zoo_model_matches_onnxruntime() -> None:
    from fusegraph import zoo
    from fusegraph.driver.verify import run_onnxruntime

    model = zoo.load("light_squeezenet")
    program = fusegraph.parse_onnx(model)
    rng = np.random.default_rng(21)
    inputs = {k: rng.random(s.lens, dtype=np.float32) for k, s in program.input_shapes.items()}
    theirs = run_onnxruntime(model.SerializeToString(), inputs)
    for name, value in fusegraph.run(fusegraph.fuse(program), inputs).items():
        assert rel_err(value, theirs[name]) < 1e-5, name


def test_wrong_arguments_name_themselves() -> None:
    model = conv_silu_add_model(1)
    program = fusegraph.parse_onnx(model)
    cases = [
        (lambda: fusegraph.compile(program, "cuda"), r"unknown target 'cuda'; the targets are: 'gpu', 'ref'"),
        (lambda: fusegraph.run(program, fresh(0), target="tpu"), "unknown target 'tpu'"),
        (lambda: fusegraph.compile(model), "program must be a fusegraph Program"),
        (lambda: fusegraph.fuse("model.onnx"), "program must be a fusegraph Program"),
        (lambda: fusegraph.compile(program, "ref", fp16="yes"), "fp16 must be True or False"),
        (lambda: fusegraph.compile(program, "ref", tune=1), "tune must be True or False"),
        (lambda: fusegraph.compile(program, "ref", fp16=True, bf16=True), "fp16 and bf16 exclude each other"),
        (lambda: fusegraph.compile(program, "gpu", progress="stderr"), "progress must be a callable"),
        (lambda: fusegraph.run(program, [np.zeros(3)]), "inputs must be a mapping"),
        (lambda: fusegraph.run(object(), fresh(0)), "program_or_compiled must be a Program"),
        (lambda: fusegraph.run(fusegraph.compile(program, "ref"), fresh(0), target="gpu"),
         "target='gpu', but the program is compiled for 'ref'"),
        (lambda: fusegraph.parse_onnx(42), "source must be a path, bytes"),
        (lambda: fusegraph.parse_onnx(model, input_dims=[1, 3, 8, 8]), "input_dims must be a mapping"),
        (lambda: fusegraph.parse_onnx(model, input_dims={"x": "1,3,8,8"}), r"input_dims\['x'\] must be a sequence"),
        (lambda: fusegraph.parse_onnx(model, input_dims={"x": [1, -3, 8, 8]}), r"input_dims\['x'\]"),
    ]
    for call, message in cases:
        with pytest.raises(ArgumentError, match=message):
            call()
    fused = fusegraph.fuse(fusegraph.parse_onnx(model))
    for target in ("ref", "gpu"):
        with pytest.raises(ArgumentError, match="fp16 converts the program before fusion"):
            fusegraph.compile(fused, target, fp16=True)


def test_bad_inputs_are_input_errors_on_both_targets() -> None:
    program = fusegraph.parse_onnx(conv_silu_add_model(2))
    for target in ("ref", "gpu"):
        compiled = fusegraph.compile(program, target, tune=False)
        with pytest.raises(InputError, match="missing.*'y'"):
            compiled.run({"x": fresh(0)["x"]})
        with pytest.raises(InputError, match="'x'"):
            fusegraph.run(compiled, {**fresh(0), "x": np.zeros((1, 3, 8, 9), np.float32)})
