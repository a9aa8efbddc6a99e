"""Benchmark: YOLOv5s end to end (zoo model "yolov5s", 640x640), fp16, batch 1 or 32.

Contenders, all on the same graph and weights:

* fusegraph: the zoo model parsed, fused and compiled for the GPU in fp16; timed as replays
  of its CUDA graph;
* eager: the PyTorch module generated from the same unfused Program (bench/torch_reference.py),
  called from Python;
* eager + CUDA graph: that module captured in a CUDA graph and replayed (no launch overhead);
* eager channels_last + CUDA graph: the same with model and input in channels_last;
* torch.compile, default mode, called from Python;
* torch.compile mode="max-autotune" (with its own CUDA graphs), only with --max-autotune
  because its autotuning takes many minutes: run it in its own call.

Outputs are checked against the float32 module on the same (fp16-rounded) input before timing.
Usage: `PYTHONPATH=. python3 bench/yolov5s.py [--batch 32] [--max-autotune] [--quick]`.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx
import torch

import fusegraph
import fusegraph.zoo
from fusegraph.onnx.rebatch import with_batch
from bench.common import Check, bench_parser, check, compile_fusegraph, exact_fp32, failure, first_line, selected
from bench.timing import (Table, Timing, capture_graph, count_kernels, fmt_us, is_cuda, synchronize, time_calls,
                          time_gpu, write_results)
from bench.torch_reference import build_module

INPUT = "images"
OUTPUT = "output0"


@dataclass
class Result:
    """One contender's row."""

    name: str
    how: str = "-"
    check: Check | None = None
    kernels: str = "-"
    timing: Timing | None = None
    setup_s: float | None = None
    note: str = ""


