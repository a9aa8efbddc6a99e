"""Build every distinct kernel of zoo models for sm_90 with the Triton installed here, no GPU needed.

The H200 runs Triton 3.6 and CI Triton 3.9: a kernel that only 3.6 rejects (an op it lacks,
a pipelining it cannot do, too much shared memory) would first show on the GPU machine. Run
this under 3.6 (the venv of `tools/loop_loads.py`'s docstring) before a GPU session:

    PYTHONPATH=. /tmp/v36/bin/python tools/build_sm90.py bert_base convnext_tiny [--configs 2]

Per model: the fp16 program's distinct kernels, each under its first `--configs` candidates and
its first split-k candidate, built in two worker processes; then the builds, the failures (the
first five said in full) and the most shared memory a build asked for. Exits 1 on a failure.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fusegraph import parse_onnx  # noqa: E402
from fusegraph.ir.dtypes import DType  # noqa: E402
from fusegraph.ops.base import is_fused  # noqa: E402
from fusegraph.passes.pipeline import fuse  # noqa: E402
from fusegraph.passes.to_half import ToHalf  # noqa: E402
from fusegraph.targets.gpu.ahead_of_time import _without_interpreter, arg_dtypes  # noqa: E402
from fusegraph.targets.gpu.codegen import generate, kernel_inputs, plan_program  # noqa: E402
from fusegraph.targets.gpu.device import H200  # noqa: E402
from fusegraph.targets.gpu.kernel_source import KernelSource  # noqa: E402

Job = tuple[KernelSource, list[DType]]


def jobs_for(model: str, configs: int) -> list[Job]:
    """Each distinct fp16 kernel of `model` under its first `configs` candidates and first split-k one."""
    program = parse_onnx(model)
    ToHalf(DType.float16, keep_wide=True).apply(program.main)
    fuse(program)
    plan = plan_program(program.main)
    jobs, seen = [], set()
    for pos, ins in enumerate(i for i in program.main if is_fused(i)):
        src = generate(ins, pos, kernel_inputs(ins, plan))
        if src.name in seen:
            continue
        seen.add(src.name)
        picks = src.configs[:configs] + [c for c in src.configs[configs:] if c.get("SPLIT", 1) > 1][:1]
        jobs += [(replace(src, configs=[c]), arg_dtypes(ins, src)) for c in picks]
    return jobs


def build(job: Job) -> tuple[str | None, int]:
    """(None, shared bytes) for a kernel that builds; (what went wrong, 0) otherwise."""
    from fusegraph.targets.gpu.ahead_of_time import compile_for

    src = job[0]
    try:
        return None, compile_for(*job).shared_bytes
    except Exception as e:  # noqa: BLE001 - a failure is this tool's finding
        return f"{src.kernel_name} {src.configs[0]}: {type(e).__name__}: {str(e)[:300]}", 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="zoo names or .onnx paths")
    parser.add_argument("--configs", type=int, default=2, help="candidates per kernel, besides its first split-k one")
    args = parser.parse_args(argv)
    import triton

    print(f"triton {triton.__version__}, sm_90")
    failed = False
    for model in args.models:
        jobs = jobs_for(model, args.configs)
        start = time.monotonic()
        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"), initializer=_without_interpreter) as pool:
            results = list(pool.map(build, jobs))
        errors = [e for e, _ in results if e]
        most = max(s for _, s in results)
        print(f"{model}: {len(jobs)} builds in {time.monotonic() - start:.0f} s, {len(errors)} failed, "
              f"most shared memory {most} bytes (H200: {H200.shared_bytes_per_block})")
        for e in errors[:5]:
            print(f"  {e}")
        failed = failed or bool(errors) or most > H200.shared_bytes_per_block
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
