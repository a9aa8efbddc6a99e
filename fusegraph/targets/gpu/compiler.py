"""Program -> CompiledProgram: fuse, generate one kernel per fused instruction, plan memory, tune."""

from __future__ import annotations

import copy
import json
import os
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Callable, Iterator

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction, Program
from fusegraph.targets.gpu.autotune import TuningCache, best_config, device_name
from fusegraph.targets.gpu.bound_program import BoundProgram
from fusegraph.targets.gpu.codegen import generate, kernel_inputs, plan_program
from fusegraph.targets.gpu.compiled_program import (CompiledProgram, Kernel, WeightPool, torch_dtype,
                                                    use_interpreter_without_gpu)
from fusegraph.targets.gpu.device_errors import every_config_failed
from fusegraph.targets.gpu.errors import CodegenError
from fusegraph.targets.gpu.kernel_loader import cache_dir, load_kernel
from fusegraph.targets.gpu.kernel_source import DEFAULT_TUNE_CONFIGS, Config, KernelSource
from fusegraph.ir.shape import Shape
from fusegraph.ops.base import is_fused
from fusegraph.targets.gpu.memory_plan import Buffer, MemoryPlan, stored_buffer_input
from fusegraph.targets.gpu.templates.gemm_emit import workspace_elements
from fusegraph.targets.gpu.parallel_compile import ParallelBuild
from fusegraph.targets.gpu.returned_views import copy_returned_views


def _is_fused_program(program: Program) -> bool:
    return any(is_fused(i) for i in program.main)


def compile_gpu(program: Program, *, fp16: bool = False, bf16: bool = False, allow_tf32: bool = False,
                tune: bool = True, exhaustive_tune: bool = False,
                progress: Callable[[str, int, int], None] | None = None,
                weights: WeightPool | None = None, prepared: bool = False,
                timer: Callable[[str], AbstractContextManager[None]] | None = None) -> CompiledProgram:
    """Compile `program` (fused here unless it already is; a copy, the argument is kept).

    fp16/bf16 convert weights and inputs before fusion; products accumulate in fp32. Without
    a GPU the kernels run under Triton's interpreter and are not tuned. Programs compiled with
    one `weights` pool share the device copies of equal literals. `prepared`: `program` is
    what this function compiles after conversion and fusion (a saved program's fused form),
    taken as it is and kept by the result. `timer(phase)` times each phase (a load's report).
    """
    phases: dict[str, float] = {}  # where the compile went (perf and the load report print it)

    @contextmanager
    def phase(name: str) -> Iterator[None]:
        began = time.monotonic()
        with timer(name) if timer else nullcontext():
            yield
        phases[name] = phases.get(name, 0.0) + time.monotonic() - began

    start = time.monotonic()
    interpret = use_interpreter_without_gpu()
    device = "cpu" if interpret else "cuda"
    if not interpret:
        import torch

        torch.cuda.init()
    # importing torch and creating the CUDA context happen once per process, not per compile
    startup = time.monotonic() - start
    start = time.monotonic()
    if prepared:
        p = program
    else:
        with phase("fuse"):
            p = _fused_copy(program, fp16, bf16)
    with phase("plan memory"):
        plan = plan_program(p.main)
    fused = [i for i in p.main if is_fused(i)]
    with phase("generate kernels"):
        sources = [generate(ins, pos, kernel_inputs(ins, plan), allow_tf32, interpret) for pos, ins in enumerate(fused)]
    _plan_scratch(plan, sources)
    with phase("import kernels"):
        kernels = _kernels(fused, sources, plan, interpret, progress)
    options = {"fp16": fp16, "bf16": bf16, "allow_tf32": allow_tf32}
    with phase("upload weights"):
        compiled = CompiledProgram(p, kernels, plan, device, 0.0, options, weights)
    compiled.phase_seconds = phases
    if tune:
        tune_program(compiled, exhaustive_tune, progress)
    compiled.compile_seconds = time.monotonic() - start
    compiled.startup_seconds = startup
    return compiled


