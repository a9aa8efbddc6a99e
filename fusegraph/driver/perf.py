"""`fusegraph perf`: time a compiled program kernel by kernel and as a whole.

The per-kernel lines and the summary follow MIGraphX's driver, so numbers can be read side
by side: each kernel's time (launched alone, ten times in a CUDA graph) and its share of the
sum, then the kernels grouped by name, then the whole program's GPU time from CUDA-graph
replays (min, max, mean, median and percentiles), the rate, and the overhead: graph time
minus the sum of kernel times.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np


def kernel_line(kernel: Any, ms: float, total: float, names: dict[int, str], config: bool = False) -> str:
    """`@7 = conv_add_sigmoid_mul(@5,@1,@6) -> half_type, {...}, {...}: 0.0065ms, 1%`, names as
    printed; with `config`, the launch config the tuner chose follows in brackets."""
    ins = kernel.ins
    args = ",".join(names.get(id(x), "?") for x in ins.inputs)
    line = f"{names[id(ins)]} = {kernel.src.kernel_name}({args}) -> {ins.shape}: {ms:.4f}ms, {100 * ms / total:.0f}%"
    if config:
        line += "  [" + " ".join(f"{k}={v}" for k, v in kernel.config.items()) + "]"
    return line


def early_launches(compiled: Any) -> int:
    """How many kernels are built for programmatic dependent launch (codegen.launches_early)."""
    return sum(k.src.dependent_launch for k in compiled.kernels)


def launch_note(compiled: Any) -> str:
    """What the launch line adds under dependent launch: a kernel's own time, measured alone,
    no longer adds up to the run's, since each starts while the one before it finishes."""
    early = early_launches(compiled)
    if not early:
        return ""
    prefetching = sum(bool(k.src.before_wait) for k in compiled.kernels if k.src.dependent_launch)
    return (f"; {early} with dependent launch, each started while the one before it runs, "
            f"{prefetching} of them prefetching their weights first")


def perf_report(compiled: Any, iterations: int, configs: bool = False) -> str:
    kernel_ms = compiled.time_kernels(iterations)
    runs = np.array(compiled.time_runs(max(iterations, 20)))
    total_kernels = float(sum(kernel_ms))
    names = {id(ins): f"@{pos}" for pos, ins in enumerate(compiled.program.main.instructions)}
    lines = [kernel_line(k, ms, total_kernels, names, configs) for k, ms in zip(compiled.kernels, kernel_ms)]
    lines.append("")
    lines.append("Summary:")
    groups: dict[str, list[float]] = {}
    for k, ms in zip(compiled.kernels, kernel_ms):
        groups.setdefault(k.src.kernel_name, []).append(ms)
    for name, times in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        s = sum(times)
        lines.append(f"{name}: {s:.4f}ms / {len(times)} = {s / len(times):.4f}ms, {100 * s / total_kernels:.0f}%")
    batch = next(iter(compiled.input_shapes.values())).lens[0] if compiled.input_shapes else 1
    mean = float(runs.mean())
    lines += [
        "",
        f"Batch size: {batch}",
        f"Rate: {1000.0 * batch / float(np.median(runs)):.1f} inferences/sec",
        f"Total time: {mean:.4f}ms (Min: {runs.min():.4f}ms, Max: {runs.max():.4f}ms, Mean: {mean:.4f}ms, "
        f"Median: {np.median(runs):.4f}ms)",
        f"Percentiles (90%, 95%, 99%): ({np.percentile(runs, 90):.4f}ms, {np.percentile(runs, 95):.4f}ms, "
        f"{np.percentile(runs, 99):.4f}ms)",
        f"Total instructions time: {total_kernels:.4f}ms",
        f"Overhead time: {float(np.median(runs)) - total_kernels:.4f}ms (graph median minus the kernels' sum"
        + ("; below zero where kernels overlap)" if early_launches(compiled) else ")"),
        f"Kernels launched per run: {compiled.kernel_count} (replayed from one CUDA graph{launch_note(compiled)})",
        f"Memory: {compiled.plan.describe()}",
        f"Compile time: {compiled.compile_seconds:.1f} s (plus {compiled.startup_seconds:.1f} s importing torch and "
        f"creating the CUDA context, once per process)",
    ] + compile_phase_lines(compiled)
    return "\n".join(lines)


def compile_phase_lines(compiled: Any) -> list[str]:
    """Where the compile time went, and the slowest kernel builds: a cold compile that takes
    minutes should say which kernels made it so."""
    if not compiled.phase_seconds:
        return []
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in compiled.phase_seconds.items())
    lines = [f"Compile phases: {phases}"]
    build = compiled.build_report
    if build is not None and build.seconds:
        total = sum(s for s, _ in build.seconds)
        lines.append(f"Builds: {len(build.seconds)} kernel configs, {total:.1f} s of build time on {build.workers} "
                     f"workers ({build.wall_seconds:.1f} s wall); slowest:")
        lines += [f"  {s:.1f} s {what}" for s, what in build.slowest(5)]
    return lines


def chrome_trace(compiled: Any) -> str:
    """One run, each kernel timed between events, as a Chrome trace (chrome://tracing, Perfetto)."""
    import torch

    events = []
    starts = [torch.cuda.Event(enable_timing=True) for _ in compiled.kernels]
    ends = [torch.cuda.Event(enable_timing=True) for _ in compiled.kernels]
    first = torch.cuda.Event(enable_timing=True)
    first.record()
    for k, s, e in zip(compiled.kernels, starts, ends):
        s.record()
        compiled.bound.launch(k)
        e.record()
    torch.cuda.synchronize()
    for k, s, e in zip(compiled.kernels, starts, ends):
        events.append({"name": k.src.kernel_name, "cat": k.src.template, "ph": "X", "pid": 0, "tid": 0,
                       "ts": first.elapsed_time(s) * 1000.0, "dur": s.elapsed_time(e) * 1000.0,
                       "args": {"instruction": k.ins.name, "function": k.src.name, "config": k.config}})
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}, indent=1)
