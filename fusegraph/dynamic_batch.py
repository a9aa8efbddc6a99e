"""One compile for a range of batch sizes.

    dynamic = fusegraph.compile_dynamic_batch("model.onnx", batch=(1, 32), target="gpu", fp16=True)
    outputs = dynamic.run({"images": x})    # x: any batch from 1 to 32

fusegraph compiles for fixed shapes, so a range is served by one program per size: every power
of two inside the range and its two ends (1..32: 1, 2, 4, 8, 16, 32). A request of batch b runs
the smallest size >= b, its inputs padded with copies of their last sample and its outputs cut
back to b, so the padding never shows. On the gpu target the programs share one device copy of
the weights. Each size is tuned when it is compiled or, with `lazy_tune`, at its first run.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from fusegraph import api
from fusegraph.errors import ArgumentError, InputError

#: (dtype, shape of one sample) of an input or output
Spec = tuple[np.dtype, tuple[int, ...]]


def batch_sizes(lo: int, hi: int) -> list[int]:
    """The sizes compiled for requests of `lo` to `hi` samples: the ends and the powers of two between."""
    if isinstance(lo, bool) or isinstance(hi, bool) or not isinstance(lo, int) or not isinstance(hi, int) \
            or not 1 <= lo <= hi:
        raise ArgumentError(f"batch range must be two integers 1 <= lo <= hi, got {lo!r}..{hi!r}")
    powers = [1 << k for k in range(hi.bit_length() + 1) if lo < 1 << k < hi]
    return sorted({lo, hi, *powers})


class DynamicBatchProgram:
    """Runs any batch from 1 to `max_batch` samples through the compiled size that holds it.

    `programs` maps each size to what `fusegraph.compile` made of the model at that batch (all
    for one target, every input and output with the batch as its first dimension). `run` takes
    and returns NumPy arrays by name. `input_specs` / `output_specs` give each one's dtype and the
    shape of one sample (the batch dimension left out), which is what a server declares.
    `tuned[size]` says whether a size is tuned yet (with `lazy_tune`, at its first run).
    """

    def __init__(self, programs: Mapping[int, api.Compiled], *, lazy_tune: bool = False,
                 exhaustive_tune: bool = False) -> None:
        if not programs:
            raise ArgumentError("a dynamic-batch program needs at least one compiled size")
        self.programs = dict(sorted(programs.items()))
        self.sizes = tuple(self.programs)
        targets = {api.compiled_target(p) for p in self.programs.values()}
        if len(targets) != 1 or None in targets:
            raise ArgumentError(f"the programs of a dynamic batch must be compiled for one target, got {targets}")
        self.target: str = targets.pop()
        self.lazy_tune = lazy_tune
        self.exhaustive_tune = exhaustive_tune
        self.tuned = {s: not lazy_tune for s in self.sizes}  # sizes whose kernels are tuned
        self.input_specs = _specs(self.programs, "input", lambda p: p.input_shapes)
        self.output_specs = _specs(self.programs, "output", _output_shapes)
        self._padding: Any = None  # the gpu target's device staging, made at the first run
        self._lock = threading.Lock()  # one run at a time: runs share staging buffers and CUDA graphs

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def size_for(self, batch: int) -> int:
        """The compiled size a request of `batch` samples runs."""
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or not 1 <= batch <= self.max_batch:
            raise InputError(f"batch {batch!r} is outside 1..{self.max_batch}, the sizes this program was compiled for")
        return next(s for s in self.sizes if s >= batch)

    def run(self, inputs: Mapping[str, Any], *,
            output_dtypes: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Outputs by name for `inputs` of one batch b (the first dimension of each), b in 1..max_batch.
        `output_dtypes` converts the named outputs (on the device for the gpu target): a server
        of a half-precision program answers in the model's own float32 (`model_specs`).
        Safe to call from several threads: runs take turns."""
        arrays, batch = self._checked(inputs)
        size = self.size_for(batch)
        with self._lock:
            return self._run(arrays, batch, size, dict(output_dtypes or {}))

    def _run(self, arrays: dict[str, np.ndarray], batch: int, size: int,
             output_dtypes: dict[str, Any]) -> dict[str, np.ndarray]:
        self.tune(size)
        compiled = self.programs[size]
        if self.target == "gpu":
            return self._device().run(compiled, size, arrays, output_dtypes)  # new arrays of `batch` samples
        outputs = compiled.run({k: pad_to(v, size, self.input_specs[k][0]) for k, v in arrays.items()})
        # a padded answer is copied, so no view of it reaches the padded samples
        return {k: np.asarray(v)[:batch].astype(output_dtypes.get(k, np.asarray(v).dtype), copy=batch < size)
                for k, v in outputs.items()}

    def run_on_device(self, tensors: Mapping[str, Any], *,
                      output_dtypes: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """`run` for torch tensors on the gpu target: new device tensors, nothing copied to the
        host (what a server hands to Triton). Safe to call from several threads."""
        if self.target != "gpu":
            raise ArgumentError(f"run_on_device needs the gpu target; this program is for {self.target}")
        batch = batch_of_tensors(self.input_specs, tensors)
        size = self.size_for(batch)
        with self._lock:
            self.tune(size)
            return self._device().run_on_device(self.programs[size], size, tensors, output_dtypes)

    def _device(self) -> Any:
        """The gpu target's device staging (`targets/gpu/batch_padding.py`), made at the first run."""
        if self._padding is None:
            from fusegraph.targets.gpu.batch_padding import DevicePadding

            self._padding = DevicePadding()
        return self._padding

    def model_specs(self) -> tuple[dict[str, Spec], dict[str, Spec]]:
        """The input and output specs in the model's own dtypes (what it was compiled from,
        before half precision): the dtypes a server declares."""
        source = getattr(self.programs[self.max_batch], "source_program", None)
        if source is None:
            return dict(self.input_specs), dict(self.output_specs)
        ins = {k: (np.dtype(s.dtype.numpy), self.input_specs[k][1]) for k, s in source.input_shapes.items()}
        main = source.main
        outs = {k: (np.dtype(r.shape.dtype.numpy), self.output_specs[k][1]) for k, r in zip(main.return_names, main.returns)}
        return ins, outs

    def input_shapes_at(self, batch: int) -> dict[str, Any]:
        """Each input's Shape for a request of `batch` samples."""
        from fusegraph.ir.shape import Shape

        self.size_for(batch)
        shapes = self.programs[self.sizes[0]].input_shapes
        return {k: Shape.of(shapes[k].dtype, [batch, *sample]) for k, (_, sample) in self.input_specs.items()}

    def tune(self, size: int) -> None:
        """Tune the program of `size` if it is not yet (a lazily tuned size, before its first run)."""
        if self.tuned[size]:
            return
        if self.target == "gpu":
            from fusegraph.targets.gpu.compiler import tune_program

            tune_program(self.programs[size], self.exhaustive_tune)
        self.tuned[size] = True

    def _checked(self, inputs: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
        if not isinstance(inputs, Mapping):
            raise InputError(f"inputs must be a mapping of input names to arrays, got {type(inputs).__name__}")
        unknown, missing = sorted(set(inputs) - set(self.input_specs)), sorted(set(self.input_specs) - set(inputs))
        if unknown or missing:
            raise InputError(f"unknown {unknown} / missing {missing} inputs; the program expects: " + ", ".join(
                f"{k} [batch, {', '.join(map(str, s))}] {d.name}" for k, (d, s) in self.input_specs.items()))
        arrays, batches = {}, set()
        for name, (dtype, sample) in self.input_specs.items():
            arr = np.asarray(inputs[name])
            if arr.ndim != len(sample) + 1 or tuple(arr.shape[1:]) != sample:
                raise InputError(f"input {name!r} has shape {list(arr.shape)}, expected [batch, "
                                 f"{', '.join(map(str, sample))}]")
            if arr.dtype != dtype and not (arr.dtype.kind == "f" and dtype.kind == "f"):
                raise InputError(f"input {name!r} has dtype {arr.dtype.name}, expected {dtype.name}")
            arrays[name] = arr
            batches.add(arr.shape[0])
        if len(batches) > 1:
            raise InputError(f"the inputs disagree on the batch: {', '.join(f'{k} {v.shape[0]}' for k, v in arrays.items())}")
        batch = batches.pop()
        self.size_for(batch)
        return arrays, batch


def batch_of_tensors(specs: Mapping[str, Spec], tensors: Mapping[str, Any]) -> int:
    """The batch of torch tensors that match `specs` (names, per-sample shapes; any float dtype
    for a float input, the exact dtype otherwise), or an InputError naming the first that does not."""
    from fusegraph.ir.dtypes import DType
    from fusegraph.targets.gpu.compiled_program import torch_dtype

    if set(tensors) != set(specs):
        raise InputError(f"inputs {sorted(tensors)} differ from the program's {sorted(specs)}")
    batches = set()
    for k, t in tensors.items():
        want, sample = specs[k]
        kind_ok = t.dtype.is_floating_point if want.kind == "f" else t.dtype == torch_dtype(DType.from_numpy(want))
        if t.dim() != len(sample) + 1 or tuple(t.shape[1:]) != sample or not kind_ok:
            raise InputError(f"input {k!r}: expected {want} [n, {', '.join(map(str, sample))}], got "
                             f"{t.dtype} {list(t.shape)}")
        batches.add(int(t.shape[0]))
    if len(batches) != 1:
        raise InputError(f"the inputs disagree on the batch: {sorted(batches)}")
    return batches.pop()


def pad_to(arr: np.ndarray, size: int, dtype: np.dtype) -> np.ndarray:
    """`arr` with copies of its last sample appended up to `size` samples, in `dtype`."""
    arr = arr.astype(dtype, copy=False)
    if arr.shape[0] == size:
        return arr
    return np.concatenate([arr, np.broadcast_to(arr[-1:], (size - arr.shape[0], *arr.shape[1:]))])


def _output_shapes(compiled: api.Compiled) -> dict[str, Any]:
    main = compiled.program.main  # the program as compiled: in half precision when asked
    return {name: r.shape for name, r in zip(main.return_names, main.returns)}


def _specs(programs: dict[int, api.Compiled], kind: str, shapes_of: Callable[[Any], Mapping[str, Any]]) -> dict[str, Spec]:
    """Each input's (or output's) dtype and per-sample shape; an ArgumentError for one whose first
    dimension is not the batch at every size (padding would then reach it)."""
    out: dict[str, Spec] = {}
    for size, compiled in programs.items():
        for name, shape in shapes_of(compiled).items():
            lens = tuple(shape.lens)
            spec = (np.dtype(shape.dtype.numpy), lens[1:])
            if not lens or lens[0] != size or out.setdefault(name, spec) != spec:
                raise ArgumentError(f"{kind} {name!r} has shape {list(lens)} at batch {size}: a dynamic batch needs "
                                    f"the batch as the first dimension of every input and output")
    return out


def compile_dynamic_batch(source: "str | os.PathLike[str] | bytes | Any", batch: tuple[int, int],
                          target: str = "gpu", *, fp16: bool = False, bf16: bool = False, allow_tf32: bool = False,
                          tune: bool = True, lazy_tune: bool = False, exhaustive_tune: bool = False,
                          input_dims: Mapping[str, Any] | None = None,
                          progress: Callable[[str, int, int], None] | None = None) -> DynamicBatchProgram:
    """Compile the ONNX model `source` once per size of `batch_sizes(*batch)` for `target`.

    The model's inputs need a batch dimension of 1 or a symbolic one (fusegraph.onnx.rebatch).
    `tune` and `exhaustive_tune` are as for `fusegraph.compile`; with `lazy_tune` each size is
    tuned at its first run instead of here. `progress(what, done, total)` names the size in `what`.
    """
    if not isinstance(batch, (tuple, list, range)) or len(batch) < 1:
        raise ArgumentError(f"batch must be a (lo, hi) pair of batch sizes, got {batch!r}")
    sizes = batch_sizes(batch[0], batch[-1])
    if target not in api.TARGETS:
        raise ArgumentError(f"unknown target {target!r}; the targets are: {', '.join(map(repr, api.TARGETS))}")
    from fusegraph.onnx.loader import load_model

    model = load_model(source)
    weights = None
    if target == "gpu":
        from fusegraph.targets.gpu.availability import require_gpu_target

        require_gpu_target()
        from fusegraph.targets.gpu.compiled_program import WeightPool

        weights = WeightPool()
    programs = {}
    for size in sizes:
        program = api.parse_onnx(model, input_dims=input_dims, batch=size)
        step = (lambda what, done, total, s=size: progress(f"batch {s}: {what}", done, total)) if progress else None
        options = {"fp16": fp16, "bf16": bf16, "allow_tf32": allow_tf32}
        if target == "gpu":
            options.update(tune=tune and not lazy_tune, exhaustive_tune=exhaustive_tune, progress=step, weights=weights)
        programs[size] = api.compile(program, target, **options)
    return DynamicBatchProgram(programs, lazy_tune=lazy_tune and tune, exhaustive_tune=exhaustive_tune)
