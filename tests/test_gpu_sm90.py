"""Every kernel of YOLOv5s compiles for the H200 (sm_90), without a GPU.

Triton builds PTX and a cubin for a named target on the CPU, so a generated kernel that the
GPU's compiler would reject (too much shared memory, a type error only the real backend
sees) fails here, in CI. The kernels are the fp16 ones with their default configs, the
variant the benchmarks run, and the fp32 ones of the 160x160 graph: float32 operands take
twice the shared memory of the same tiles.
"""

from __future__ import annotations

import os

import pytest

from fusegraph import parse_onnx
from fusegraph.ir.dtypes import DType
from fusegraph.passes.pipeline import fuse
from fusegraph.passes.to_half import ToHalf
from fusegraph.targets.gpu.ahead_of_time import arg_dtypes, compile_many
from fusegraph.targets.gpu.codegen import generate, kernel_inputs, plan_program

H200_SHARED_BYTES = 232448  # 227 KiB per block


def _kernels(model: str, half: bool):
    program = parse_onnx(model)
    if half:
        ToHalf(DType.float16).apply(program.main)
    fuse(program)
    plan = plan_program(program.main)
    out = []
    for pos, ins in enumerate(i for i in program.main if i.op.name == "fused"):
        src = generate(ins, pos, kernel_inputs(ins, plan))
        out.append((src, arg_dtypes(ins, src)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("model,half", [("yolov5s", True), ("yolov5s-160", False)])
def test_every_yolov5s_kernel_compiles_for_sm90(model, half):
    pytest.importorskip("triton")
    jobs = _kernels(model, half)
    assert len(jobs) >= 50
    results = compile_many(jobs, workers=max(1, min(4, os.cpu_count() or 1)))
    for (src, _), r in zip(jobs, results):
        assert r.cubin_bytes > 0 and r.ptx_lines > 0, src.name
        assert r.shared_bytes <= H200_SHARED_BYTES, f"{src.name} needs {r.shared_bytes} bytes of shared memory"
