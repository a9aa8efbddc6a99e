"""Timing helpers for the benchmarks: CUDA-graph replays timed with events, kernel counts, tables.

Why these and not a plain `time.time()` loop: GPU work is asynchronous, a small kernel is
shorter than its launch, and an input that fits in the 60 MB L2 of an H200 is read from the
cache when one run follows another. So:

* `time_gpu` times each run with a pair of CUDA events around it, after warm-up, and reports
  the median (also min, p90 and mean) over many runs. Runs are usually CUDA-graph replays
  (`capture_graph`), so launch overhead is one graph launch. Before each chunk of short runs
  a sleep kernel holds the GPU while the CPU queues the chunk (checked, and lengthened if
  the CPU still fell behind), so the events bracket GPU work and not the CPU's launch gaps. It can rotate among several prepared runs (one per input
  set, so that repeated runs do not hit in L2) or flush L2 before every run by writing a
  256 MB buffer (outside the timed region).
* `time_calls` times a Python callable as it is really used (eager PyTorch, torch.compile):
  batches of back-to-back calls between two events, per-call time = batch time / calls. It
  includes Python and launch overhead whenever the CPU, not the GPU, is the bottleneck.
* `kernel_time` reads each run's GPU time from the profiler's kernel records (first kernel's
  start to last kernel's end), leaving out the graph launch that `time_gpu`'s events include:
  for a run of one 5 us kernel, that launch is a large share of the event time.
* `count_kernels` counts the GPU kernels of one run with torch.profiler (copies and memsets
  counted apart).
* `copy_bandwidth` measures a large device-to-device copy once, the practical memory ceiling
  that the benchmarks' byte floors are divided by.
* `write_results` writes markdown tables to bench/results/<name>.md under a header giving the
  command line, GPU, torch/triton versions and the date.
"""

from __future__ import annotations

import collections
import datetime
import platform
import shlex
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"
L2_FLUSH_BYTES = 256 * 1024 * 1024


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Timing:
    """Per-run times in microseconds: median (the figure to report), min, p90, mean, run count."""

    median_us: float
    min_us: float
    p90_us: float
    mean_us: float
    runs: int
    method: str

    @staticmethod
    def from_samples(samples_us: Sequence[float], method: str) -> "Timing":
        if not samples_us:
            raise ValueError("no samples")
        s = sorted(samples_us)
        p90 = s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]
        return Timing(statistics.median(s), s[0], p90, statistics.fmean(s), len(s), method)


# --------------------------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------------------------

def is_cuda(device: torch.device | str) -> bool:
    return torch.device(device).type == "cuda"


def synchronize(device: torch.device | str) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(torch.device(device))


def device_name(device: torch.device | str) -> str:
    """'NVIDIA H200' on a GPU; the processor's name on the CPU."""
    if is_cuda(device):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def l2_bytes(device: torch.device | str) -> int | None:
    """The GPU's L2 size in bytes (None where torch does not say)."""
    if not is_cuda(device):
        return None
    props = torch.cuda.get_device_properties(torch.device(device))
    return getattr(props, "L2_cache_size", None)


