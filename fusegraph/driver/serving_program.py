"""What a server runs: a compiled model that answers any batch from 1 to `max_batch`.

A program is compiled for fixed shapes. A dynamic-batch program (one per power of two) serves
a range when fusegraph has one; otherwise the program compiled at the model's own batch B
serves every request (`BatchedProgram`): a batch of n samples
runs as ceil(n / B) runs of B, the last padded with copies of its last sample and cut back, so
the padding never shows. Every input and output must have the batch as its first dimension.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fusegraph.errors import ArgumentError, InputError

#: (dtype, shape of one sample) of an input or output
Spec = tuple[np.dtype, tuple[int, ...]]


class BatchedProgram:
    """Runs batches of 1 to `max_batch` samples through `compiled` (compiled at batch B)."""

    def __init__(self, compiled: Any, max_batch: int) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ArgumentError(f"max_batch must be a positive integer, got {max_batch!r}")
        self.compiled = compiled
        self.max_batch = max_batch
        inputs, outputs = _shapes(compiled.program)
        # requests and answers keep the model's own dtypes; a half-precision program converts
        declared = getattr(compiled, "source_program", None)
        declared_inputs, declared_outputs = _shapes(declared) if declared is not None else (inputs, outputs)
        batches = {shape[0] if shape else None for _, shape in [*inputs.values(), *outputs.values()]}
        if len(batches) != 1 or None in batches:
            found = ", ".join(f"{k} {list(s)}" for k, (_, s) in {**inputs, **outputs}.items())
            raise ArgumentError(f"serving needs one batch dimension first in every input and output; found {found}")
        self.compiled_batch: int = batches.pop()
        self.compiled_dtypes = {k: d for k, (d, _) in inputs.items()}
        self.input_specs: dict[str, Spec] = {k: (d, s[1:]) for k, (d, s) in declared_inputs.items()}
        self.output_specs: dict[str, Spec] = {k: (d, s[1:]) for k, (d, s) in declared_outputs.items()}
        self._device: Any = None  # on the gpu target: padding and dtype conversions done on the device
        from fusegraph import api

        if api.compiled_target(compiled) == "gpu":
            from fusegraph.targets.gpu.batch_padding import DevicePadding

            self._device = DevicePadding()

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = self._batch_of(inputs)
        b = self.compiled_batch
        parts: dict[str, list[np.ndarray]] = {k: [] for k in self.output_specs}
        for start in range(0, n, b):
            take = min(b, n - start)
            for k, v in self._run_chunk({k: np.asarray(v)[start:start + take] for k, v in inputs.items()}).items():
                parts[k].append(v)
        return {k: np.concatenate(v) if len(v) > 1 else v[0] for k, v in parts.items()}

    def run_on_device(self, tensors: Mapping[str, Any]) -> dict[str, Any]:
        """`run` for torch tensors on the gpu target: new device tensors in the declared dtypes."""
        import torch

        if self._device is None:
            raise ArgumentError("run_on_device needs a program compiled for the gpu target")
        from fusegraph.dynamic_batch import batch_of_tensors

        n = batch_of_tensors(self.input_specs, tensors)
        if not 1 <= n <= self.max_batch:
            raise InputError(f"inputs must share one batch of 1 to {self.max_batch} samples, got {n}")
        b = self.compiled_batch
        declared = {k: dtype for k, (dtype, _) in self.output_specs.items()}
        parts = [self._device.run_on_device(self.compiled, b, {k: t[start:start + b] for k, t in tensors.items()},
                                            declared) for start in range(0, n, b)]
        return {k: torch.cat([p[k] for p in parts]) if len(parts) > 1 else parts[0][k] for k in declared}

    def _run_chunk(self, chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs of up to one compiled batch of samples, in the declared dtypes."""
        declared = {k: dtype for k, (dtype, _) in self.output_specs.items()}
        b, take = self.compiled_batch, len(next(iter(chunk.values())))
        if self._device is not None:
            return self._device.run(self.compiled, b, chunk, declared)
        out = self.compiled.run({k: _padded(v, b).astype(self.compiled_dtypes[k], copy=False) for k, v in chunk.items()})
        return {k: np.asarray(out[k])[:take].astype(dtype, copy=False) for k, dtype in declared.items()}

    def _batch_of(self, inputs: Mapping[str, np.ndarray]) -> int:
        if set(inputs) != set(self.input_specs):
            raise InputError(f"inputs {sorted(inputs)} differ from the model's {sorted(self.input_specs)}")
        sizes = set()
        for name, value in inputs.items():
            dtype, sample = self.input_specs[name]
            a = np.asarray(value)
            if a.dtype != dtype or tuple(a.shape[1:]) != sample:
                raise InputError(f"input {name!r}: expected {dtype} [n, {', '.join(map(str, sample))}], "
                                 f"got {a.dtype} {list(a.shape)}")
            sizes.add(a.shape[0])
        if len(sizes) != 1 or not 1 <= min(sizes) <= self.max_batch:
            raise InputError(f"inputs must share one batch of 1 to {self.max_batch} samples, got {sorted(sizes)}")
        return sizes.pop()