def _fused_copy(program: Program, fp16: bool, bf16: bool) -> Program:
    """A fused copy of `program`, in half precision if asked: compiling never changes the
    caller's program, and half precision must come before fusion (it rewrites whole ops)."""
    from fusegraph.passes.pipeline import fuse
    from fusegraph.passes.to_half import ToHalf

    if (fp16 or bf16) and _is_fused_program(program):
        raise ValueError("half precision is applied before fusion: compile the unfused program")
    p = copy.deepcopy(program)
    if fp16 or bf16:
        ToHalf(DType.bfloat16 if bf16 else DType.float16, keep_wide=True).apply(p.main)
    if not _is_fused_program(p):
        fuse(p)
    copy_returned_views(p.main)
    return p


def _plan_scratch(plan: MemoryPlan, sources: list[KernelSource]) -> None:
    """The split-k scratch ("ws" partial-sum slots, "cnt" tile counters), sized for the largest
    need of any config of any kernel, since tuning may pick any of them. One pair serves every
    kernel: they run one after another, each overwrites the slots it reads, and each leaves
    the counters zeroed."""
    need = [workspace_elements(src, c) for src in sources for c in src.configs]
    plan.add_scratch("ws", Shape.of(DType.float32, [max([1] + [n for n, _ in need])]))
    plan.add_scratch("cnt", Shape.of(DType.int32, [max([1] + [t for _, t in need])]))
    sums = [src.parts.workspace(src, c) for src in sources if src.parts for c in src.configs]
    if sums:  # the parts and counters of reductions across programs (templates/gemm_reduce.py)
        plan.add_scratch("part", Shape.of(DType.float32, [max(n for n, _ in sums)]))
        plan.add_scratch("pcnt", Shape.of(DType.int32, [max(t for _, t in sums)]))


def _kernels(fused: list[Instruction], sources: list[KernelSource], plan: MemoryPlan, interpret: bool,
             progress: Callable[[str, int, int], None] | None) -> list[Kernel]:
    """One loaded kernel per fused instruction, its arguments resolved to buffers of the plan:
    "out" is the instruction's own buffer, "out<k>" its k-th further output's, a planned scratch buffer's name that buffer, "x<n>"
    the buffer of the instruction's n-th input (codegen.kernel_inputs names them so)."""
    kernels: list[Kernel] = []
    for pos, (ins, src) in enumerate(zip(fused, sources)):
        if stored_buffer_input(ins) is None and "out" not in src.args:
            raise AssertionError(f"{src.name} writes no output buffer")
        args = [_arg_buffer(a, ins, plan) for a in src.args]
        config = _interpreter_config(src) if interpret else src.configs[0]
        kernels.append(Kernel(ins, src, load_kernel(src), config, args))
        if progress:
            progress("generating kernels", pos + 1, len(fused))
    return kernels


def _arg_buffer(arg: str, ins: Instruction, plan: MemoryPlan) -> Buffer:
    if arg == "out":
        return plan.of[id(ins)]
    if arg.startswith("out") and arg[3:].isdigit():  # a further output (fused_output)
        return plan.further[id(ins)][int(arg[3:]) - 1]
    if arg in plan.scratch:
        return plan.scratch[arg]
    if arg.startswith("x") and arg[1:].isdigit():
        return plan.of[id(ins.inputs[int(arg[1:])])]
    raise CodegenError(f"{ins.name}: kernel argument {arg!r} names no buffer (out, x<n> or a planned scratch buffer)")


def _interpreter_config(src: KernelSource) -> Config:
    """Under the interpreter every program costs Python time: the largest tiles, no split-k."""
    def size(c: Config) -> tuple[int, int]:
        tile = c.get("XBLOCK", 1) * c.get("BM", 1) * c.get("BN", 1) * c.get("BK", 1) * c.get("BO", 1) * c.get("BR", 1)
        return -c.get("SPLIT", 1), tile

    return max(src.configs, key=size)


def tune_program(compiled: CompiledProgram, exhaustive: bool = False,
                 progress: Callable[[str, int, int], None] | None = None) -> None:
    """Tune a program compiled with `tune=False` (what compiling with tuning does, done later:
    a dynamic batch tunes each size at its first run); nothing under the interpreter."""
    if not compiled.interpreted:
        _tune(compiled, exhaustive, progress)