class L2Flusher:
    """Evicts the inputs and weights of the previous run from L2 by writing a 256 MB buffer.

    Writing (zero_) rather than reading makes every line of L2 hold flush data, four times
    over for a 60 MB L2; Triton's do_bench flushes the same way.
    """

    def __init__(self, device: torch.device | str, nbytes: int = L2_FLUSH_BYTES) -> None:
        self.buffer = torch.empty(nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


def _sleep_cycles_for(us: float) -> int:
    """Clock cycles for torch.cuda._sleep to spin about `us` microseconds (about 2 GHz clocks)."""
    return int(max(us, 1.0) * 2000)


# --------------------------------------------------------------------------------------------
# CUDA graphs
# --------------------------------------------------------------------------------------------

def capture_graph(fn: Callable[[], Any], warmup: int = 3) -> tuple["torch.cuda.CUDAGraph", Any]:
    """Capture one call of `fn` in a CUDA graph; returns the graph and fn's (static) result.

    Warm-up runs on a side stream first, as capture requires: it loads modules, creates
    cuBLAS/cuDNN handles and lets cuDNN pick its algorithms outside the graph. Replaying the
    graph rewrites the tensors that the captured call returned.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------

def time_gpu(runs: Sequence[Callable[[], Any]], *, iters: int = 200, warmup: int = 20, flush_l2: bool = False,
             chunk: int = 50, device: torch.device | str = "cuda") -> Timing:
    """GPU time of one run, each run bracketed by its own pair of CUDA events.

    `runs` are callables that each launch one run (usually `graph.replay` of graphs captured on
    different input sets, or `compiled.replay`); they are used in turn, so several of them
    rotate the inputs. With `flush_l2`, L2 is flushed before every run, outside the events.
    For runs shorter than 200 us, a sleep kernel at the start of each chunk of runs lets the
    CPU queue the whole chunk first, so that CPU launch gaps do not show between the events.
    """
    if not is_cuda(device):
        raise ValueError("time_gpu needs a CUDA device")
    flusher = L2Flusher(device) if flush_l2 else None
    for k in range(warmup):
        runs[k % len(runs)]()
    torch.cuda.synchronize()
    # a first estimate of one run, to size the sleep that lets the CPU get ahead
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for k in range(len(runs) * 2):
        runs[k % len(runs)]()
    end.record()
    torch.cuda.synchronize()
    estimate_us = start.elapsed_time(end) * 1000.0 / (len(runs) * 2)
    samples: list[float] = []
    done = 0
    ahead_us = 100.0  # sleep per queued run; grows if the CPU still falls behind
    while done < iters:
        n = min(chunk, iters - done)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        marker = None
        if hasattr(torch.cuda, "_sleep") and estimate_us < 200.0:
            # Short runs: hold the GPU while the CPU queues the chunk. The marker completes
            # when the sleep ends; if it has already completed once the chunk is queued, the
            # GPU waited for the CPU inside the timed region and the chunk is done again.
            torch.cuda._sleep(_sleep_cycles_for(n * ahead_us))
            marker = torch.cuda.Event()
            marker.record()
        for i, (s, e) in enumerate(events):
            if flusher is not None:
                flusher()
            s.record()
            runs[(done + i) % len(runs)]()
            e.record()
        starved = marker is not None and marker.query()
        torch.cuda.synchronize()
        if starved and ahead_us < 10_000.0:
            ahead_us *= 4
            continue
        samples += [s.elapsed_time(e) * 1000.0 for s, e in events]
        done += n
    method = "graph replay, CUDA events per run" + (", L2 flushed" if flush_l2 else "")
    if len(runs) > 1:
        method += f", {len(runs)} input sets rotated"
    return Timing.from_samples(samples, method)


def time_calls(fn: Callable[[], Any], *, iters: int = 100, warmup: int = 10, batch: int = 10,
               device: torch.device | str = "cuda") -> Timing:
    """Steady-state time of one call of `fn` from Python, launch overhead included.

    Calls run back to back in batches of `batch`; each batch is timed (CUDA events on a GPU,
    the wall clock after a synchronize on the CPU) and divided by its size. The statistics are
    over batches, so the median is that of `iters / batch` batch means.
    """
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples: list[float] = []
    batches = max(1, iters // batch)
    for _ in range(batches):
        if is_cuda(device):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(batch):
                fn()
            e.record()
            torch.cuda.synchronize()
            samples.append(s.elapsed_time(e) * 1000.0 / batch)
        else:
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            samples.append((time.perf_counter() - t0) * 1e6 / batch)
    where = "CUDA events" if is_cuda(device) else "wall clock"
    return Timing.from_samples(samples, f"Python calls back to back, {where} over batches of {batch}")


def copy_bandwidth(device: torch.device | str = "cuda", nbytes: int = 1 << 30, iters: int = 10) -> float:
    """Bytes per second of a large device-to-device copy, counting bytes read plus written.

    The practical memory ceiling: a kernel that only streams its bytes once cannot beat it.
    """
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device).normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    synchronize(device)
    times = []
    for _ in range(iters):
        if is_cuda(device):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            dst.copy_(src)
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e) / 1000.0)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    del src, dst
    if is_cuda(device):
        torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times)


def _gpu_records(fn: Callable[[], Any]) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every GPU kernel, copy and memset that `fn` ran, in start order.

    Read from torch.profiler (CUPTI), which also reports the kernels of CUDA-graph replays.
    """
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the profiler's notes about its event buffers
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    records = []
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            start = ev.time_range.start
            records.append((ev.name, float(start), float(start + ev.time_range.elapsed_us())))
    return sorted(records, key=lambda r: r[1])


def kernel_time(run: Callable[[], Any], *, iters: int = 200, warmup: int = 20, flush_l2: bool = False,
                device: torch.device | str = "cuda") -> Timing | None:
    """GPU time of one run read from the profiler: first kernel's start to last kernel's end.

    Unlike `time_gpu`, this leaves out the graph launch and the event records around it: it
    is the time the run's kernels occupy the GPU, gaps between them included, the figure a
    profiler timeline shows. With `flush_l2` every run follows an L2 flush. None when the
    profiler's records cannot be split into runs (a run whose kernel count varies).
    """
    if not is_cuda(device):
        return None
    flusher = L2Flusher(device) if flush_l2 else None
    for _ in range(warmup):
        run()
    per_run = len(_gpu_records(run))
    flush_names = [r[0] for r in _gpu_records(flusher)] if flusher else []
    if per_run == 0:
        return None

    def runs() -> None:
        for _ in range(iters):
            if flusher is not None:
                flusher()
            run()

    records = _gpu_records(runs)
    group = len(flush_names) + per_run
    if len(records) != iters * group:
        return None
    samples = []
    for i in range(iters):
        chunk = records[i * group:(i + 1) * group]
        if [r[0] for r in chunk[:len(flush_names)]] != flush_names:
            return None
        mine = chunk[len(flush_names):]
        samples.append(max(r[2] for r in mine) - mine[0][1])
    method = "profiler: first kernel start to last kernel end" + (", L2 flushed" if flush_l2 else "")
    return Timing.from_samples(samples, method)


# --------------------------------------------------------------------------------------------
# Kernel counts
# --------------------------------------------------------------------------------------------

@dataclass
class KernelCount:
    """GPU work of one profiled run: kernels, and copies/memsets apart (they are not kernels)."""

    kernels: int
    memcpys: int
    memsets: int
    names: collections.Counter = field(default_factory=collections.Counter)

    def text(self) -> str:
        extra = []
        if self.memcpys:
            extra.append(f"{self.memcpys} memcpy")
        if self.memsets:
            extra.append(f"{self.memsets} memset")
        return str(self.kernels) + (f" (+{', '.join(extra)})" if extra else "")


def count_kernels(fn: Callable[[], Any], device: torch.device | str = "cuda") -> KernelCount | None:
    """Kernels launched by one call of `fn` (already warmed up), read from torch.profiler.

    Kernels inside a CUDA-graph replay are counted too, where the profiler reports them (CUPTI
    does on current drivers). None on the CPU or when the profiler yields nothing.
    """
    if not is_cuda(device):
        return None
    names: collections.Counter = collections.Counter()
    memcpys = memsets = 0
    for name, _, _ in _gpu_records(fn):
        low = name.lower()
        if low.startswith("memcpy"):
            memcpys += 1
        elif low.startswith("memset"):
            memsets += 1
        else:
            names[name] += 1
    if not names and not memcpys and not memsets:
        return None
    return KernelCount(sum(names.values()), memcpys, memsets, names)


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------

@dataclass
class Table:
    """A markdown table: a title line, headers and rows of already formatted cells."""

    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: Any) -> None:
        self.rows.append([str(c) for c in cells])

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.headers) + " |",
                 "| " + " | ".join("---" for _ in self.headers) + " |"]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(lines) + "\n"


