"""Every kernel of YOLOv5s compiles for the H200 (sm_90), without a GPU.

Triton builds PTX and a cubin for a named target on the CPU, so a generated kernel that the
GPU's compiler would reject (too much shared memory, a type error only the real backend
sees) fails here, in CI. The kernels are the fp16 ones with their default configs, the
variant the benchmarks run (at batch 1 and 32), and the fp32 ones of the 160x160 graph:
float32 operands take twice the shared memory of the same tiles. Pointers are taken as
16-byte aligned, as the launcher specializes them: Triton then pipelines, and asks for the
most shared memory.
"""

from __future__ import annotations

import os

import pytest

from fusegraph import parse_onnx
from fusegraph.ir.dtypes import DType
from fusegraph.ops.base import is_fused
from fusegraph.passes.pipeline import fuse
from fusegraph.passes.to_half import ToHalf
from fusegraph.targets.gpu.ahead_of_time import arg_dtypes, compile_many
from fusegraph.targets.gpu.codegen import generate, kernel_inputs, plan_program
from fusegraph.targets.gpu.device import H200


def _kernels(model: str, half: bool, batch: int = 1):
    if batch == 1:
        program = parse_onnx(model)
    else:  # the graph bench/yolov5s.py runs at batch 32: the large-tile candidates come first
        from fusegraph import zoo
        from fusegraph.onnx.rebatch import with_batch

        program = parse_onnx(with_batch(zoo.load(model), batch), input_dims={"images": [batch, 3, 640, 640]})
    if half:
        ToHalf(DType.float16).apply(program.main)
    fuse(program)
    plan = plan_program(program.main)
    out = []
    for pos, ins in enumerate(i for i in program.main if is_fused(i)):
        src = generate(ins, pos, kernel_inputs(ins, plan))
        out.append((src, arg_dtypes(ins, src)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("model,half,batch", [("yolov5s", True, 1), ("yolov5s-160", False, 1), ("yolov5s", True, 32)])
def test_every_yolov5s_kernel_compiles_for_sm90(model, half, batch):
    pytest.importorskip("triton")
    jobs = _kernels(model, half, batch)
    assert len(jobs) >= 50
    results = compile_many(jobs, workers=max(1, min(4, os.cpu_count() or 1)))
    for (src, _), r in zip(jobs, results):
        assert r.cubin_bytes > 0 and r.ptx_lines > 0, src.name
        assert r.shared_bytes <= H200.shared_bytes_per_block, f"{src.name} needs {r.shared_bytes} bytes of shared memory"


def test_layernorm_products_compile_for_sm90():
    """The layernorm kernels whose source only this target's compiler checks fully: a prologue
    layernorm normalized after the product (no split-k) and before it (split-k), and a
    layernorm over a product's channels in its epilogue, fp16, each under one such config."""
    pytest.importorskip("triton")
    from dataclasses import replace

    from onnx import helper

    from tests.helpers import make_model, rand
    from tests.passes.test_segment_layernorm import residual_norm_model

    prologue = make_model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["t"], axis=-1),
                           helper.make_node("MatMul", ["t", "w"], ["y"])], {"x": [1, 49, 768]}, ["y"],
                          {"g": rand(768, seed=1), "b": rand(768, seed=2), "w": rand(768, 3072, seed=3)})
    jobs = []
    for model in (prologue, residual_norm_model(96)):
        program = parse_onnx(model)
        ToHalf(DType.float16).apply(program.main)
        fuse(program)
        plan = plan_program(program.main)
        (ins,) = [i for i in program.main if is_fused(i)]
        src = generate(ins, 0, kernel_inputs(ins, plan))
        firsts = {c["SPLIT"] > 1: c for c in reversed(src.configs)}  # the first of each kind
        jobs += [(replace(src, configs=[c]), arg_dtypes(ins, src)) for c in firsts.values()]
    assert len(jobs) == 3  # the epilogue's kernel has no split-k candidate
    for (src, _), r in zip(jobs, compile_many(jobs, workers=2)):
        assert r.cubin_bytes > 0 and r.shared_bytes <= H200.shared_bytes_per_block, (src.kernel_name, src.configs)


def test_gathers_inside_a_layernorm_compile_for_sm90():
    """BERT's embeddings as one row kernel (both lookups in their sum's layernorm), fp16, under
    each of its candidate configs: the interpreter does not check what the compiler does."""
    pytest.importorskip("triton")
    from dataclasses import replace

    from tests.helpers import embedding_model

    program = parse_onnx(embedding_model(vocab=1000, seq=128, width=768))
    ToHalf(DType.float16).apply(program.main)
    fuse(program)
    plan = plan_program(program.main)
    (ins,) = [i for i in program.main if is_fused(i)]
    src = generate(ins, 0, kernel_inputs(ins, plan))
    assert src.kernel_name == "gather_add_layernorm"
    jobs = [(replace(src, configs=[c]), arg_dtypes(ins, src)) for c in src.configs]
    for (one, _), r in zip(jobs, compile_many(jobs, workers=2)):
        assert r.cubin_bytes > 0 and r.shared_bytes <= H200.shared_bytes_per_block, one.configs
