"""Compiling many kernels at once, in worker processes.

Triton compiles a kernel in about a second and holds the interpreter lock for much of it,
so threads barely help. Worker processes each compile a share of the (kernel, config) pairs
through the kernel's own `warmup`, which stores the binary in Triton's on-disk cache; the
main process then finds every binary there at its first launch instead of compiling it.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import time
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

from fusegraph.targets.gpu.errors import CodegenError
from fusegraph.targets.gpu.kernel_source import Config, KernelSource

Job = tuple[KernelSource, list[Any], Config]  # source, torch dtypes of the arguments, config

# Seconds one build may take before its worker stops it (`FUSEGRAPH_BUILD_LIMIT_S`): a build
# takes 1-30 s, and one that never ends (an exhaustive tune's huge tile, say) would otherwise
# hang the whole compile.
BUILD_LIMIT_ENV = "FUSEGRAPH_BUILD_LIMIT_S"
DEFAULT_BUILD_LIMIT_S = 300.0


def build_limit_s() -> float:
    """The per-build limit in seconds, from the environment (default DEFAULT_BUILD_LIMIT_S)."""
    text = os.environ.get(BUILD_LIMIT_ENV, "").strip()
    if not text:
        return DEFAULT_BUILD_LIMIT_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise CodegenError(f"{BUILD_LIMIT_ENV}={text!r}: give the seconds one kernel build may take, a number above 0")
    return value


@dataclass
class BuildReport:
    """What compiling a batch of (kernel, config) jobs cost: a slow cold compile is explained by
    its slowest builds (a template whose unrolled loops take seconds, say), not guessed at."""

    failures: list[str] = field(default_factory=list)  # a config that does not fit, say, as text
    stopped: set[int] = field(default_factory=set)  # jobs whose builds reached the limit (positions)
    seconds: list[tuple[float, str]] = field(default_factory=list)  # (build seconds, "kernel config")
    workers: int = 0
    wall_seconds: float = 0.0

    def slowest(self, n: int = 3) -> list[tuple[float, str]]:
        return sorted(self.seconds, reverse=True)[:n]


def _warm(job: Job) -> tuple[str | None, float]:
    from fusegraph.targets.gpu.kernel_loader import load_kernel

    src, dtypes, config = job
    start = time.monotonic()
    try:
        fn = load_kernel(src)
        constexprs, options = src.launch_arguments(config)
        fn.warmup(*dtypes, grid=(1,), **constexprs, **options)
        return None, time.monotonic() - start
    except Exception as e:  # noqa: BLE001 - reported, and the config is then skipped by the tuner
        return f"{src.name} {config}: {type(e).__name__}: {e}", time.monotonic() - start


class _BuildStopped(BaseException):
    """Raised in a worker when its build reaches the limit; a BaseException, so that no
    `except Exception` in the build swallows it."""


def _limited(build: Callable[[Job], tuple[str | None, float]], limit: float, job: Job) -> tuple[str | None, float, bool]:
    """`build(job)` in a worker process, stopped by an alarm after `limit` seconds: (failure or
    None, seconds, whether it was stopped). The alarm interrupts Python code and the waits on
    the assembler's subprocess (which `subprocess.run` then kills); a build stuck inside one
    call of the compiler's native code ends only when that call returns."""
    def stop(signum: int, frame: Any) -> None:
        raise _BuildStopped

    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, stop)
    if math.isfinite(limit):  # "inf": no limit
        signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        err, seconds = build(job)
        return err, seconds, False
    except _BuildStopped:
        src, _, config = job
        return (f"{src.name} {config}: build stopped after {limit:g} s ({BUILD_LIMIT_ENV} sets the limit)",
                time.monotonic() - start, True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class ParallelBuild:
    """Jobs building in worker processes while the caller goes on: `wait` blocks only until
    the jobs it names are built, so the tuner times a kernel's candidates as soon as they are
    in Triton's cache while the workers build the later kernels' (the tuning then costs no wall
    time but what trails the last build). Leaving the context waits for every job. A build
    that reaches `limit_s` (default `build_limit_s()`) is stopped and reported, and its job's
    position joins `report.stopped`: the tuner must not launch that config, which would build
    it again in the calling process."""

    def __init__(self, jobs: list[Job], progress: Callable[[str, int, int], None] | None = None,
                 workers: int | None = None, build: Callable[[Job], tuple[str | None, float]] | None = None,
                 limit_s: float | None = None) -> None:
        self.jobs, self.progress = jobs, progress
        self.build = partial(_limited, build or _warm, limit_s or build_limit_s())
        self.report = BuildReport()
        self.report.workers = workers or max(1, min(len(jobs), (os.cpu_count() or 2) - 1, 32))
        self._futures: list[Future] = []
        self._recorded: set[int] = set()
        self.finished_at = 0.0  # when the last job was built (time.monotonic)

    def __enter__(self) -> "ParallelBuild":
        self._start = self.finished_at = time.monotonic()
        if self.jobs:
            self._pool = worker_pool(self.report.workers)
            self._futures = [self._pool.submit(self.build, job) for job in self.jobs]
            for f in self._futures:  # the time each build ends, not when the caller looks
                f.add_done_callback(self._finished)
        return self

    def _finished(self, _: Future) -> None:
        self.finished_at = max(self.finished_at, time.monotonic())

    def wait(self, indices: list[int]) -> None:
        """Block until jobs `indices` (positions in the job list) are built."""
        for _ in as_completed([self._futures[i] for i in indices]):
            self._record()  # each completion, so progress moves while a long wait lasts

    def __exit__(self, error: type[BaseException] | None, *rest: object) -> None:
        if not self._futures:
            return
        if error is not None:  # the caller gave up: no need of the builds still queued
            self._pool.shutdown(wait=False, cancel_futures=True)
            return
        self.wait(list(range(len(self._futures))))
        self._pool.shutdown()
        self.report.wall_seconds = self.finished_at - self._start

    def _record(self) -> None:
        """Add every job built so far to the report, in the order they finished here."""
        new = False
        for i, f in enumerate(self._futures):
            if i in self._recorded or not f.done():
                continue
            self._recorded.add(i)
            new = True
            err, seconds, stopped = f.result()
            src, _, config = self.jobs[i]
            self.report.seconds.append((seconds, f"{src.name} {config}"))
            if err:
                self.report.failures.append(err)
            if stopped:
                self.report.stopped.add(i)
        if self.progress and new:
            self.progress("compiling kernels", len(self._recorded), len(self.jobs))


def compile_all(jobs: list[Job], progress: Callable[[str, int, int], None] | None = None,
                workers: int | None = None) -> BuildReport:
    """Compile every job; the report lists the failures and what each build took."""
    with ParallelBuild(jobs, progress, workers) as build:
        pass
    return build.report


#: the sections of Triton's settings (`triton.knobs`) that can change a kernel's binary or cache key
KNOB_SECTIONS = ("build", "cache", "compilation", "language", "nvidia", "amd")


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """Spawned worker processes (a forked child would inherit the parent's CUDA context) that
    build with this process's Triton settings. A spawned child reads Triton's settings from the
    environment, so a setting made in this process's memory would differ there, and with it
    the cache key: the workers' binaries would then go unused and this process would build
    each one again at its first launch, one at a time (torch.compile sets Triton's libdevice
    path that way; after it had run, tuning took minutes)."""
    ctx = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=apply_knobs,
                               initargs=(explicit_knobs(),))


def explicit_knobs() -> dict[str, dict[str, Any]]:
    """The Triton settings made in this process's memory (plain values), by section."""
    try:
        from triton import knobs
    except ImportError:  # an older Triton without the knobs module reads only the environment
        return {}
    out = {}
    for section in KNOB_SECTIONS:
        values = {k: v for k, v in vars(getattr(knobs, section, object())).items()
                  if isinstance(v, (str, int, float, bool))}
        if values:
            out[section] = values
    return out


def apply_knobs(settings: dict[str, dict[str, Any]]) -> None:
    """Make `explicit_knobs()` of the parent this process's settings too."""
    if not settings:
        return
    from triton import knobs

    for section, values in settings.items():
        for name, value in values.items():
            setattr(getattr(knobs, section), name, value)
