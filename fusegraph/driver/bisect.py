"""Per-instruction verification of the gpu target: which fused kernel goes wrong first.

A wrong output says little about where the error came from: one bad kernel spoils every kernel
after it. So each kernel is launched alone, in program order, and its output is read back at
once (intermediates share arena bytes, so a later kernel may overwrite it) and compared with
the ref target's value of the same fused instruction, evaluated on the same inputs. The first
instruction beyond the tolerance is the kernel to look at; the ones before it are shown to pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from fusegraph.driver.verify import Comparison, compare
from fusegraph.ir.printer import format_module, instruction_names
from fusegraph.ops.base import is_allocate, is_load, is_param
from fusegraph.targets.gpu.compiled_program import torch_to_host
from fusegraph.targets.gpu.memory_plan import physical_shape, stored_buffer_input
from fusegraph.targets.ref.runner import instruction_values, run_module

if TYPE_CHECKING:
    from fusegraph.ir.program import Instruction
    from fusegraph.targets.gpu.compiled_program import CompiledProgram, Kernel


@dataclass
class Step:
    """One fused instruction's comparison: its main-module name (`@12`), its kernel and figures."""

    name: str
    kernel: "Kernel"
    comparison: Comparison

    def line(self) -> str:
        return f"{self.name} kernel {self.kernel.src.name}: {self.comparison.line()}"


def bisect(compiled: "CompiledProgram", inputs: Mapping[str, np.ndarray], tolerance: float) -> list[Step]:
    """The steps up to and including the first fused instruction whose gpu output differs from
    the ref target's beyond `tolerance` (all of them when none does)."""
    program = compiled.program
    host = {k: np.asarray(v).astype(program.input_shapes[k].dtype.numpy) for k, v in inputs.items()}
    want = instruction_values(program, host)
    names = instruction_names(program.main)
    compiled.poison()
    bound = compiled.bind(host, capture=False)
    steps: list[Step] = []
    for k, kernel in enumerate(compiled.kernels):
        bound.launch(k)
        got = _kernel_output(compiled, bound, kernel.ins)
        ref, written = _reference(kernel.ins, want)
        if written is not None:
            got, ref = got[written], ref[written]
        c = compare(kernel.src.kernel_name, got, ref, tolerance)
        steps.append(Step(names[id(kernel.ins)], kernel, c))
        if not c.passed:
            break
    return steps


def _kernel_output(compiled: "CompiledProgram", bound: Any, ins: "Instruction") -> np.ndarray:
    """The logical value of `ins` in its buffer: the buffer read through its physical layout.
    An arena buffer is a view into the arena, and `as_strided` counts its offset from the start
    of the storage, so the view's own offset is added."""
    import torch

    shape = physical_shape(ins, compiled.plan)
    flat = bound.tensor(compiled.plan.of[id(ins)])
    return torch_to_host(torch.as_strided(flat, shape.lens, shape.strides, flat.storage_offset() + shape.offset))


def _reference(ins: "Instruction", want: Mapping[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    """The ref value of `ins` and a mask of the elements its kernel writes (None: all). A kernel that stores
    into an earlier buffer (concat elimination) writes only its part; that part is found by
    evaluating the group on two destinations of different contents: where the results agree."""
    value = np.asarray(want[id(ins)])
    k = stored_buffer_input(ins)
    if k is None:
        return value, None
    sub = ins.op.module
    args = [want[id(x)] for x in ins.inputs]
    results = []
    for fill in (0, 1):
        args[k] = np.full_like(args[k], fill)
        results.append(run_module(sub, args=dict(zip(sub.params.values(), args)))[0])
    a, b = results
    same = (a == b) | ((a != a) & (b != b))  # NaN where both wrote NaN
    return value, same


def origin_names(ins: "Instruction") -> list[str]:
    """The ONNX nodes whose computation a fused instruction holds, in its sub-module's order,
    each once. Parameters, loads and fresh buffers are left out: they carry the origin of the
    value they read (another kernel's node), not of work done here."""
    names = [x.origin for x in ins.op.module.instructions
             if not (is_param(x) or is_load(x) or is_allocate(x))] + [ins.origin]
    return list(dict.fromkeys(n for n in names if n))


def report(steps: list[Step]) -> tuple[str, bool]:
    """The text of a bisection and whether every fused instruction agreed."""
    lines = ["per-instruction comparison (each kernel's output right after it runs vs the ref target's):"]
    lines += ["  " + s.line() for s in steps]
    last = steps[-1] if steps else None
    if last is None or last.comparison.passed:
        lines.append(f"all {len(steps)} fused instructions agree with the ref target")
        return "\n".join(lines), True
    c, ins = last.comparison, last.kernel.ins
    lines += [f"first difference: {last.name} ({len(steps) - 1} earlier fused instructions agree)",
              f"  kernel: {last.kernel.src.name} ({c.name}, template {last.kernel.src.template})",
              f"  origin: {', '.join(origin_names(ins)) or '(none)'}",
              f"  max abs error {c.max_abs:.3e}, relative norm error {c.rel_norm:.3e} (tolerance {c.tolerance:.0e})",
              "  sub-module:"]
    lines += ["    " + line for line in format_module(ins.op.module).splitlines()]
    return "\n".join(lines), False
