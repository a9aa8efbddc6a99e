"""Programmatic dependent launch (kernel_source.py `with_dependent_launch`): by default the short
kernels on a GPU that has it (sm_90 and later), `FUSEGRAPH_DEPENDENT_LAUNCH=1` every kernel, `=0`
none. Such a kernel waits for the one before it before its first load or store, then lets the
next one launch, and is launched with Triton's `launch_pdl` option; before its wait a product
prefetches its weight into L2 (`templates/gemm_prefetch.py`). The interpreter, which runs one
kernel at a time, gets the plain kernels. The sm_90 build shows the two grid-dependency
instructions in the PTX."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import pytest

from fusegraph import parse_onnx
from fusegraph.passes.pipeline import fuse
from fusegraph.targets.gpu import codegen
from fusegraph.targets.gpu.codegen import program_kernels
from fusegraph.targets.gpu.device import H200
from fusegraph.targets.gpu.errors import CodegenError
from fusegraph.targets.gpu.kernel_source import DEPENDENT_LAUNCH_ENV, DEPENDENT_LAUNCH_LINES, with_dependent_launch
from tests.gpu.test_gpu_kernels import check_gpu, node
from tests.helpers import make_model, rand


def two_kernel_model():
    """A conv + relu, then a softmax over each channel's pixels: two kernels. The conv's weight
    is its larger operand (32 output channels, 16 pixels), so its kernel prefetches it."""
    return make_model([node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Relu", ["c"], ["r"]),
                       node("Flatten", ["r"], ["f"], axis=2), node("Softmax", ["f"], ["y"], axis=-1)],
                      {"x": [1, 8, 4, 4]}, ["y"], {"w": rand(32, 8, 3, 3, seed=1, scale=0.3)})


def test_every_compiled_kernel_waits_first_and_launches_dependent(monkeypatch):
    monkeypatch.setenv(DEPENDENT_LAUNCH_ENV, "1")
    program = parse_onnx(two_kernel_model())
    fuse(program)
    kernels = program_kernels(program)
    assert len(kernels) == 2
    for src in kernels:
        lines = src.body.split("\n")
        at = next(i for i, line in enumerate(lines) if line.startswith(f"def {src.name}("))
        wait = at + 1 + len(src.before_wait)
        assert lines[at + 1:wait] == src.before_wait
        assert lines[wait:wait + 2] == DEPENDENT_LAUNCH_LINES
        assert src.dependent_launch
        constexprs, options = src.launch_arguments(src.configs[0])
        assert options["launch_pdl"] is True and "launch_pdl" not in constexprs
    monkeypatch.setenv(DEPENDENT_LAUNCH_ENV, "0")
    plain = program_kernels(program)
    assert all(not s.dependent_launch and "gdc_wait" not in s.body and "prefetch" not in s.body for s in plain)
    assert {s.name for s in plain}.isdisjoint(s.name for s in kernels)  # other sources, other names


@pytest.mark.parametrize("capability, expected", [(80, False), (89, False), (90, True), (100, True)])
def test_by_default_the_gpus_that_have_it_get_it(monkeypatch, capability, expected):
    monkeypatch.delenv(DEPENDENT_LAUNCH_ENV, raising=False)
    monkeypatch.setattr(codegen, "current_device", lambda: replace(H200, capability=capability))
    program = parse_onnx(two_kernel_model())
    fuse(program)
    assert all(s.dependent_launch == expected for s in program_kernels(program))


def test_by_default_only_the_short_kernels_get_it(monkeypatch):
    """A 1x1 conv writing 2^21 elements is launched early by default, one writing twice as many
    is not; FUSEGRAPH_DEPENDENT_LAUNCH=1 takes every kernel, =0 none."""
    def conv_of(pixels):
        model = make_model([node("Conv", ["x", "w"], ["y"])], {"x": [1, 8, pixels, 64]}, ["y"],
                           {"w": rand(32, 8, 1, 1, seed=3)})
        program = parse_onnx(model)
        fuse(program)
        (src,) = program_kernels(program)
        return src

    monkeypatch.delenv(DEPENDENT_LAUNCH_ENV, raising=False)
    assert codegen.EARLY_LAUNCH_MAX_ELEMENTS == 32 * 1024 * 64
    assert conv_of(1024).dependent_launch and not conv_of(2048).dependent_launch
    monkeypatch.setenv(DEPENDENT_LAUNCH_ENV, "1")
    assert conv_of(2048).dependent_launch
    monkeypatch.setenv(DEPENDENT_LAUNCH_ENV, "0")
    assert not conv_of(1024).dependent_launch


def test_a_wrong_setting_is_named(monkeypatch):
    monkeypatch.setenv(DEPENDENT_LAUNCH_ENV, "yes")
    program = parse_onnx(two_kernel_model())
    fuse(program)
    with pytest.raises(CodegenError, match="FUSEGRAPH_DEPENDENT_LAUNCH='yes': use 1 .* or 0"):
        program_kernels(program)


def test_only_a_product_with_a_weight_prefetches_it_before_its_wait(monkeypatch):
    """The conv's weight is a literal: its kernel prefetches it, one lane a line (32 floats)
    apart along the weight's contiguous axis, the first row tile only; the softmax reads
    nothing constant, and a product of two inputs has no weight."""
    monkeypatch.setenv(DEPENDENT_LAUNCH_ENV, "1")
    program = parse_onnx(two_kernel_model())
    fuse(program)
    conv, softmax = program_kernels(program)
    assert softmax.before_wait == []
    text = "\n".join(conv.before_wait)
    assert "prefetch.global.L2" in text and "tl.program_id(0) == 0" in text and "* 32" in text
    assert "tl.load" not in text and "tl.store" not in text and "gdc_wait" not in text
    product = make_model([node("MatMul", ["a", "b"], ["y"])], {"a": [1, 8, 16], "b": [1, 16, 24]}, ["y"])
    program = parse_onnx(product)
    fuse(program)
    (mm,) = program_kernels(program)
    assert mm.before_wait == [] and "gdc_wait" in mm.body


@pytest.mark.parametrize("rows, prefetched", [(16, True), (32, True), (33, False), (64, False)])
def test_a_weight_is_prefetched_where_it_is_the_larger_operand(monkeypatch, rows, prefetched):
    """x [rows, 16] @ W [16, 32]: the weight's reads decide the time while rows <= 32."""
    monkeypatch.setenv(DEPENDENT_LAUNCH_ENV, "1")
    product = make_model([node("MatMul", ["a", "w"], ["y"])], {"a": [rows, 16]}, ["y"], {"w": rand(16, 32, seed=2)})
    program = parse_onnx(product)
    fuse(program)
    (mm,) = program_kernels(program)
    assert bool(mm.before_wait) == prefetched


