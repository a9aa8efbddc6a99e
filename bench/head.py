"""Benchmark: the YOLOv5s detection head, per level, fusegraph against PyTorch.

Each level of the head is

    x [1, Cin, H, W] -> conv 1x1 to 255 channels + bias -> reshape {1, 3, 85, H, W}
      -> transpose {0, 1, 3, 4, 2} -> sigmoid -> [1, 3, H, W, 85]

for (Cin, H=W) = (128, 80), (256, 40), (512, 20), in fp16 at batch 1. It is the pattern
fusegraph exists for: one kernel that computes the convolution and stores straight into the
transposed layout. The contenders:

* fusegraph: the head as an ONNX model (built here with the onnx helper API), parsed,
  compiled for the GPU in fp16, timed as replays of its CUDA graph;
* eager: YOLOv5's own Detect code, `conv2d(x, w, b).view(...).permute(...).contiguous().sigmoid()`;
* eager channels_last: the same with x and w in channels_last;
* torch.compile, default mode and mode="max-autotune-no-cudagraphs", each also with inductor's
  layout optimization off (the convolution then stays NCHW and feeds one pointwise kernel);
* gemm: a plain fp16 matrix product [H*W, Cin] x [Cin, 255] with a contiguous output, the
  same arithmetic and bytes without the layout change: the practical floor.

The torch contenders are captured in CUDA graphs, so every contender is timed the same way:
GPU time per graph replay (bench/timing.py), with L2 flushed before each run ("cold") and
without ("hot": the head's 2-5 MB stay in the 60 MB L2). Every output is checked against a
float32 reference computed from the same fp16-rounded inputs and weights before timing.
The bytes floor is x + weights + bias + output in fp16, divided by the measured copy
bandwidth. Usage: `PYTHONPATH=. python3 bench/head.py [--quick] [--device cpu]`.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

import fusegraph
from bench.common import Check, bench_parser, check, compile_fusegraph, exact_fp32, failure, first_line, selected
from bench.timing import (Table, Timing, capture_graph, copy_bandwidth, count_kernels, fmt_us, is_cuda, kernel_time,
                          l2_bytes, time_calls, time_gpu, write_results)

NA, NO = 3, 85  # anchors per cell, values per anchor (4 box + 1 objectness + 80 classes)
LEVELS = ((128, 80), (256, 40), (512, 20))
CONTENDERS = ("fusegraph", "eager", "eager-cl", "compile", "compile-max-autotune", "compile-nolayout",
              "compile-max-autotune-nolayout", "gemm")
# torch.compile variants: (--only key, mode, inductor's layout_optimization). With layout
# optimization off, inductor keeps the convolution's NCHW output and calls the GEMM as is.
COMPILE_VARIANTS = (("compile", "default", True), ("compile-max-autotune", "max-autotune-no-cudagraphs", True),
                    ("compile-nolayout", "default", False),
                    ("compile-max-autotune-nolayout", "max-autotune-no-cudagraphs", False))


@dataclass(frozen=True)
class Level:
    """One level of the head: input channels and the square grid size."""

    cin: int
    size: int

    @property
    def cout(self) -> int:
        return NA * NO

    @property
    def label(self) -> str:
        return f"1x{self.cin}x{self.size}x{self.size}"

    def bytes_floor(self, itemsize: int = 2) -> int:
        """Bytes each contender must move at least: read x, weights and bias, write the output."""
        hw = self.size * self.size
        return itemsize * (self.cin * hw + self.cout * self.cin + self.cout + self.cout * hw)

    def flops(self) -> int:
        return 2 * self.size * self.size * self.cin * self.cout


def make_weights(level: Level, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Conv weight [255, Cin, 1, 1] and bias [255], float32, from a fixed seed.

    Weights ~ N(0, 1/Cin) keep the pre-activations at unit scale for unit inputs, so the
    sigmoid is neither saturated nor flat and an error anywhere shows in the output.
    """
    rng = np.random.default_rng([seed, level.cin, level.size])
    w = (rng.standard_normal((level.cout, level.cin, 1, 1)) / math.sqrt(level.cin)).astype(np.float32)
    b = (rng.standard_normal(level.cout) * 0.5).astype(np.float32)
    return w, b


