"""Benchmark: every exported zoo model, fusegraph against the library's own PyTorch module (GPU).

For each model (`--models`, default all of bench/model_specs.py) and batch (`--batches`, default
1 and 32; token models at the sequence of their zoo graph: bert_base and gpt2_2layer 128,
bert_base_s512 512), fp16, contenders (`--modes`):

* fusegraph: the zoo ONNX graph (for batch 32 the zoo's NAME-b32 export where there is one,
  else the batch-1 graph with its batch constants rewritten), compiled for the GPU with default
  tuning, timed as replays of its CUDA graph; its cold compile time (parse, compile, first run)
  is printed and tabled;
* fusegraph-plain, fusegraph-pdl: the same with no kernel, or every kernel, built for
  programmatic dependent launch (FUSEGRAPH_DEPENDENT_LAUNCH=0 or 1; fusegraph's default builds
  the short kernels so on sm_90 and later); fusegraph-defer, fusegraph-defer-all: layernorms
  deferred past their products by the rule, or every one that can be (FUSEGRAPH_DEFER_NORMS=1
  or all, passes/defer_norm.py; off by default); fusegraph-norms-kept: none deferred, not even
  where the statistics come free after a depthwise convolution (=0; the default is =free);
  fusegraph-stats-apart: deferred by the rule,
  their row statistics in kernels of their own instead of the epilogues of the products
  writing the rows (FUSEGRAPH_JOIN_ROW_STATS=0); fusegraph-chunk-stats: a deferred layernorm
  prologue's statistics reduced across the tile chunk by chunk instead of summed lane by lane
  (FUSEGRAPH_LANE_STATS=0, templates/gemm_prologue.py); fusegraph-store-norms: a layernorm that
  a product reads and others too (a post-norm transformer's) computed in the product's prologue
  and stored for the others (FUSEGRAPH_STORE_NORMS=1, passes/prologue_rule.py); not in the
  default modes;
* eager: the library's module (torchvision, timm, ultralytics, transformers; same config,
  random weights, built here) in fp16, captured in a CUDA graph;
* compile: torch.compile(mode=None) of that module, captured in a CUDA graph;
* max-autotune: torch.compile(mode="max-autotune-no-cudagraphs"), captured in a CUDA graph
  (slow to compile: not in the default modes).

The two sides have different random weights (the zoo's are regenerated from seeds, the module's
from torch's initializers), so each is checked against its own float32 twin: fusegraph against
the module generated from the same unfused graph (bench/torch_reference.py) or, where that
translation lacks an op, ONNX Runtime; each torch contender against the fp32 eager module.
A missing library skips that model's torch rows (they fall back to the graph-generated module,
noted in the table); a failing contender is a row with its reason, never a crash.

Usage: `PYTHONPATH=. python3 bench/models.py [--models resnet18,bert_base] [--batches 1]
[--modes fusegraph,eager,compile,max-autotune] [--budget-s 480] [--quick]`.
Progress goes to stderr; the table to bench/results/models.md (or `--name`).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

import fusegraph
import fusegraph.zoo
from bench.common import Check, bench_parser, check, compile_fusegraph, environment, exact_fp32, first_line
from bench.model_specs import SPECS, library_missing, library_module
from bench.timing import (Table, Timing, capture_graph, count_kernels, synchronize, time_calls, time_gpu,
                          write_results)
from bench.yolov5s import with_batch
from fusegraph.driver.inputs import input_ranges
from fusegraph.driver.perf import compile_phase_lines
from fusegraph.passes.defer_norm import DEFER_NORMS_ENV
from fusegraph.passes.prologue_rule import STORE_NORMS_ENV
from fusegraph.passes.reduction_epilogue import JOIN_ROW_STATS_ENV
from fusegraph.targets.gpu.kernel_source import DEPENDENT_LAUNCH_ENV
from fusegraph.targets.gpu.templates.gemm_prologue import LANE_STATS_ENV

MODES = ("fusegraph", "fusegraph-plain", "fusegraph-pdl", "fusegraph-defer", "fusegraph-defer-all", "fusegraph-norms-kept",
         "fusegraph-stats-apart", "fusegraph-chunk-stats", "fusegraph-store-norms", "eager", "compile", "max-autotune")
# a contender whose output misses its fp32 twin is still timed (its kernels are the same), and says so
CHECK_FAILED = "output check failed (timed anyway; its error is in the error column)"
TORCH_MODES = {"eager": None, "compile": "default", "max-autotune": "max-autotune-no-cudagraphs"}


@dataclass
class Row:
    model: str
    batch: int
    contender: str
    kernels: str = "-"
    timing: Timing | None = None
    setup_s: float | None = None
    check: Check | None = None
    note: str = ""
    runner: Any = None  # a fusegraph row's program, kept until the profiler has counted its kernels


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Case:
    """One model at one batch: the (rebatched) zoo graph, its inputs, the library's module."""

    def __init__(self, name: str, batch: int, args: Any, device: torch.device) -> None:
        self.name, self.batch, self.args, self.device = name, batch, args, device
        model = fusegraph.zoo.load(name)
        plain = fusegraph.parse_onnx(model)
        self.input_names = list(plain.input_shapes)
        dims = {k: [batch] + list(v.lens[1:]) for k, v in plain.input_shapes.items()}
        variant = f"{name}-b{batch}"  # exports that fold the batch into constants ship rebatched
        if batch == 1:
            self.onnx_model = model
        elif fusegraph.zoo.is_zoo_name(variant):
            self.onnx_model = fusegraph.zoo.load(variant)
        else:
            self.onnx_model = with_batch(model, batch)
        self.dims = dims
        ranges = input_ranges(plain)
        gen = torch.Generator().manual_seed(args.seed)
        self.inputs: dict[str, torch.Tensor] = {}
        for k, shape in plain.input_shapes.items():
            if shape.dtype.is_float:
                x = torch.rand(*dims[k], generator=gen).to(torch.float16)
            else:
                lo, hi = ranges.get(k, (0, 10))
                x = torch.randint(lo, hi, dims[k], generator=gen)
            self.inputs[k] = x.to(device)
        self.output_name = plain.output_names[0]

    def program(self) -> Any:
        return fusegraph.parse_onnx(self.onnx_model, input_dims=self.dims)

    def call(self, module: torch.nn.Module, dtype: torch.dtype, generated: bool) -> Callable[[], torch.Tensor]:
        """A no-argument call of `module` on this case's inputs (floats cast to `dtype`)."""
        feeds = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in self.inputs.items()}
        if generated:  # bench/torch_reference.py: positional inputs, a tuple of outputs
            args = [feeds[k] for k in self.input_names]
            return lambda: module(*args)[0]
        if SPECS[self.name].keyword_inputs:
            return lambda: module(**feeds)
        (x,) = feeds.values()
        return lambda: _first(module(x))


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def fp32_reference(case: Case) -> torch.Tensor:
    """fusegraph's reference: the fp32 module generated from the graph, else ONNX Runtime."""
    from bench.torch_reference import build_module

    try:
        module = build_module(case.program()).to(case.device)
        with torch.no_grad(), exact_fp32():
            return case.call(module, torch.float32, generated=True)().float()
    except Exception as e:  # an op the translation lacks: ONNX Runtime on the CPU instead
        log(f"   reference from ONNX Runtime ({first_line(e)})")
        import onnxruntime as ort

        sess = ort.InferenceSession(case.onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
        feeds = {k: (v.float() if v.is_floating_point() else v).cpu().numpy() for k, v in case.inputs.items()}
        return torch.from_numpy(np.asarray(sess.run([case.output_name], feeds)[0])).to(case.device)


# the fusegraph contenders and their settings while they compile ("": the default)
FUSEGRAPH_MODES = {"fusegraph": {DEPENDENT_LAUNCH_ENV: "", DEFER_NORMS_ENV: "", STORE_NORMS_ENV: ""},
                   "fusegraph-plain": {DEPENDENT_LAUNCH_ENV: "0"}, "fusegraph-pdl": {DEPENDENT_LAUNCH_ENV: "1"},
                   "fusegraph-defer": {DEFER_NORMS_ENV: "1"}, "fusegraph-defer-all": {DEFER_NORMS_ENV: "all"},
                   "fusegraph-norms-kept": {DEFER_NORMS_ENV: "0"},
                   "fusegraph-stats-apart": {DEFER_NORMS_ENV: "1", JOIN_ROW_STATS_ENV: "0"},
                   "fusegraph-chunk-stats": {LANE_STATS_ENV: "0"}, "fusegraph-store-norms": {STORE_NORMS_ENV: "1"}}


def run_fusegraph(case: Case, iters: int, mode: str = "fusegraph") -> Row:
    """The row of fusegraph contender `mode` (FUSEGRAPH_MODES)."""
    row = Row(case.name, case.batch, mode)
    t0 = time.perf_counter()
    try:
        with contextlib.ExitStack() as settings:
            for name, value in FUSEGRAPH_MODES[mode].items():
                settings.enter_context(environment(name, value))
            runner, reason = compile_fusegraph(case.program(), case.device, fp16=True)
        if runner is None:
            row.note = reason
            return row
        out = runner.run(case.inputs)[case.output_name]
        synchronize(case.device)
        row.setup_s = time.perf_counter() - t0
        log(f"   fusegraph cold compile {row.setup_s:.1f} s")
        for line in compile_phase_lines(runner.compiled):
            log(f"   {line}")
        row.check = check(out, fp32_reference(case), case.args.tolerance)
        if not row.check.ok:
            row.note = CHECK_FAILED
        runner.bind(case.inputs)
        row.timing = time_gpu([runner.replay], iters=iters, warmup=10, device=case.device)
        row.kernels = f"(reports {runner.kernel_count})"
        row.runner = runner  # its kernels are counted by the profiler once every fusegraph case has compiled
    except Exception as e:  # a result, not a crash: the torch contenders still run
        row.note = f"failed: {first_line(e)}"
    return row


def count_fusegraph_kernels(row: Row, device: torch.device) -> None:
    """The profiler's count of one replay beside the program's own, then the program is freed."""
    runner, row.runner = row.runner, None
    if runner is not None:
        kc = count_kernels(runner.replay, device)
        row.kernels = (kc.text() if kc else "?") + " " + row.kernels


def torch_module(case: Case) -> tuple[torch.nn.Module, bool, str]:
    """The library's module (fp32), whether it is the graph-generated stand-in, and a note."""
    missing = library_missing(case.name)
    if not missing:
        return library_module(case.name, case.args.seed).to(case.device), False, ""
    from bench.torch_reference import build_module

    note = f"{missing}: module generated from the zoo graph instead"
    return build_module(case.program()).to(case.device), True, note


def run_torch(case: Case, module: torch.nn.Module, generated: bool, ref: torch.Tensor, mode: str,
              iters: int) -> Row:
    row = Row(case.name, case.batch, mode)
    try:
        fn = case.call(module, torch.float16, generated)
        t0 = time.perf_counter()
        if TORCH_MODES[mode] is not None:
            torch._dynamo.reset()
            compiled = torch.compile(module, mode=TORCH_MODES[mode], dynamic=False)
            fn = case.call(compiled, torch.float16, generated)
            fn()  # compiles
        try:
            graph, out = capture_graph(fn)
        except Exception as e:  # e.g. a host sync inside the module (a mask check)
            log(f"   CUDA graph capture failed: {first_line(e)}")
            return _timed_calls(row, fn, ref, iters, case, t0, f"no CUDA graph ({first_line(e)})")
        synchronize(case.device)
        row.setup_s = time.perf_counter() - t0
        out.fill_(float("nan"))  # the replay must rewrite every element
        graph.replay()
        row.check = check(out, ref, case.args.tolerance)
        if not row.check.ok:
            row.note = CHECK_FAILED
        kc = count_kernels(graph.replay, case.device)
        row.kernels = kc.text() if kc else "?"
        row.timing = time_gpu([graph.replay], iters=iters, warmup=10, device=case.device)
    except Exception as e:  # a compiler failure is a result
        row.note = f"failed: {first_line(e)}"
    return row


def _timed_calls(row: Row, fn: Callable[[], torch.Tensor], ref: torch.Tensor, iters: int, case: Case,
                 t0: float, why: str) -> Row:
    """A contender that cannot be captured, timed as back-to-back Python calls instead."""
    torch.cuda.synchronize()  # a failed capture leaves the stream usable once it is synchronized
    out = fn()
    synchronize(case.device)
    row.setup_s = time.perf_counter() - t0
    row.check = check(out.clone(), ref, case.args.tolerance)
    row.note = f"{why}: timed as Python calls"
    if row.check.ok:
        kc = count_kernels(fn, case.device)
        row.kernels = kc.text() if kc else "?"
        row.timing = time_calls(fn, iters=iters, warmup=5, batch=10, device=case.device)
    return row


def run_torch_case(case: Case, modes: list[str], iters: int) -> list[Row]:
    rows: list[Row] = []
    torch_modes = [m for m in modes if m in TORCH_MODES]
    if not torch_modes:
        return rows
    module, generated, note = torch_module(case)
    with torch.no_grad(), exact_fp32():
        ref = case.call(module, torch.float32, generated)().float()
    module = module.half()
    for mode in torch_modes:
        log(f"-- {case.name} b{case.batch}: {mode}")
        row = run_torch(case, module, generated, ref, mode, iters)
        row.note = "; ".join(n for n in (note, row.note) if n)
        rows.append(row)
        _free()
    return rows


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _each_case(cases: list[tuple[str, int]], args: Any, device: torch.device, start: float,
               run: Callable[[Case], list[Row]]) -> list[Row]:
    """`run`'s rows for every case until --budget-s has passed, each logged as soon as it is measured
    (a run cut short keeps them)."""
    rows = []
    for name, batch in cases:
        if time.perf_counter() - start > args.budget_s:
            log(f"-- {name} b{batch}: skipped, past --budget-s {args.budget_s:.0f}")
            rows.append(Row(name, batch, "-", note=f"skipped: past --budget-s {args.budget_s:.0f}"))
            continue
        with torch.no_grad():
            done = run(Case(name, batch, args, device))
        rows += done
        _free()
        for cells in results_table(done).rows:
            log("| " + " | ".join(cells) + " |")
    return rows


def results_table(rows: list[Row]) -> Table:
    table = Table("zoo models, fp16", ["model", "batch", "contender", "kernels", "median ms", "min ms",
                                      "p90 ms", "items/s", "setup s", "rel err vs fp32", "note"])
    for r in rows:
        t = r.timing
        table.add(r.model, r.batch, r.contender, r.kernels,
                  *(f"{v / 1000:.3f}" if t else "-" for v in ((t.median_us, t.min_us, t.p90_us) if t else (0, 0, 0))),
                  f"{r.batch / (t.median_us * 1e-6):.0f}" if t else "-",
                  f"{r.setup_s:.1f}" if r.setup_s is not None else "-", r.check.text() if r.check else "-", r.note)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, cpu_smoke=False)
    parser.add_argument("--models", default=",".join(SPECS), help="comma-separated zoo models (default: all)")
    parser.add_argument("--batches", default="1,32", help="comma-separated batch sizes (default 1,32)")
    parser.add_argument("--modes", default="fusegraph,eager,compile",
                        help=f"comma-separated contenders from {', '.join(MODES)} (default fusegraph,eager,compile)")
    parser.add_argument("--iters", type=int, default=100, help="timed replays per contender (default 100)")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="start no new model/batch after this many seconds (default 480)")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    modes = [m.strip() for m in (args.only or args.modes).split(",") if m.strip()]  # --only: the shared alias
    bad = sorted(set(models) - set(SPECS)) + sorted(set(modes) - set(MODES))
    if bad:
        parser.error(f"unknown model(s)/mode(s): {', '.join(bad)}")
    device = torch.device(args.device)
    if device.type != "cuda":
        parser.error("bench/models.py times CUDA graphs: it needs --device cuda")
    iters = 20 if args.quick else args.iters
    torch.backends.cudnn.benchmark = True
    start = time.perf_counter()
    cases = [(name, int(b)) for b in args.batches.split(",") for name in models]  # every model at batch 1 first
    # fusegraph's compiles come first, every case's: after torch.compile or the profiler has run in a
    # process, its kernel tuning there took several times longer (BERT-base 39 s instead of a few)
    fused = _each_case(cases, args, device, start,
                       lambda c: [run_fusegraph(c, iters, m) for m in FUSEGRAPH_MODES if m in modes])
    torch_wanted = any(m in TORCH_MODES for m in modes)
    # written now and again at the end: a run stopped from outside (a time limit) keeps its file
    pending = "fusegraph's kernels not yet counted" + ("; torch not yet run" if torch_wanted else "")
    _write(fused, cases, args, device, start, pending)
    for row in fused:
        count_fusegraph_kernels(row, device)
    _free()
    if torch_wanted:
        _write(fused, cases, args, device, start, "torch's contenders not yet run")
    torch_rows = (_each_case(cases, args, device, start, lambda c: run_torch_case(c, modes, iters))
                  if torch_wanted else [])  # else no "skipped" rows for them
    _write(fused + torch_rows, cases, args, device, start)
    return 0


