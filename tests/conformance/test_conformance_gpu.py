"""ONNX conformance on the gpu target: ONNX's own backend tests through `GpuFusegraphBackend`.

The cases are those of tests/test_conformance.py (the node tests of the installed onnx and the
light models), compiled for the gpu target (fused, one Triton kernel per group, default configs)
and run with every intermediate and output buffer poisoned with NaN first. On a machine with an
NVIDIA GPU the kernels run on it; without one, under Triton's interpreter on the CPU (tests/
conftest.py switches it on before Triton loads), which is how CI checks the generated code.
Outputs are compared with onnx's expected outputs and each case's rtol/atol, as for the
reference target:

- a case the reference target declines (an op without a parser, a ParseError) is SKIPPED,
  "unsupported: ...";
- a case whose fused program has a group the GPU target has no template for (`CodegenError`)
  is SKIPPED, "no gpu template: ...", and counted in its own column, so that the summary shows
  what the GPU target still lacks;
- a case listed in GPU_EXCLUDED (tests/conformance/exclusions.py, precision differences only)
  XFAILs with its reason, and fails once it passes; under the interpreter, a light model listed
  in GPU_INTERPRETER_EXCLUDED (ill-conditioned: equal logits) XFAILs, and passes when it passes;
- anything else that goes wrong is a FAILURE.

The light models are real networks (AlexNet, ResNet-50, VGG-19, ...): under the interpreter
they take from 10 s (SqueezeNet) to about 2 minutes each (ShuffleNet, Inception, VGG-19),
about 10 minutes for the nine on 2 cores, so there they are marked `slow` and run only when the
run selects them (`-m slow`); on a GPU they always run.
The per-op table and the list of what the GPU target lacks are printed at the end.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Callable

import pytest

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None:
    pytest.skip("the gpu target needs torch and triton (the 'gpu' extra)", allow_module_level=True)

from conformance import harness  # noqa: E402
from conformance.exclusions import GPU_EXCLUDED, GPU_INTERPRETER_EXCLUDED  # noqa: E402
from conformance.summary import GpuConformanceResults, gpu_conformance_results  # noqa: E402,F401  (fixture)

NODE_CASES = harness.node_cases()
LIGHT_CASES = harness.light_cases()


@functools.cache
def runs_on() -> str:
    """Where the kernels run: the GPU's name, or Triton's interpreter when there is no GPU.

    Asked of the gpu target itself (the rule `compile` applies), not decided here.
    """
    from fusegraph.targets.gpu.compiled_program import use_interpreter_without_gpu

    if use_interpreter_without_gpu():
        return "Triton interpreter (CPU)"
    import torch

    return torch.cuda.get_device_name()


def interpreted() -> bool:
    return runs_on().startswith("Triton interpreter")


def slow_selected(config: pytest.Config) -> bool:
    """Whether the run asked for slow tests by name (`-m slow`, `-m "slow or gpu"`)."""
    expr = config.getoption("markexpr", "") or ""
    return "slow" in expr and "not slow" not in expr


def excluded() -> dict[str, str]:
    """The exclusions where the kernels run now: the interpreter's own are added without a GPU."""
    return {**GPU_INTERPRETER_EXCLUDED, **GPU_EXCLUDED} if interpreted() else GPU_EXCLUDED


RecordProperty = Callable[[str, object], None]  # pytest's `record_property` fixture


def _check(case: harness.Case, results: GpuConformanceResults, record_property: RecordProperty) -> None:
    outcome = harness.run_gpu(case)
    where = runs_on()
    exclusions = excluded()
    if outcome.status is harness.Status.SKIP:
        reason = " ".join(outcome.message.split())
        if outcome.error == "CodegenError":
            results.record(record_property, case, "no-template", reason, where)
            pytest.skip("no gpu template: " + reason)
        results.record(record_property, case, "skip", reason, where)
        pytest.skip("unsupported: " + reason)
    if case.name in exclusions:
        if outcome.status is harness.Status.PASS:
            results.record(record_property, case, "pass", runs_on=where)
            if case.name in GPU_EXCLUDED:  # the interpreter's entries are not strict (see there)
                pytest.fail(f"{case.name} passes now on the gpu target ({where}): remove it from "
                            "GPU_EXCLUDED in tests/conformance/exclusions.py", pytrace=False)
            return
        results.record(record_property, case, "excluded", runs_on=where)
        pytest.xfail(exclusions[case.name])
    results.record(record_property, case, outcome.status.value, runs_on=where)
    if outcome.status is harness.Status.FAIL:
        pytest.fail(outcome.message, pytrace=False)


@pytest.mark.parametrize("case", NODE_CASES, ids=lambda c: c.name)
def test_node_gpu(case: harness.Case, gpu_conformance_results: GpuConformanceResults,  # noqa: F811
                  record_property: RecordProperty) -> None:
    _check(case, gpu_conformance_results, record_property)


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) for c in LIGHT_CASES],
                         ids=lambda c: c.name)
def test_light_model_gpu(case: harness.Case, gpu_conformance_results: GpuConformanceResults,  # noqa: F811
                         record_property: RecordProperty, request: pytest.FixtureRequest) -> None:
    if interpreted() and not slow_selected(request.config):
        pytest.skip("a light model takes minutes under Triton's interpreter: run with -m slow, or on a GPU")
    _check(case, gpu_conformance_results, record_property)


def test_gpu_exclusions_name_real_cases() -> None:
    names = {c.name for c in NODE_CASES + LIGHT_CASES}
    assert not sorted(set(GPU_EXCLUDED) - names), "GPU_EXCLUDED lists cases onnx does not have"
    assert not sorted(set(GPU_INTERPRETER_EXCLUDED) - names), \
        "GPU_INTERPRETER_EXCLUDED lists cases onnx does not have"