def head_model(level: Level, w: np.ndarray, b: np.ndarray) -> onnx.ModelProto:
    """One head level as an ONNX model (float32, opset 17): Conv -> Reshape -> Transpose -> Sigmoid."""
    s = level.size
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["conv"], kernel_shape=[1, 1], name="conv"),
        helper.make_node("Reshape", ["conv", "shape"], ["r"], name="reshape"),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 1, 3, 4, 2], name="transpose"),
        helper.make_node("Sigmoid", ["t"], ["y"], name="sigmoid"),
    ]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.array([1, NA, NO, s, s], dtype=np.int64), "shape")]
    graph = helper.make_graph(nodes, f"yolov5s_head_{level.cin}x{s}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, level.cin, s, s])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, NA, s, s, NO])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model)
    return model


def eager_head(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """YOLOv5's Detect forward for one level (models/yolo.py), then its sigmoid."""
    n, _, h, wd = x.shape
    y = F.conv2d(x, w, b)
    return y.view(n, NA, NO, h, wd).permute(0, 1, 3, 4, 2).contiguous().sigmoid()


@dataclass
class Result:
    """One contender on one level."""

    name: str
    check: Check | None = None
    kernels: str = "-"
    cold: Timing | None = None  # events around each graph replay
    hot: Timing | None = None
    gpu_cold: Timing | None = None  # profiler: first kernel start to last kernel end
    gpu_hot: Timing | None = None
    note: str = ""


def time_contender(fn: Callable[[], torch.Tensor], args: argparse.Namespace, device: torch.device,
                   ref: torch.Tensor, result: Result) -> None:
    """Check fn's output, then time it: graph replays on a GPU (cold and hot L2), calls on the CPU."""
    out = fn()
    result.check = check(out, ref, args.tolerance)
    if not result.check.ok:
        result.note = "output check failed: not timed"
        return
    iters, warmup = (30, 5) if args.quick else (args.iters, 50)
    if not is_cuda(device):
        result.hot = time_calls(fn, iters=iters, warmup=2, batch=5, device=device)
        return
    kc = count_kernels(fn, device)
    result.kernels = kc.text() if kc else "?"
    graph, static_out = capture_graph(fn)
    static_out.fill_(float("nan"))  # every element must be rewritten by the replay
    graph.replay()
    replay_check = check(static_out, ref, args.tolerance)
    if not replay_check.ok:
        result.check = replay_check
        result.note = "CUDA graph replay gives a wrong output: not timed"
        return
    time_replays(graph.replay, iters, warmup, device, result)


def time_replays(replay: Callable[[], None], iters: int, warmup: int, device: torch.device, result: Result) -> None:
    """Both clocks, L2 cold and hot: events around each replay, and the profiler's kernel span."""
    result.cold = time_gpu([replay], iters=iters, warmup=warmup, flush_l2=True, device=device)
    result.hot = time_gpu([replay], iters=iters, warmup=warmup, flush_l2=False, device=device)
    result.gpu_cold = kernel_time(replay, iters=iters, warmup=warmup, flush_l2=True, device=device)
    result.gpu_hot = kernel_time(replay, iters=iters, warmup=warmup, flush_l2=False, device=device)


def run_level(level: Level, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> list[Result]:
    w_np, b_np = make_weights(level, args.seed)
    gen = torch.Generator().manual_seed(args.seed * 1000 + level.cin)
    x = torch.randn(1, level.cin, level.size, level.size, generator=gen).to(device=device, dtype=dtype)
    w = torch.from_numpy(w_np).to(device=device, dtype=dtype)
    b = torch.from_numpy(b_np).to(device=device, dtype=dtype)
    # the float32 reference sees the same rounded values, so it measures compute error only
    with exact_fp32():
        ref = eager_head(x.float(), w.float(), b.float())
    results: list[Result] = []

    if selected("fusegraph", args.only):
        results.append(run_fusegraph(level, w_np, b_np, x, ref, args, device, dtype))

    if selected("eager", args.only):
        r = Result("eager")
        time_contender(lambda: eager_head(x, w, b), args, device, ref, r)
        results.append(r)

    if selected("eager-cl", args.only):
        r = Result("eager channels_last")
        x_cl = x.contiguous(memory_format=torch.channels_last)
        w_cl = w.contiguous(memory_format=torch.channels_last)
        time_contender(lambda: eager_head(x_cl, w_cl, b), args, device, ref, r)
        results.append(r)

    for key, mode, layout in COMPILE_VARIANTS:
        if not selected(key, args.only):
            continue
        r = Result(f"torch.compile {mode}" + ("" if layout else ", layout optimization off"))
        if not is_cuda(device):
            r.note = "skipped on the CPU"
        else:
            torch._dynamo.reset()
            compiled = torch.compile(eager_head, mode=None if mode == "default" else mode, dynamic=False)
            try:  # inductor reads the option when it compiles, at the first call
                with torch._inductor.config.patch(layout_optimization=layout):
                    time_contender(lambda: compiled(x, w, b), args, device, ref, r)
            except Exception as e:  # a compiler failure is a result, not a crash
                r.note = f"failed: {first_line(e)}"
        results.append(r)

    if selected("gemm", args.only):
        r = Result("gemm [HW,Cin]x[Cin,255]")
        a = x.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1).reshape(-1, level.cin)
        bt = w.view(level.cout, level.cin).t()
        with exact_fp32():
            gemm_ref = a.float() @ bt.float()
        time_contender(lambda: torch.matmul(a, bt), args, device, gemm_ref, r)
        r.note = "no bias, no sigmoid, no layout change"
        results.append(r)
    return results


def run_fusegraph(level: Level, w_np: np.ndarray, b_np: np.ndarray, x: torch.Tensor, ref: torch.Tensor,
                  args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> Result:
    r = Result("fusegraph")
    program = fusegraph.parse_onnx(head_model(level, w_np, b_np))
    runner, reason = compile_fusegraph(program, device, fp16=dtype == torch.float16)
    if runner is None:
        r.note = reason
        return r
    try:
        out = runner.run({"x": x})["y"]
        r.check = check(out, ref, args.tolerance)
        # a second, fresh input: the compiled program must compute the function, not replay one answer
        x2 = torch.randn_like(x)
        with exact_fp32():
            ref2 = eager_head(x2.float(), torch.from_numpy(w_np).to(device, dtype).float(),
                              torch.from_numpy(b_np).to(device, dtype).float())
        r2 = check(runner.run({"x": x2})["y"], ref2, args.tolerance)
        if r2.err > r.check.err:
            r.check = r2
        if not r.check.ok:
            r.note = "output check failed: not timed"
            return r
        runner.bind({"x": x})
        kc = count_kernels(runner.replay, device)
        reported = runner.kernel_count
        r.kernels = (kc.text() if kc else "?") + (f" (reports {reported})" if reported is not None else "")
        iters, warmup = (30, 5) if args.quick else (args.iters, 50)
        time_replays(runner.replay, iters, warmup, device, r)
        r.note = runner.note()
    except Exception as e:  # report the failure in the table; the torch contenders still run
        r.note = failure(e)
    return r


def median(t: Timing | None) -> float | None:
    return t.median_us if t else None


def ratio(theirs: float | None, ours: float | None) -> str:
    return f"{theirs / ours:.2f}x" if theirs and ours else "-"


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--iters", type=int, default=500, help="timed runs per contender and L2 state (default 500)")
    parser.add_argument("--levels", default="0,1,2", help="which levels: 0 (80x80), 1 (40x40), 2 (20x20)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    cuda = is_cuda(device)
    dtype = torch.float16 if cuda else torch.float32  # fp16 convolutions on the CPU are a smoke test at best
    itemsize = 2 if dtype == torch.float16 else 4
    if cuda:
        torch.backends.cudnn.benchmark = True
    bandwidth = copy_bandwidth(device, nbytes=(1 << 30) if cuda else (1 << 28))
    levels = [Level(*LEVELS[int(i)]) for i in args.levels.split(",")]
    tables: list[Table] = []
    totals: dict[str, dict[str, list[float | None]]] = {}
    for level in levels:
        floor_bytes = level.bytes_floor(itemsize)
        floor_us = floor_bytes / bandwidth * 1e6
        title = (f"level {level.label} -> 1x{NA}x{level.size}x{level.size}x{NO}: bytes floor {floor_bytes / 1e6:.2f} MB "
                 f"= {floor_us:.2f} us at {bandwidth / 1e12:.2f} TB/s; {level.flops() / 1e6:.0f} MFLOP")
        print(f"\n== {title}", flush=True)
        table = Table(title, ["contender", "kernels", "GPU us (L2 cold)", "GPU us (L2 hot)", "replay us (L2 cold)",
                              "replay us (L2 hot)", "fusegraph faster by (GPU, cold / hot)", "floor / GPU cold",
                              "rel err vs fp32", "note"])
        results = run_level(level, args, device, dtype)
        ours = next((r for r in results if r.name == "fusegraph"), None)
        for r in results:
            gpu_cold, gpu_hot = median(r.gpu_cold), median(r.gpu_hot)
            table.add(r.name, r.kernels, fmt_us(gpu_cold), fmt_us(gpu_hot), fmt_us(median(r.cold)),
                      fmt_us(median(r.hot)),
                      f"{ratio(gpu_cold, median(ours.gpu_cold) if ours else None)} / "
                      f"{ratio(gpu_hot, median(ours.gpu_hot) if ours else None)}",
                      f"{floor_us / gpu_cold:.0%}" if gpu_cold else "-", r.check.text() if r.check else "-", r.note)
            print(f"   {r.name:52s} GPU cold {fmt_us(gpu_cold):>6s} hot {fmt_us(gpu_hot):>6s} us; replay cold "
                  f"{fmt_us(median(r.cold)):>6s} hot {fmt_us(median(r.hot)):>6s} us; kernels {r.kernels}  {r.note}",
                  flush=True)
            for key, value in (("GPU us (L2 cold)", gpu_cold), ("GPU us (L2 hot)", gpu_hot),
                               ("replay us (L2 cold)", median(r.cold) if cuda else median(r.hot))):
                totals.setdefault(r.name, {}).setdefault(key, []).append(value)
        tables.append(table)
    if len(levels) > 1:
        keys = ["GPU us (L2 cold)", "GPU us (L2 hot)", "replay us (L2 cold)"]
        summary = Table("all levels: sums of the per-level medians", ["contender", *keys])
        for name, cols in totals.items():
            summary.add(name, *(fmt_us(sum(cols[k])) if all(v is not None for v in cols[k]) else "-" for k in keys))
        tables.append(summary)
    notes = [
        f"{'fp16' if cuda else 'float32 (CPU smoke run)'}, batch 1, weights and inputs from seed {args.seed}",
        f"measured copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + written, 1 GiB device-to-device copy)"
        + (f"; L2 {l2_bytes(device) / 2**20:.0f} MiB" if cuda and l2_bytes(device) else ""),
        ("timing: each contender runs as a CUDA graph (the torch ones captured here, fusegraph's its own); "
         "GPU us = the profiler's (CUPTI) span from the first kernel's start to the last kernel's end of a "
         "replay, the figure a timeline shows; replay us = CUDA events around each replay, which adds the "
         "graph launch (a few us, the same for every contender); cold = L2 flushed (256 MB write) before "
         "each run, hot = back-to-back replays; medians"
         if cuda else "timing: Python calls on the CPU (no graphs, no torch.compile, no fusegraph)"),
        "kernels: GPU kernels of one run counted with torch.profiler (memcpy/memset listed apart)",
        "eager: torch.backends.cudnn.benchmark = True; its code is YOLOv5's Detect (view, permute, contiguous, sigmoid)",
    ]
    footnotes = ["floor / GPU cold: the share of the bytes floor each contender reaches (100% = at the copy bandwidth)",
                 "fusegraph faster by: the contender's GPU time over fusegraph's, L2 cold / L2 hot"]
    name = args.name or ("head" if cuda else "head-cpu")
    write_results(name, "YOLOv5s detection head: conv 1x1 + bias -> reshape -> transpose -> sigmoid", device,
                  tables, notes, footnotes, save=not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
