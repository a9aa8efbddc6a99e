"""Compiling many kernels at once, in worker processes.

Triton compiles a kernel in about a second and holds the interpreter lock for much of it,
so threads barely help. Worker processes each compile a share of the (kernel, config) pairs
through the kernel's own `warmup`, which stores the binary in Triton's on-disk cache; the
main process then finds every binary there at its first launch instead of compiling it.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable

from fusegraph.targets.gpu.kernel_source import Config, KernelSource

Job = tuple[KernelSource, list[Any], Config]  # source, torch dtypes of the arguments, config


def _warm(job: Job) -> str | None:
    from fusegraph.targets.gpu.kernel_loader import load_kernel

    src, dtypes, config = job
    try:
        fn = load_kernel(src)
        constexprs = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
        fn.warmup(*dtypes, grid=(1,), **constexprs, num_warps=config["num_warps"], num_stages=config["num_stages"])
        return None
    except Exception as e:  # noqa: BLE001 - reported, and the config is then skipped by the tuner
        return f"{src.name} {config}: {type(e).__name__}: {e}"


def compile_all(jobs: list[Job], progress: Callable[[str, int, int], None] | None = None,
                workers: int | None = None) -> list[str]:
    """Compile every job; returns the failures (a config that does not fit, say) as text."""
    if not jobs:
        return []
    workers = workers or max(1, min(len(jobs), (os.cpu_count() or 2) - 1, 32))
    failures: list[str] = []
    ctx = multiprocessing.get_context("spawn")  # a forked child would inherit the parent's CUDA context
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(_warm, job) for job in jobs]
        for done, f in enumerate(as_completed(futures), 1):
            err = f.result()
            if err:
                failures.append(err)
            if progress:
                progress("compiling kernels", done, len(jobs))
    return failures