def _tune(compiled: CompiledProgram, exhaustive: bool, progress: Callable[[str, int, int], None] | None) -> None:
    """Pick each kernel's config: from the cache, else by timing its candidates on random inputs."""
    import torch

    cache = TuningCache(cache_dir() / "tuning.json", device_name())
    inputs = {}
    for name, shape in compiled.input_shapes.items():
        dt = torch_dtype(shape.dtype)
        t = torch.rand(shape.lens, device="cuda") if shape.dtype.is_float else torch.zeros(shape.lens, device="cuda")
        inputs[name] = t.to(dt)
    bound = compiled.bind(inputs, capture=False)  # a graph captured now would keep the untuned configs
    plans: dict[tuple, list[Config]] = {}  # one plan per distinct kernel (source and argument types)
    built: dict[tuple, list[int]] = {}  # its candidates' positions in the build jobs
    jobs = []
    for k in compiled.kernels:
        key = _tuning_key(k)
        if key in plans:  # a repeated block's kernel: built and timed once
            continue
        cached = cache.get(k.src.digest)
        if cached is not None:  # tuned (and compiled into Triton's cache) before
            plans[key] = [cached]
            continue
        plans[key] = k.src.configs if exhaustive else k.src.configs[:k.src.default_tune or DEFAULT_TUNE_CONFIGS]
        dtypes = [torch_dtype(b.shape.dtype) for b in k.args]
        built[key] = list(range(len(jobs), len(jobs) + len(plans[key])))
        jobs += [(k.src, dtypes, c) for c in plans[key]]
    started = time.monotonic()
    report = []
    chosen: dict[tuple, Config] = {}
    # kernels are timed in program order (a later kernel may read what an earlier one wrote,
    # indices say), each as soon as its own candidates are built, while the workers go on
    with ParallelBuild(jobs, progress) as build:
        for j, k in enumerate(compiled.kernels):
            key = _tuning_key(k)
            candidates = plans[key]
            if key in chosen or len(candidates) == 1:
                k.config = chosen.get(key, candidates[0])
            else:
                build.wait(built[key])
                stopped = [c for c, i in zip(candidates, built[key]) if i in build.report.stopped]
                k.config, times = best_config(candidates, lambda c: _launch_built(bound, k, c, stopped))
                if all(t == float("inf") for t in times):
                    raise every_config_failed(k.src, k.ins.origin, build.report.failures)
                report.append({"kernel": k.src.name, "flops": k.src.flops, "grid": k.src.grid_dims,
                               "default_tune": k.src.default_tune or DEFAULT_TUNE_CONFIGS, "configs": candidates, "ms": times})
            chosen[key] = k.config
            cache.put(k.src.digest, k.config)
            if progress:
                progress("tuning kernels", j + 1, len(compiled.kernels))
        tuned = time.monotonic()
    compiled.build_report = build.report
    cache.save()
    # the tuning that overlapped the builds costs no wall time: "tune" is what trails them
    compiled.phase_seconds["build"] = build.finished_at - started
    compiled.phase_seconds["tune"] = max(0.0, tuned - build.finished_at)
    if os.environ.get("FUSEGRAPH_TUNING_REPORT") and report:  # every candidate's time, to improve the defaults
        with open(os.environ["FUSEGRAPH_TUNING_REPORT"], "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in report)


def _launch_built(bound: BoundProgram, kernel: Kernel, config: Config, stopped: list[Config]) -> None:
    """Launch `kernel` under `config`, unless its build was stopped at the limit: launching
    would build it here, as long again; the tuner counts the refusal as a failed config."""
    if config in stopped:
        raise RuntimeError(f"{kernel.src.name} {config}: build stopped at the limit")
    bound.launch(kernel, config)


def _tuning_key(kernel: Kernel) -> tuple:
    """Kernels of one source (codegen names kernels by content) and one set of argument types
    compile to one binary and run alike, so one tuning serves them all."""
    return (kernel.src.digest, tuple(str(b.shape.dtype) for b in kernel.args))
