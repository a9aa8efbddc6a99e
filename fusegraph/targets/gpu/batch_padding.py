"""Padding a dynamic batch's request on the device.

A request of b samples runs a program compiled for a size s >= b. The b samples are copied
once, host to device, into a tensor of s samples kept per (size, input), and the rest of it is
filled on the device with copies of the last sample: no padded copy is made on the host, and
the tensor's fixed address lets each size keep its captured CUDA graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fusegraph.targets.gpu.compiled_program import CompiledProgram, host_to_torch, torch_dtype, torch_to_host


class DevicePadding:
    def __init__(self) -> None:
        self._staged: dict[tuple[int, str], Any] = {}

    def run(self, compiled: CompiledProgram, size: int, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run `compiled` (of batch `size`) on `arrays` (a smaller or equal batch); the first
        samples of its outputs, as many as `arrays` hold, copied to the host."""
        batch = next(iter(arrays.values())).shape[0] if arrays else size
        tensors = {name: self._staging(compiled, size, name, arr) for name, arr in arrays.items()}
        outputs = compiled.run(tensors)
        return {k: torch_to_host(v[:batch]) for k, v in outputs.items()}

    def _staging(self, compiled: CompiledProgram, size: int, name: str, arr: np.ndarray) -> Any:
        import torch

        shape = compiled.input_shapes[name]
        key = (size, name)
        if key not in self._staged:
            self._staged[key] = torch.empty(shape.lens, dtype=torch_dtype(shape.dtype), device=compiled.device)
        staged = self._staged[key]
        b = arr.shape[0]
        staged[:b].copy_(host_to_torch(arr.astype(shape.dtype.numpy, copy=False)))
        if b < size:
            staged[b:].copy_(staged[b - 1:b].expand(size - b, *shape.lens[1:]))
        return staged