class Bench:
    """Shared state of one run: the program, the input, the reference output, the options."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = torch.device(args.device)
        self.cuda = is_cuda(self.device)
        self.dtype = torch.float16 if self.cuda else torch.float32
        model = fusegraph.zoo.load(args.model) if fusegraph.zoo.is_zoo_name(args.model) else onnx.load(args.model)
        base = fusegraph.parse_onnx(model)
        lens = list(base.input_shapes[INPUT].lens)
        if lens[0] != args.batch:
            lens[0] = args.batch
            model = with_batch(model, args.batch)
            base = fusegraph.parse_onnx(model, input_dims={INPUT: lens})
        self.onnx_model = model  # what every contender runs
        if args.save_onnx:  # for `fusegraph perf` on the same graph (per-kernel times at batch 32)
            onnx.save(model, args.save_onnx)
        self.program = base
        self.input_lens = lens
        gen = torch.Generator().manual_seed(args.seed)
        # images in [0, 1), as YOLOv5 feeds them; rounded to the benchmark dtype once, for everyone
        self.x = torch.rand(*lens, generator=gen).to(device=self.device, dtype=self.dtype)
        t0 = time.perf_counter()
        ref_model = build_module(self.program).to(self.device)
        with torch.no_grad(), exact_fp32():
            self.ref = ref_model(self.x.float())[0]
        synchronize(self.device)
        self.ref_s = time.perf_counter() - t0
        del ref_model
        self.x2 = torch.rand(*lens, generator=gen).to(device=self.device, dtype=self.dtype)
        self.dynamo_note = ""
        if args.quick:
            self.graph_iters, self.call_iters, self.call_batch, self.warmup = 10, 6, 2, 2
        else:
            self.graph_iters, self.call_iters = args.iters, args.iters
            self.call_batch, self.warmup = 10, 10

    def model(self, channels_last: bool = False) -> torch.nn.Module:
        m = build_module(self.program).to(device=self.device, dtype=self.dtype)
        return m.to(memory_format=torch.channels_last) if channels_last else m

    def ref2(self) -> torch.Tensor:
        """The float32 reference output on the second input."""
        m = build_module(self.program).to(self.device)
        with torch.no_grad(), exact_fp32():
            out = m(self.x2.float())[0]
        del m
        return out

    def done(self) -> None:
        """Free what a contender left behind before the next one."""
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def run_eager(b: Bench) -> Result:
    r = Result("eager", how="Python calls")
    model = b.model()
    x = b.x
    fn = lambda: model(x)[0]  # noqa: E731
    t0 = time.perf_counter()
    out = fn()
    synchronize(b.device)
    r.setup_s = time.perf_counter() - t0
    r.check = check(out, b.ref, b.args.tolerance)
    if not r.check.ok:
        r.note = "output check failed: not timed"
        return r
    kc = count_kernels(fn, b.device)
    r.kernels = kc.text() if kc else "-"
    r.timing = time_calls(fn, iters=b.call_iters, warmup=b.warmup, batch=b.call_batch, device=b.device)
    return r


def run_eager_graph(b: Bench, channels_last: bool) -> Result:
    name = "eager channels_last + CUDA graph" if channels_last else "eager + CUDA graph"
    r = Result(name, how="graph replay")
    if not b.cuda:
        r.note = "skipped on the CPU"
        return r
    model = b.model(channels_last)
    x = b.x.contiguous(memory_format=torch.channels_last) if channels_last else b.x
    fn = lambda: model(x)[0]  # noqa: E731
    t0 = time.perf_counter()
    graph, out = capture_graph(fn)
    synchronize(b.device)
    r.setup_s = time.perf_counter() - t0
    out.fill_(float("nan"))  # the replay must rewrite every element
    graph.replay()
    r.check = check(out, b.ref, b.args.tolerance)
    if not r.check.ok:
        r.note = "output check failed: not timed"
        return r
    kc = count_kernels(graph.replay, b.device)
    r.kernels = kc.text() if kc else "?"
    r.timing = time_gpu([graph.replay], iters=b.graph_iters, warmup=b.warmup, device=b.device)
    del graph
    return r


def run_compile(b: Bench, mode: str) -> Result:
    r = Result(f"torch.compile {mode}", how="Python calls" + (" (its CUDA graphs)" if mode == "max-autotune" else ""))
    if not b.cuda:
        r.note = "skipped on the CPU"
        return r
    model = b.model()
    x = b.x
    if not b.dynamo_note:
        try:
            torch._dynamo.reset()
            explained = torch._dynamo.explain(model)(x)
            b.dynamo_note = (f"dynamo sees {explained.graph_count} graph(s), {explained.graph_break_count} break(s), "
                             f"{explained.op_count} ops")
        except Exception as e:  # the explanation is informative only
            b.dynamo_note = f"dynamo explain failed: {first_line(e)}"
    torch._dynamo.reset()
    compiled = torch.compile(model, mode=None if mode == "default" else mode, dynamic=False)
    fn = lambda: compiled(x)[0]  # noqa: E731
    try:
        t0 = time.perf_counter()
        out = fn()
        synchronize(b.device)
        r.setup_s = time.perf_counter() - t0
        # a copy: with CUDA graphs (max-autotune) the next call overwrites the returned tensor
        r.check = check(out.clone(), b.ref, b.args.tolerance)
        if not r.check.ok:
            r.note = "output check failed: not timed"
            return r
        for _ in range(3):  # settle: cudagraph trees record on their first calls
            fn()
        kc = count_kernels(fn, b.device)
        r.kernels = kc.text() if kc else "?"
        r.timing = time_calls(fn, iters=b.call_iters, warmup=b.warmup, batch=b.call_batch, device=b.device)
    except Exception as e:  # a compiler failure is a result, not a crash
        r.note = f"failed: {first_line(e)}"
    return r


def run_fusegraph(b: Bench) -> Result:
    r = Result("fusegraph", how="graph replay")
    t0 = time.perf_counter()
    program = fusegraph.parse_onnx(b.onnx_model, input_dims={INPUT: b.input_lens})
    runner, reason = compile_fusegraph(program, b.device, fp16=b.dtype == torch.float16,
                                       exhaustive_tune=b.args.exhaustive_tune)
    if runner is None:
        r.note = reason
        return r
    try:
        out = runner.run({INPUT: b.x})[OUTPUT]
        synchronize(b.device)
        r.setup_s = time.perf_counter() - t0
        r.check = check(out, b.ref, b.args.tolerance)
        if r.check.ok:
            # a second input: the compiled program must compute the function, not keep one answer
            second = check(runner.run({INPUT: b.x2})[OUTPUT], b.ref2(), b.args.tolerance)
            if second.err > r.check.err:
                r.check = second
        if not r.check.ok:
            r.note = "output check failed: not timed"
            return r
        runner.bind({INPUT: b.x})
        kc = count_kernels(runner.replay, b.device)
        reported = runner.kernel_count
        r.kernels = (kc.text() if kc else "?") + (f" (reports {reported})" if reported is not None else "")
        r.timing = time_gpu([runner.replay], iters=b.graph_iters, warmup=b.warmup, device=b.device)
        r.note = runner.note()
    except Exception as e:  # report it in the table; the torch contenders still run
        r.note = failure(e)
    return r


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--batch", type=int, default=1, choices=(1, 32), help="images per run (1 or 32)")
    parser.add_argument("--max-autotune", action="store_true",
                        help='add torch.compile mode="max-autotune" (slow to compile; e.g. with --only compile-max-autotune)')
    parser.add_argument("--model", default="yolov5s", help="zoo model or .onnx path (default yolov5s)")
    parser.add_argument("--iters", type=int, default=200, help="timed runs per contender (default 200)")
    parser.add_argument("--exhaustive-tune", action="store_true", help="fusegraph times every candidate config of each kernel")
    parser.add_argument("--save-onnx", metavar="FILE", help="also write the (rebatched) ONNX graph the contenders run")
    args = parser.parse_args(argv)
    b = Bench(args)
    if b.cuda:
        torch.backends.cudnn.benchmark = True
    print(f"{args.model} {b.input_lens} {b.dtype}: float32 reference in {b.ref_s:.1f} s", flush=True)

    plan: list[tuple[str, Callable[[], Result]]] = [
        ("fusegraph", lambda: run_fusegraph(b)),
        ("eager", lambda: run_eager(b)),
        ("eager-graph", lambda: run_eager_graph(b, channels_last=False)),
        ("eager-cl-graph", lambda: run_eager_graph(b, channels_last=True)),
        ("compile", lambda: run_compile(b, "default")),
    ]
    if args.max_autotune or (args.only and selected("compile-max-autotune", args.only)):
        plan.append(("compile-max-autotune", lambda: run_compile(b, "max-autotune")))
    results: list[Result] = []
    with torch.no_grad():
        for key, run in plan:
            if not selected(key, args.only):
                continue
            print(f"-- {key}", flush=True)
            r = run()
            results.append(r)
            t = r.timing
            print(f"   {r.name:34s} {fmt_us(t.median_us) if t else '-':>8s} us  kernels {r.kernels}  "
                  f"err {r.check.text() if r.check else '-'}  {r.note}", flush=True)
            b.done()

    table = Table(f"{args.model}, input {'x'.join(map(str, b.input_lens))}, {str(b.dtype).replace('torch.', '')}",
                  ["contender", "timed as", "kernels", "median ms", "min ms", "p90 ms", "img/s", "setup s",
                   "rel err vs fp32", "note"])
    for r in results:
        t = r.timing
        ms = (lambda v: f"{v / 1000:.3f}") if t else (lambda v: "-")
        table.add(r.name, r.how, r.kernels, ms(t.median_us if t else 0), ms(t.min_us if t else 0), ms(t.p90_us if t else 0),
                  f"{args.batch / (t.median_us * 1e-6):.0f}" if t else "-",
                  f"{r.setup_s:.1f}" if r.setup_s is not None else "-", r.check.text() if r.check else "-", r.note)
    notes = [
        f"{'fp16' if b.dtype == torch.float16 else 'float32 (CPU smoke run)'}, batch {args.batch}, "
        f"input images uniform in [0, 1) from seed {args.seed}; zoo weights regenerated from their fixed seeds",
        "the torch model is generated from the same ONNX graph fusegraph reads (bench/torch_reference.py: "
        "straight-line forward, conv+bias, SiLU and Gemm written as PyTorch does), so torch.compile sees one graph"
        + (f" ({b.dynamo_note})" if b.dynamo_note else "")
        + "; YOLOv5's own Python around the graph (e.g. the warnings context in SPPF) does not exist here",
        "graph replay: GPU time per replay (CUDA events around each); Python calls: back-to-back calls, "
        "events around batches, launch overhead included; median over the runs",
        "kernels: GPU kernels of one run from torch.profiler (memcpy/memset apart); "
        "setup: compile/capture and the first run, in seconds",
        "eager: torch.backends.cudnn.benchmark = True; all runs under torch.no_grad()",
    ]
    autotune = any(r.name.endswith("max-autotune") for r in results)
    name = args.name or (f"yolov5s-b{args.batch}" + ("-max-autotune" if autotune else "")
                         + ("" if b.cuda else "-cpu"))
    write_results(name, f"YOLOv5s end to end, batch {args.batch}", b.device, [table], notes, save=not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
