"""Moving a batch's NumPy request to the device and its answer back, padded and converted there.

A request of b samples runs a program compiled for a size s >= b. Per (size, input) a device
tensor of s samples keeps a fixed address (so each size keeps its captured CUDA graph); the b
samples go into it and the rest is filled on the device with copies of the last sample, so no
padded copy is made on the host.

The host side is where a large batch loses its time (YOLOv5s at batch 32 moves 157 MB in and
137 MB out for 2.4 ms of kernels), so every conversion happens on the device: a float32
request for a half-precision program crosses as float32 and is rounded by the GPU (NumPy
converts float16 element by element, slower than the copy), and an answer is widened there
to the dtype the caller asks for. Transfers go through page-locked buffers kept per input and
output: the copy engine reads and writes them at full speed, where pageable memory is staged
by the driver in small pieces.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.targets.gpu.compiled_program import CompiledProgram, host_to_torch, torch_dtype, torch_to_host
from fusegraph.targets.gpu.index_bounds import check_index_inputs


class DevicePadding:
    def __init__(self) -> None:
        self._staged: dict[tuple[Any, ...], Any] = {}

    def run(self, compiled: CompiledProgram, size: int, arrays: Mapping[str, np.ndarray],
            output_dtypes: Mapping[str, np.dtype] | None = None) -> dict[str, np.ndarray]:
        """Run `compiled` (of batch `size`) on `arrays` (a smaller or equal batch, any float
        dtype for a float input); the first samples of its outputs, as many as `arrays` hold,
        as new host arrays, in `output_dtypes` where given (converted on the device)."""
        check_index_inputs(compiled.index_bounds, arrays)
        tensors = {name: self._to_device(compiled, name, arr) for name, arr in arrays.items()}
        return {k: self._to_host(k, v) for k, v in self.run_on_device(compiled, size, tensors, output_dtypes).items()}

    def run_on_device(self, compiled: CompiledProgram, size: int, tensors: Mapping[str, Any],
                      output_dtypes: Mapping[str, np.dtype] | None = None) -> dict[str, Any]:
        """`run` for torch tensors (on any device, any float dtype for a float input): new
        device tensors of the first samples, in `output_dtypes` where given. Nothing crosses to
        the host: a server hands these to Triton, which copies them where its client wants them."""
        import torch

        batch = next(iter(tensors.values())).shape[0] if tensors else size
        staged = {}
        for name, t in tensors.items():
            shape = compiled.input_shapes[name]
            staged[name] = self._buffer(("input", size, name), tuple(shape.lens), torch_dtype(shape.dtype),
                                        compiled.device)
            staged[name][:batch].copy_(t, non_blocking=True)  # to the device and to its dtype there
            _pad(staged[name], batch)
        outputs = compiled.run(staged)
        wanted = dict(output_dtypes or {})
        out = {}
        for k, v in outputs.items():
            want = torch_dtype(DType.from_numpy(wanted[k])) if k in wanted else v.dtype
            # a copy either way: the program's output buffers are overwritten by its next run
            out[k] = v[:batch].to(want) if want != v.dtype else v[:batch].clone()
        if compiled.device != "cpu":
            torch.cuda.current_stream().synchronize()  # Triton reads the outputs on streams of its own
        return out

    def _buffer(self, key: tuple[Any, ...], shape: tuple[int, ...], dtype: Any, device: str) -> Any:
        """A kept buffer of at least `shape`'s elements (a view of that shape), page-locked on the host."""
        import torch

        n = int(np.prod(shape, dtype=np.int64))
        buf = self._staged.get(key)
        if buf is None or buf.numel() < n:
            pin = device == "cpu" and torch.cuda.is_available()
            buf = torch.empty(max(n, 1), dtype=dtype, device=device, pin_memory=pin)
            self._staged[key] = buf
        return buf[:n].view(shape)

    def _to_device(self, compiled: CompiledProgram, name: str, arr: np.ndarray) -> Any:
        """A host array on the program's device, still in its own dtype (a float converts there,
        later): the caller's bytes are copied once into page-locked memory, then by the copy engine."""
        dtype = compiled.input_shapes[name].dtype.numpy
        src = host_to_torch(arr if arr.dtype.kind == "f" or arr.dtype == dtype else arr.astype(dtype))
        if compiled.device == "cpu":
            return src
        pinned = self._buffer(("host input", name, src.dtype), tuple(src.shape), src.dtype, "cpu")
        pinned.copy_(src)
        raw = self._buffer(("raw input", name, src.dtype), tuple(src.shape), src.dtype, compiled.device)
        raw.copy_(pinned, non_blocking=True)
        return raw

    def _to_host(self, name: str, value: Any) -> np.ndarray:
        """A device tensor as a new NumPy array, through a page-locked buffer."""
        import torch

        if value.device.type == "cpu" or value.dtype == torch.bfloat16:
            return torch_to_host(value)
        pinned = self._buffer(("host output", name, value.dtype), tuple(value.shape), value.dtype, "cpu")
        pinned.copy_(value)
        out = torch.empty(value.shape, dtype=value.dtype)  # the caller's own copy: the next run reuses `pinned`
        out.copy_(pinned)
        return out.numpy()


def _pad(staged: Any, b: int) -> None:
    """Fill the samples of `staged` after the first `b` with copies of sample b - 1, on its device."""
    if b < staged.shape[0]:
        staged[b:].copy_(staged[b - 1:b].expand(staged.shape[0] - b, *staged.shape[1:]))