def versions() -> dict[str, str]:
    """torch, triton, CUDA, cuDNN and Python versions (what a result depends on)."""
    out = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import triton

        out["triton"] = triton.__version__
    except Exception:  # triton missing or broken: say so in the header, never fail
        out["triton"] = "not available"
    out["cuda"] = str(torch.version.cuda)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    out["cudnn"] = str(cudnn)
    return out


def header(title: str, device: torch.device | str, notes: Sequence[str] = ()) -> str:
    """The header every results file starts with."""
    v = versions()
    lines = [
        f"# {title}",
        "",
        f"- command: `{' '.join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])}`",
        f"- device: {device_name(device)}",
        f"- torch {v['torch']}, triton {v['triton']}, CUDA {v['cuda']}, cuDNN {v['cudnn']}, Python {v['python']}",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
    ]
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def write_results(name: str, title: str, device: torch.device | str, tables: Sequence[Table],
                  notes: Sequence[str] = (), footnotes: Sequence[str] = (), save: bool = True,
                  quiet: bool = False) -> Path | None:
    """Print the header, tables and footnotes (not when `quiet`: a file written mid-run);
    with `save`, also write them to bench/results/<name>.md."""
    text = header(title, device, notes)
    for t in tables:
        text += "\n" + t.markdown()
    if footnotes:
        text += "\n" + "\n".join(f"- {n}" for n in footnotes) + "\n"
    if not quiet:
        print(text)
    if not save:
        return None
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.md"
    path.write_text(text)
    if not quiet:
        print(f"written: {path}")
    return path


def fmt_us(us: float | None) -> str:
    """Microseconds with sensible precision ('12.3', '1534')."""
    if us is None:
        return "-"
    return f"{us:.1f}" if us < 1000 else f"{us:.0f}"
