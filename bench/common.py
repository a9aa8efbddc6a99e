"""What the benchmark scripts share: accuracy checks, guarded use of fusegraph's GPU target, options.

fusegraph's GPU target (`fusegraph.compile(program, "gpu")`) may be missing or broken on a given
checkout; the torch contenders must still run then, so every use of it goes through
`compile_fusegraph` / `FusegraphRunner`, which turn a failure into a reason printed in the table.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import torch

import fusegraph
from fusegraph.ir.program import Program


@contextlib.contextmanager
def environment(name: str, value: str) -> Iterator[None]:
    """The environment variable `name` set to `value` for the block, then as it was."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            del os.environ[name]
        else:
            os.environ[name] = saved


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """Float32 convolutions and matrix products without TF32, for the references.

    PyTorch lets cuDNN convolutions use TF32 by default (10-bit mantissas): a "float32"
    reference computed that way carries errors of about 1e-3, the size of what it is meant
    to measure.
    """
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (inf for a shape mismatch or a non-finite value)."""
    if tuple(out.shape) != tuple(ref.shape):
        return math.inf
    a = out.detach().to(torch.float64)
    b = ref.detach().to(device=a.device, dtype=torch.float64)
    if not bool(torch.isfinite(a).all()):
        return math.inf
    return float(torch.linalg.vector_norm(a - b) / max(float(torch.linalg.vector_norm(b)), 1e-30))


def fmt_err(err: float | None) -> str:
    return "-" if err is None else ("inf" if math.isinf(err) else f"{err:.1e}")


@dataclass
class Check:
    """The outcome of an accuracy check against the float32 reference."""

    err: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.err < self.tolerance

    def text(self) -> str:
        return fmt_err(self.err) + ("" if self.ok else " FAIL")


def check(out: torch.Tensor, ref: torch.Tensor, tolerance: float) -> Check:
    return Check(rel_err(out, ref), tolerance)


class FusegraphRunner:
    """fusegraph's compiled program behind the API the benchmarks time.

    `compiled.run(inputs)` takes torch tensors on the GPU and returns a dict of them;
    `compiled.bind(inputs)` binds inputs without running and `compiled.replay()` replays the
    captured CUDA graph on them. Inputs are offered in the benchmark's dtype (fp16) first;
    a target that wants the model's own float32 inputs gets those instead, and the table
    says so.
    """

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled
        self.input_dtype: torch.dtype | None = None

    def _cast(self, inputs: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in inputs.items()}

    def run(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.input_dtype is not None:
            return self.compiled.run(self._cast(inputs, self.input_dtype))
        first = next(iter(inputs.values())).dtype
        try:
            out = self.compiled.run(dict(inputs))
            self.input_dtype = first
            return out
        except Exception as first_error:
            if first == torch.float32:
                raise
            try:
                out = self.compiled.run(self._cast(inputs, torch.float32))
            except Exception:
                raise first_error from None
            self.input_dtype = torch.float32
            return out

    def bind(self, inputs: Mapping[str, torch.Tensor]) -> None:
        self.compiled.bind(self._cast(inputs, self.input_dtype or next(iter(inputs.values())).dtype))

    def replay(self) -> None:
        self.compiled.replay()

    @property
    def kernel_count(self) -> int | None:
        return getattr(self.compiled, "kernel_count", None)

    def note(self) -> str:
        """What the table should say about how fusegraph was fed."""
        if self.input_dtype == torch.float32:
            return "fusegraph took float32 inputs (its graph converts them)"
        return ""


def compile_fusegraph(program: Program, device: torch.device, fp16: bool = True,
                      exhaustive_tune: bool = False) -> tuple[FusegraphRunner | None, str]:
    """Compile for the GPU; on failure (no GPU target yet, no CUDA, an error) None and the reason."""
    if device.type != "cuda":
        return None, "fusegraph's GPU target needs CUDA"
    try:
        compiled = fusegraph.compile(program, "gpu", fp16=fp16, exhaustive_tune=exhaustive_tune,
                                     progress=progress_log())
    except Exception as e:  # report, never abort the torch contenders
        traceback.print_exc()
        return None, f"compile failed: {first_line(e)}"
    return FusegraphRunner(compiled), ""


def progress_log(every_s: float = 15.0) -> Callable[[str, int, int], None]:
    """Compile progress as a line on stderr every `every_s` seconds and at each phase's end:
    a benchmark's log then says where a compile cut short by its time limit was (building or
    tuning, how far), where a progress bar would leave one overwritten line."""
    start = time.monotonic()
    last = [start]

    def show(what: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done >= total or now - last[0] >= every_s:
            last[0] = now
            print(f"   [{now - start:6.1f} s] {what} {done}/{total}", file=sys.stderr, flush=True)

    return show


def bench_parser(doc: str, cpu_smoke: bool = True) -> argparse.ArgumentParser:
    """A script's argument parser (its docstring's first paragraph as description) with the
    options every benchmark shares; `cpu_smoke`: whether the script has a CPU smoke run, so
    that --device's help does not promise one a script refuses."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser, cpu_smoke)
    return parser


def add_common_args(parser: argparse.ArgumentParser, cpu_smoke: bool = True) -> None:
    parser.add_argument("--device", default="cuda",
                        help="cuda (default) or cpu (a smoke run of the torch contenders)" if cpu_smoke
                        else "cuda (the default and the only choice: this benchmark times CUDA graphs)")
    parser.add_argument("--quick", action="store_true", help="few runs: a smoke test, not a measurement")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and inputs")
    parser.add_argument("--tolerance", type=float, default=1e-2,
                        help="largest relative norm error against the float32 reference (default 1e-2)")
    parser.add_argument("--name", default=None, help="results file name under bench/results/ (without .md)")
    parser.add_argument("--only", default=None,
                        help="comma-separated contenders to run (default: all that apply)")
    parser.add_argument("--no-save", action="store_true", help="print the tables, write no results file")


def selected(name: str, only: str | None) -> bool:
    return only is None or name in {s.strip() for s in only.split(",")}


def failure(e: BaseException) -> str:
    """A contender's failure as its table note, with the traceback printed to the log: the
    other contenders still run."""
    traceback.print_exc()
    return f"failed: {first_line(e)}"


def first_line(e: BaseException) -> str:
    """An exception as one table cell: its type and the first line of its message."""
    text = str(e)
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
