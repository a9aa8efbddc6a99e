"""A compiled program's kernels bound to one set of device inputs: what a run, the tuner, the
profiler and the benchmarks launch.

Binding turns the program's buffers into the tensors each kernel is called with, so callers
launch a kernel (under its own config or another) without knowing where the buffers live:
weights, the arena, outputs and scratch belong to the compiled program, the inputs to the
binding. The tensors are the program's own storage, so a launch writes the program's
intermediates and outputs, and `outputs()` reads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from fusegraph.ir.program import Instruction
from fusegraph.targets.gpu.kernel_source import Config
from fusegraph.targets.gpu.memory_plan import Buffer, BufferKind, MemoryPlan

if TYPE_CHECKING:
    from fusegraph.targets.gpu.compiled_program import Kernel


class BoundProgram:
    """Made by `CompiledProgram.bind(inputs)`; `inputs` are the device tensors it reads (flat,
    in the program's dtypes), by parameter name."""

    def __init__(self, kernels: list[Kernel], plan: MemoryPlan, returns: Mapping[str, Instruction],
                 storage: Mapping[int, Any], inputs: dict[str, Any]) -> None:
        self.kernels = kernels
        self.inputs = inputs
        self._plan = plan
        self._returns = returns
        self._storage = storage  # buffer id -> flat tensor, for every buffer but the params
        self._position = {id(k): i for i, k in enumerate(kernels)}
        self._args: dict[int, list[Any]] = {}  # kernel position -> its argument tensors, made on first use

    def tensor(self, buffer: Buffer) -> Any:
        """The flat tensor that holds `buffer`: a bound input for a parameter, else the program's own."""
        return self.inputs[buffer.name] if buffer.kind == BufferKind.PARAM else self._storage[buffer.id]

    def args(self, kernel: Kernel | int) -> list[Any]:
        """The tensors `kernel` (or the kernel at that position) is launched with, in its argument order."""
        i = self._index(kernel)
        if i not in self._args:
            self._args[i] = [self.tensor(b) for b in self.kernels[i].args]
        return self._args[i]

    def launch(self, kernel: Kernel | int, config: Config | None = None) -> None:
        """Launch one kernel on the bound tensors, under `config` or its own."""
        i = self._index(kernel)
        self.kernels[i].launch(self.args(i), config)

    def launch_all(self) -> None:
        """Launch every kernel in program order: one run (no synchronisation)."""
        for i in range(len(self.kernels)):
            self.launch(i)

    def outputs(self) -> dict[str, Any]:
        """The returned values, by name: strided views of the buffers the next launch overwrites."""
        import torch

        out = {}
        for name, r in self._returns.items():
            base = self.tensor(self._plan.of[id(r)])
            out[name] = torch.as_strided(base, r.shape.lens, r.shape.strides, r.shape.offset)
        return out

    def _index(self, kernel: Kernel | int) -> int:
        if isinstance(kernel, int):
            if not 0 <= kernel < len(self.kernels):
                raise IndexError(f"kernel {kernel} of a program of {len(self.kernels)} kernels")
            return kernel
        i = self._position.get(id(kernel))
        if i is None:
            raise ValueError(f"kernel {kernel.src.name} is not one of this program's")
        return i