class ServedDynamicBatch:
    """A dynamic-batch program (`fusegraph.dynamic_batch`) answering in the model's own dtypes,
    as a server declares them: a half-precision program takes and gives float32, converted on
    the device."""

    def __init__(self, dynamic: Any) -> None:
        self.dynamic = dynamic
        self.sizes: tuple[int, ...] = dynamic.sizes
        self.max_batch: int = dynamic.max_batch
        self.input_specs, self.output_specs = dynamic.model_specs()

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.dynamic.run(inputs, output_dtypes={k: d for k, (d, _) in self.output_specs.items()})

    def run_on_device(self, tensors: Mapping[str, Any]) -> dict[str, Any]:
        """`run` for torch tensors on the gpu target: new device tensors in the declared dtypes."""
        return self.dynamic.run_on_device(tensors, output_dtypes={k: d for k, (d, _) in self.output_specs.items()})


def _shapes(program: Any) -> tuple[dict[str, tuple[np.dtype, tuple[int, ...]]], dict[str, tuple[np.dtype, tuple[int, ...]]]]:
    """(dtype, shape) of each input and each output of a Program."""
    main = program.main
    inputs = {k: (np.dtype(s.dtype.numpy), tuple(s.lens)) for k, s in program.input_shapes.items()}
    outputs = {k: (np.dtype(r.shape.dtype.numpy), tuple(r.shape.lens)) for k, r in zip(main.return_names, main.returns)}
    return inputs, outputs


def _padded(a: np.ndarray, b: int) -> np.ndarray:
    if len(a) == b:
        return a
    return np.concatenate([a, np.repeat(a[-1:], b - len(a), axis=0)])


def load_batched(path: "str | Path", target: str, fp16: bool, max_batch: int) -> Any:
    """The model in `path` (.onnx, or a saved .fgx program) compiled for `target`, answering
    batches of 1 to `max_batch`: `run(inputs)`, `input_specs`, `output_specs`.

    An ONNX model is compiled for the range when fusegraph has dynamic-batch programs
    (`fusegraph.compile_dynamic_batch`: one program per power of two, a batch runs the next size
    up) and the model can be re-batched, and a .fgx file saved from such a range answers it
    itself; otherwise, and for other .fgx files (a saved compiled program keeps its own target
    and options), the program of the model's own batch runs as often as needed (`BatchedProgram`)."""
    import fusegraph
    from fusegraph import api
    from fusegraph.errors import FusegraphError

    path = Path(path)
    if path.suffix.lower() != ".fgx":
        try:
            return ServedDynamicBatch(fusegraph.compile_dynamic_batch(str(path), batch=(1, max_batch), target=target,
                                                                     fp16=fp16))
        except FusegraphError as e:
            import warnings

            warnings.warn(f"{path.name}: no dynamic-batch program ({e}); serving the model's own batch")
    loaded = fusegraph.load(path) if path.suffix.lower() == ".fgx" else fusegraph.parse_onnx(path)
    if getattr(loaded, "sizes", None):  # a saved dynamic batch answers its range itself
        if max_batch > loaded.max_batch:
            raise ArgumentError(f"{path.name} answers batches of 1 to {loaded.max_batch} (compiled with "
                                f"--batch {loaded.sizes[0]}..{loaded.max_batch}); the server's max batch is {max_batch}")
        return ServedDynamicBatch(loaded)
    if api.compiled_target(loaded) is None:
        loaded = api.compile(loaded, target, fp16=fp16)
    return BatchedProgram(loaded, max_batch)
