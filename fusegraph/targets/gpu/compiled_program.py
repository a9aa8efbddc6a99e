"""A fused program compiled for the GPU: its kernels, its buffers and how to run them.

Weights are uploaded once; every intermediate lives in one arena planned from liveness;
outputs have buffers of their own. On a GPU the whole program is captured once into a CUDA
graph per set of input addresses and replayed, so a run costs one graph launch however many
kernels it holds. Without a GPU the same kernels run under Triton's interpreter (on the CPU),
which is how CI tests them. `bind` gives the BoundProgram (bound_program.py) through which
everything else launches kernels.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from fusegraph.errors import FusegraphError, InputError, TargetUnavailableError
from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction, Program
from fusegraph.targets.gpu.bound_program import BoundProgram
from fusegraph.targets.gpu.device_errors import kernel_failed, out_of_memory
from fusegraph.targets.gpu.index_bounds import check_index_inputs, gather_index_bounds
from fusegraph.targets.gpu.kernel_source import Config, KernelSource
from fusegraph.targets.gpu.memory_plan import Buffer, BufferKind, MemoryPlan


# Bytes every buffer a kernel reads starts on: Triton's launcher builds its kernels for
# 16-byte aligned pointers, and a tensor descriptor (templates/gemm_tma.py) needs them. The
# program's own buffers are aligned to 256; a caller's tensor that is not gets copied.
INPUT_ALIGNMENT = 16


def ensure_allocator(device: str) -> None:
    """Give Triton an allocator for kernels' global scratch (tensor descriptors made in a kernel)
    when none is set in this context (a context variable: each thread starts without): torch's,
    on `device` and the launch's stream, so the scratch follows stream order as any torch
    tensor does, and a CUDA graph keeps it in its own pool."""
    import torch
    import triton
    from triton.runtime import _allocation

    current = _allocation._allocator.get()
    if isinstance(current, _allocation.NullAllocator):
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device))


def use_interpreter_without_gpu() -> bool:
    """Set TRITON_INTERPRET=1 when no GPU is present (before any kernel is defined)."""
    import torch

    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise TargetUnavailableError("no GPU: the kernels need Triton's interpreter, which must be switched on "
                                     "before triton is imported; set TRITON_INTERPRET=1 in the environment")
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def host_to_torch(arr: np.ndarray) -> Any:
    """A CPU tensor of `arr`; bfloat16 (which NumPy lacks) goes through its 16-bit pattern."""
    import torch

    arr = np.ascontiguousarray(arr)
    if arr.dtype == DType.bfloat16.numpy:
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def torch_to_host(t: Any) -> np.ndarray:
    """A NumPy copy of tensor `t` (bfloat16 as ml_dtypes' bfloat16)."""
    import torch

    on_host = t.device.type == "cpu"
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(DType.bfloat16.numpy).copy()
    return t.numpy().copy() if on_host else t.numpy()  # a device tensor's .cpu() is already a copy


def torch_dtype(d: DType) -> Any:
    import torch

    return {DType.float32: torch.float32, DType.float16: torch.float16, DType.bfloat16: torch.bfloat16,
            DType.float64: torch.float64, DType.int64: torch.int64, DType.int32: torch.int32,
            DType.int16: torch.int16, DType.int8: torch.int8, DType.uint8: torch.uint8, DType.uint16: torch.uint16,
            DType.uint32: torch.uint32, DType.uint64: torch.uint64, DType.bool: torch.bool}[d]


class WeightPool:
    """Device copies of literals by content, shared by the programs compiled with one pool: the
    per-size programs of a dynamic batch hold the same weights, uploaded once."""

    def __init__(self) -> None:
        self._tensors: dict[tuple[Any, ...], Any] = {}

    def upload(self, value: np.ndarray, perm: tuple[int, ...] | None, device: str) -> Any:
        """The flat device tensor of `value` (transposed by `perm` first when given)."""
        import hashlib

        value = np.ascontiguousarray(value)
        key = (value.dtype.str, value.shape, perm, device, hashlib.sha256(value.reshape(-1).view(np.uint8)).hexdigest())
        if key not in self._tensors:
            self._tensors[key] = upload_literal(value, perm, device)
        return self._tensors[key]


def upload_literal(value: np.ndarray, perm: tuple[int, ...] | None, device: str) -> Any:
    """A flat device copy of `value`, transposed by `perm` first when given."""
    laid_out = np.ascontiguousarray(value if perm is None else np.transpose(value, perm))
    return host_to_torch(laid_out.reshape(-1).copy()).to(device)


@dataclass
class Kernel:
    """One launch: the generated source, the Triton function, its config and arguments."""

    ins: Instruction
    src: KernelSource
    fn: Any
    config: Config
    args: list[Buffer]

    @property
    def grid(self) -> tuple[int, ...]:
        return self.src.grid(self.config)

    def launch(self, tensors: list[Any], config: Config | None = None) -> None:
        c = config or self.config
        constexprs, options = self.src.launch_arguments(c)
        if self.src.tensor_descriptors:
            ensure_allocator(tensors[0].device.type)
        try:
            self.fn[self.src.grid(c)](*tensors, **constexprs, **options)
        except FusegraphError:
            raise
        except Exception as e:  # noqa: BLE001 - Triton's own error, said with the kernel's name
            raise kernel_failed(self.src, self.ins.origin, c, e) from e


class CompiledProgram:
    """Run with `run(inputs)`; `replay()` re-runs the last bound inputs (for timing); `bound`
    is the BoundProgram of the last `bind` (or run), None before the first."""

    def __init__(self, program: Program, kernels: list[Kernel], plan: MemoryPlan, device: str,
                 compile_seconds: float, options: dict[str, Any], weights: WeightPool | None = None) -> None:
        import torch

        self.program = program
        self.kernels = kernels
        self.plan = plan
        self.device = device
        self.compile_seconds = compile_seconds
        self.startup_seconds = 0.0  # torch import and CUDA context, paid once per process
        self.phase_seconds: dict[str, float] = {}  # seconds per compile phase (fuse ... build, tune)
        self.build_report: Any = None  # the parallel build's report (parallel_compile.BuildReport), if tuned
        self.options = options
        self.interpreted = device == "cpu"
        main = program.main
        self._params = {k: v for k, v in main.params.items()}
        self.index_bounds = gather_index_bounds(main)  # host inputs read as gather indices are checked
        self._returns = dict(zip(main.return_names, main.returns))
        self._tensors: dict[int, Any] = {}  # buffer id -> its flat tensor
        self._staged: dict[str, Any] = {}  # device copies of host (NumPy) inputs, at fixed addresses
        try:
            self._allocate(main, plan, device, weights)
        except torch.cuda.OutOfMemoryError:
            raise out_of_memory(plan, device) from None
        self._graphs: dict[tuple, tuple[Any, BoundProgram]] = {}  # input addresses -> CUDA graph
        self._graph_key: tuple | None = None  # the graph `replay` runs
        self.last_capture: dict[str, float] = {}  # seconds of the last capture's steps
        self.bound: BoundProgram | None = None

    def _allocate(self, main: Any, plan: MemoryPlan, device: Any, weights: WeightPool | None) -> None:
        """Upload the weights (through `weights` when programs share them) and make the arena,
        output and scratch buffers."""
        import torch

        arena = torch.empty(max(plan.arena_bytes, 1), dtype=torch.uint8, device=device)
        self._arena = arena
        for ins in main.instructions:
            b = plan.of.get(id(ins))
            if b is None or b.id in self._tensors:
                continue
            dt = torch_dtype(b.shape.dtype)
            n = max(1, b.shape.elements)
            if b.kind == BufferKind.LITERAL:
                upload = weights.upload if weights is not None else upload_literal
                self._tensors[b.id] = upload(ins.op.value, b.perm, device)
            elif b.kind == BufferKind.ARENA:
                self._tensors[b.id] = arena[b.offset:b.offset + n * b.shape.dtype.itemsize].view(dt)
            elif b.kind == BufferKind.OUTPUT:
                self._tensors[b.id] = torch.empty(n, dtype=dt, device=device)
        for b in plan.buffers:
            if b.kind == BufferKind.SCRATCH:
                self._tensors[b.id] = torch.zeros(max(1, b.shape.elements), dtype=torch_dtype(b.shape.dtype), device=device)

    # -- facts -------------------------------------------------------------------------
    @property
    def kernel_count(self) -> int:
        return len(self.kernels)

    @property
    def input_shapes(self) -> dict[str, Any]:
        return {k: v.shape for k, v in self._params.items()}

    def kernel_sources(self) -> str:
        return "\n".join(f"# {k.ins.name}: {k.src.kernel_name}, template {k.src.template}, config {k.config}\n{k.src.body}"
                         for k in self.kernels)

    def poison(self) -> None:
        """Fill every intermediate and output buffer, and the split-k slots, with NaN (integers
        with their minimum), so a test run shows any element a kernel failed to write or a
        partial sum it read before it was written. The tile counters stay zero."""
        import torch

        self._arena.fill_(0xFF)  # NaN in every float format, -1 in integers
        workspace = self.plan.scratch.get("ws")
        for b in self.plan.buffers:
            if b.kind == BufferKind.OUTPUT or b is workspace:
                t = self._tensors[b.id]
                t.fill_(float("nan") if t.is_floating_point() else (True if t.dtype == torch.bool else torch.iinfo(t.dtype).min))

    # -- running -----------------------------------------------------------------------
    def _device_inputs(self, inputs: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        import torch

        unknown = sorted(set(inputs) - set(self._params))
        missing = sorted(set(self._params) - set(inputs))
        if unknown or missing:
            raise InputError(f"unknown {unknown} / missing {missing} inputs; the program expects: " +
                             ", ".join(f"{k} {list(p.shape.lens)} {p.shape.dtype.numpy.name}" for k, p in self._params.items()))
        out: dict[str, Any] = {}
        host = not any(isinstance(v, torch.Tensor) or hasattr(v, "__dlpack__") and not isinstance(v, np.ndarray)
                       for v in inputs.values())  # NumPy in (or no inputs): NumPy out
        for name, p in self._params.items():
            v = inputs[name]
            want = torch_dtype(p.shape.dtype)
            if not isinstance(v, (torch.Tensor, np.ndarray)) and hasattr(v, "__dlpack__"):
                v = torch.from_dlpack(v)  # CuPy, JAX, ... arrays: shared, not copied
            if not isinstance(v, torch.Tensor):
                arr = np.asarray(v)
                if arr.dtype != p.shape.dtype.numpy and not (arr.dtype.kind == "f" and p.shape.dtype.is_float):
                    raise InputError(f"input {name!r} has dtype {arr.dtype.name}, expected {p.shape.dtype.numpy.name}")
                if tuple(arr.shape) != p.shape.lens:
                    raise InputError(f"input {name!r} has shape {list(arr.shape)}, expected {list(p.shape.lens)}")
                check_index_inputs(self.index_bounds, {name: arr})
                staging = self._staging(name, p, want)
                if arr.size:
                    # torch converts float types (vectorized, rounding to nearest even as NumPy does):
                    # NumPy's element-by-element float16 conversion costs more than the copy itself
                    staging[:arr.size].copy_(host_to_torch(arr).reshape(-1))
                v = staging
            else:
                if tuple(v.shape) != p.shape.lens:
                    raise InputError(f"input {name!r} has shape {list(v.shape)}, expected {list(p.shape.lens)}")
                if v.device.type != torch.device(self.device).type:
                    v = v.to(self.device)
                if v.dtype != want:
                    v = v.to(want)
                v = v.contiguous().reshape(-1)
                if v.data_ptr() % INPUT_ALIGNMENT:  # a view into the middle of a tensor
                    v = v.clone()
            if tuple(v.shape) != (max(1, p.shape.elements),) and v.numel() != p.shape.elements:
                raise InputError(f"input {name!r} has {v.numel()} elements, expected {p.shape.elements}")
            out[name] = v
        return out, host

    def _staging(self, name: str, p: Instruction, dtype: Any) -> Any:
        import torch

        if name not in self._staged:
            self._staged[name] = torch.empty(max(1, p.shape.elements), dtype=dtype, device=self.device)
        return self._staged[name]

    def prepare(self) -> None:
        """Capture, ahead of the first run, the CUDA graph that runs NumPy inputs (copied into
        staging buffers at fixed addresses): the first such run then only copies and replays.
        The staging buffers hold zeros meanwhile (valid indices for any gather)."""
        if self.interpreted:
            return
        staged = {}
        for name, p in self._params.items():
            staged[name] = self._staging(name, p, torch_dtype(p.shape.dtype))
            staged[name].zero_()
        self._bind(staged, capture=True)

    def bind(self, inputs: Mapping[str, Any], *, capture: bool = True) -> BoundProgram:
        """Bind inputs without running: host arrays are copied to the device, device tensors
        used in place. On a GPU `capture` also captures the CUDA graph `replay()` runs (once per
        set of input addresses); the tuner, which launches kernels under other configs, binds
        without."""
        return self._bind(self._device_inputs(inputs)[0], capture)

    def _bind(self, tensors: dict[str, Any], capture: bool) -> BoundProgram:
        import torch

        bound = BoundProgram(self.kernels, self.plan, self._returns, self._tensors, tensors)
        self.bound = bound
        self._graph_key = None
        if self.interpreted or not capture:
            return bound
        key = tuple(t.data_ptr() for t in tensors.values())
        if key not in self._graphs:
            start = time.perf_counter()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                bound.launch_all()  # compiles and warms up outside the capture
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            captured = time.perf_counter()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                bound.launch_all()
            self.last_capture = {"first launches": captured - start, "CUDA graph capture": time.perf_counter() - captured}
            if len(self._graphs) >= 4:
                self._graphs.pop(next(iter(self._graphs)))
            self._graphs[key] = (graph, bound)
        self._graph_key = key
        return bound

    def _last_bound(self) -> BoundProgram:
        if self.bound is None:
            raise RuntimeError("bind inputs first")
        return self.bound

    def replay(self) -> None:
        """Run the program on the last bound inputs (one graph launch on a GPU)."""
        bound = self._last_bound()
        if self.interpreted:
            bound.launch_all()
            return
        if self._graph_key is None:
            raise RuntimeError("bind inputs first (with capture: the last bind captured no graph)")
        self._graphs[self._graph_key][0].replay()

    def outputs(self) -> dict[str, Any]:
        """The output tensors of the last bound inputs (views of buffers the next run overwrites)."""
        return self._last_bound().outputs()

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Run once. NumPy inputs give NumPy outputs (copies); torch tensors (or any DLPack
        array) on the device are read in place and give device tensors that stay valid until
        the next run (`torch.utils.dlpack` hands them to other frameworks without a copy)."""
        tensors, host = self._device_inputs(inputs)  # host inputs are copied to the device once, here
        self._bind(tensors, capture=True)
        self.replay()
        outs = self.outputs()
        if host:
            return {k: torch_to_host(v) for k, v in outs.items()}
        return outs

    # -- timing ------------------------------------------------------------------------
    def time_kernels(self, iterations: int = 50, repeats: int = 10) -> list[float]:
        """Milliseconds of each kernel alone: a CUDA graph of `repeats` launches of it, replayed
        `iterations` times between events, the median divided by `repeats` (launch gaps out)."""
        import torch

        if self.interpreted:
            raise RuntimeError("kernel timing needs a GPU")
        bound = self._last_bound()
        out = []
        for i in range(len(self.kernels)):
            bound.launch(i)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(repeats):
                    bound.launch(i)
            out.append(float(np.median(_event_times(graph.replay, iterations))) / repeats)
        return out

    def time_runs(self, iterations: int = 100) -> list[float]:
        """Milliseconds of each of `iterations` graph replays (GPU time, events around each)."""
        return _event_times(self.replay, iterations)


def _event_times(fn: Callable[[], None], iterations: int) -> list[float]:
    """Milliseconds of GPU time of each of `iterations` calls of `fn`, events around each."""
    import torch

    out = []
    for _ in range(iterations):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e))
    return out


def progress_printer(stream: Any = None) -> Callable[[str, int, int], None]:
    """A one-line progress bar on stderr: `compiling kernels [#####-----] 31/65`."""
    out = stream or sys.stderr
    last = [0.0]

    def show(what: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - last[0] < 0.1:
            return
        last[0] = now
        width = 30
        filled = width * done // max(1, total)
        out.write(f"\r{what} [{'#' * filled}{'-' * (width - filled)}] {done}/{total}")
        if done >= total:
            out.write("\n")
        out.flush()

    return show