def _write(rows: list[Row], cases: list[tuple[str, int]], args: Any, device: torch.device, start: float,
           pending: str = "") -> None:
    """The results file of `rows` so far; `pending` says what a file written mid-run still lacks."""
    rows = sorted(rows, key=lambda r: cases.index((r.model, r.batch)))  # each case's rows together, fusegraph first
    notes = [f"fp16, inputs from seed {args.seed} (images U(0,1), token ids within the vocabulary, "
             "masks 0/1); token models at their zoo graph's sequence (bert_base, gpt2_2layer 128; "
             "bert_base_s512 512)",
             "every contender is timed as CUDA-graph replays (CUDA events per replay, median); "
             "kernels: GPU kernels of one replay from torch.profiler; setup: compile + capture + first run",
             "fusegraph runs the zoo graph with the zoo's weights, torch the library's module with its own "
             "random weights; each is checked against its own float32 twin",
             f"total run {time.perf_counter() - start:.0f} s"
             + (f" when this file was written mid-run ({pending}); a finished run rewrites it" if pending else "")]
    write_results(args.name or "models", "zoo models against their libraries' PyTorch modules", device,
                  [results_table(rows)], notes, save=not args.no_save, quiet=bool(pending))


if __name__ == "__main__":
    sys.exit(main())