def test_the_interpreter_runs_the_plain_kernels(monkeypatch):
    monkeypatch.setenv(DEPENDENT_LAUNCH_ENV, "1")
    compiled = check_gpu(two_kernel_model())  # the values, either way
    interpreted = compiled.kernels[0].src.interpret
    assert all(k.src.dependent_launch != interpreted for k in compiled.kernels)


def test_a_dependent_launch_kernel_builds_for_sm90(monkeypatch):
    pytest.importorskip("triton")
    from fusegraph.ir.dtypes import DType

    monkeypatch.setenv(DEPENDENT_LAUNCH_ENV, "0")
    program = parse_onnx(two_kernel_model())
    fuse(program)
    conv, softmax = (with_dependent_launch(k) for k in program_kernels(program))
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_compiled) as pool:
        ptx = [pool.submit(_ptx, src, [DType.float32] * len(src.args)).result(timeout=300) for src in (conv, softmax)]
    assert all("griddepcontrol.wait" in p and "griddepcontrol.launch_dependents" in p for p in ptx)
    assert "prefetch.global.L2" in ptx[0] and "prefetch.global.L2" not in ptx[1]
    assert ptx[0].index("prefetch.global.L2") < ptx[0].index("griddepcontrol.wait")


def _compiled() -> None:
    import os

    os.environ.pop("TRITON_INTERPRET", None)


def _ptx(src, dtypes) -> str:
    from fusegraph.targets.gpu.ahead_of_time import build_for

    return build_for(src, dtypes).asm["ptx"]
