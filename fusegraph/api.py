"""The public front door: parse, fuse, compile and run, for either target.

    program = fusegraph.parse_onnx("model.onnx")
    compiled = fusegraph.compile(program, target="gpu", fp16=True)
    outputs = compiled.run({"images": x})

Everything a user calls is here and checks its arguments, so a wrong call is an `ArgumentError`
that names the argument instead of a TypeError from deep inside a pass. The layers below
(ir, ops, onnx, passes, targets) are the implementation; the driver and the ONNX backend
go through this module too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable, Union

import numpy as np

from fusegraph.errors import ArgumentError
from fusegraph.ir.program import Program
from fusegraph.ops.base import is_fused
from fusegraph.passes import pipeline
from fusegraph.targets.ref.runner import RefProgram, compile_ref

if TYPE_CHECKING:
    import onnx

#: the targets `compile` and `run` accept
TARGETS = ("gpu", "ref")

#: what `compile` returns: a RefProgram, or the gpu target's CompiledProgram
Compiled = Any


def parse_onnx(source: "str | os.PathLike[str] | bytes | onnx.ModelProto",
               input_dims: Mapping[str, Sequence[int] | None] | None = None, batch: int | None = None) -> Program:
    """Read an ONNX model (path, bytes, ModelProto or zoo name) into a Program.

    `input_dims` fixes the dimensions of named inputs, overriding what the model declares;
    dimensions the model leaves symbolic and that are not given default to 1, with a warning.
    A sequence input's entry is its length (`{"x": [3]}`) and its elements are inputs `x[0]`, ...
    with entries of their own; an empty optional input's entry is None (fusegraph.onnx.structure).
    `batch` re-batches a model whose inputs have a batch dimension of 1 or a symbolic one
    (fusegraph.onnx.rebatch); an `input_dims` entry of such an input then gives the batch as
    1 (the dimensions of one sample) or as `batch`.
    """
    import onnx  # here, not with the module: loading a saved program needs no ONNX (about a second)

    from fusegraph.onnx import importer

    if not isinstance(source, (str, os.PathLike, bytes, bytearray, onnx.ModelProto)):
        raise ArgumentError(f"source must be a path, bytes, an onnx.ModelProto or a zoo name, "
                            f"got {type(source).__name__}")
    dims = _checked_dims(input_dims)
    if batch is not None:
        source, dims = rebatched(source, batch, dims or {})
    return importer.parse_onnx(source, input_dims=dims)


def rebatched(source: "str | os.PathLike[str] | bytes | onnx.ModelProto", batch: int,
              input_dims: dict[str, list[int]]) -> tuple[onnx.ModelProto, dict[str, list[int]]]:
    """The model of `source` re-batched to `batch`, and `input_dims` with `batch` first for
    every batched input; an entry giving such an input another batch is refused."""
    from fusegraph.onnx.loader import load_model
    from fusegraph.onnx.rebatch import batched_inputs, with_batch

    model = load_model(source)
    dims = dict(input_dims)
    for name in batched_inputs(model):
        if dims.get(name):
            if dims[name][0] not in (1, batch):
                raise ArgumentError(f"input_dims gives input {name!r} a batch of {dims[name][0]}, but batch={batch}")
            dims[name] = [batch, *dims[name][1:]]
    return with_batch(model, batch), dims


def fuse(program: Program) -> Program:
    """Canonicalize and fuse `program` in place (the passes rewrite its modules); returns it."""
    pipeline.fuse(_checked_program(program))
    return program


def compile(program: Program, target: str = "gpu", *, fp16: bool = False, bf16: bool = False,
            allow_tf32: bool = False, tune: bool = True, exhaustive_tune: bool = False,
            progress: Callable[[str, int, int], None] | None = None, weights: Any = None,
            fused: Program | None = None, timer: Any = None) -> Compiled:
    """Compile `program` for `target`; the result's `run(inputs)` returns outputs by name.

    gpu: fuses a copy (unless `program` is fused already), generates one kernel per fused group,
    plans memory and, on a GPU, tunes (`tune`, `exhaustive_tune`; `progress(what, done, total)`
    reports it). allow_tf32 lets fp32 products use tf32. ref: the program as it is, evaluated by
    the NumPy reference on each run (tuning options do not apply; it never uses tf32).
    fp16/bf16 convert weights and inputs first, on either target, so they need an unfused program.
    `weights` (gpu: a compiled_program.WeightPool) shares the device copies of equal literals
    between the programs compiled with it. `fused` (gpu): what converting and fusing `program`
    under these options gives, compiled as it is instead (a saved program's stored form; the
    result keeps it). `timer(phase)`: a context manager timing each phase of the gpu compile.
    """
    _checked_program(program)
    _checked_target(target)
    flags = {"fp16": fp16, "bf16": bf16, "allow_tf32": allow_tf32, "tune": tune, "exhaustive_tune": exhaustive_tune}
    for name, value in flags.items():
        if not isinstance(value, (bool, np.bool_)):
            raise ArgumentError(f"{name} must be True or False, got {value!r}")
    if fp16 and bf16:
        raise ArgumentError("fp16 and bf16 exclude each other: pick one half-precision type")
    if (fp16 or bf16) and any(is_fused(i) for i in program.main):
        raise ArgumentError(f"{'fp16' if fp16 else 'bf16'} converts the program before fusion: "
                            "compile the unfused program")
    if progress is not None and not callable(progress):
        raise ArgumentError(f"progress must be a callable (what, done, total) or None, got {type(progress).__name__}")
    options = {"fp16": bool(fp16), "bf16": bool(bf16), "allow_tf32": bool(allow_tf32)}
    if target == "ref":
        return _remember_source(compile_ref(program, fp16=bool(fp16), bf16=bool(bf16)), program, target, options)
    from fusegraph.targets.gpu.availability import require_gpu_target

    require_gpu_target()
    from fusegraph.targets.gpu.compiler import compile_gpu  # Triton and torch load only for this target

    if fused is not None:
        _checked_program(fused)
    compiled = compile_gpu(fused or program, **options, tune=bool(tune), exhaustive_tune=bool(exhaustive_tune),
                           progress=progress, weights=weights, prepared=fused is not None, timer=timer)
    return _remember_source(compiled, program, target, options)


def _remember_source(compiled: Compiled, program: Program, target: str, options: dict[str, bool]) -> Compiled:
    """Keep what `fusegraph.save` writes: the program as given and the options. Neither target
    holds it (the gpu target keeps a fused copy, ref a half-precision one when asked)."""
    compiled.source_program = program
    compiled.source_options = {"target": target, **options}
    return compiled


def run(program_or_compiled: Union[Program, Compiled], inputs: Mapping[str, Any],
        target: str | None = None) -> dict[str, Any]:
    """Run a Program on `target` (default "ref"), or a compiled program on the target it was
    compiled for (`target`, when given, must name that one). Outputs by their ONNX names:
    NumPy arrays, or device tensors when a gpu program is fed device tensors."""
    if not isinstance(inputs, Mapping):
        raise ArgumentError(f"inputs must be a mapping of input names to arrays, got {type(inputs).__name__}")
    if target is not None:
        _checked_target(target)
    if isinstance(program_or_compiled, Program):
        return compile(program_or_compiled, target or "ref", tune=False).run(inputs)
    compiled_for = compiled_target(program_or_compiled)
    if compiled_for is None:
        raise ArgumentError("program_or_compiled must be a Program or what fusegraph.compile returned, "
                            f"got {type(program_or_compiled).__name__}")
    if target is not None and target != compiled_for:
        raise ArgumentError(f"target={target!r}, but the program is compiled for {compiled_for!r}; "
                            "compile the Program again for that target")
    return program_or_compiled.run(inputs)


def compiled_target(obj: Any) -> str | None:
    """The target `obj` was compiled for (a dynamic batch's programs' target), or None when it
    is no compiled program.

    A gpu CompiledProgram exists only once its module is imported, so a wrong argument is
    told apart without loading Triton."""
    if isinstance(obj, RefProgram):
        return "ref"
    dynamic = sys.modules.get("fusegraph.dynamic_batch")
    if dynamic is not None and isinstance(obj, dynamic.DynamicBatchProgram):
        return obj.target
    gpu = sys.modules.get("fusegraph.targets.gpu.compiled_program")
    if gpu is not None and isinstance(obj, gpu.CompiledProgram):
        return "gpu"
    return None


def _checked_program(program: Any) -> Program:
    if not isinstance(program, Program):
        raise ArgumentError(f"program must be a fusegraph Program (from parse_onnx), got {type(program).__name__}")
    return program


def _checked_target(target: Any) -> str:
    if target not in TARGETS:
        raise ArgumentError(f"unknown target {target!r}; the targets are: {', '.join(map(repr, TARGETS))}")
    return target


def _checked_dims(input_dims: Any) -> dict[str, list[int] | None] | None:
    """`input_dims` as {name: [int, ...] or None}, or an ArgumentError naming the bad entry; a
    sequence input's entry is its length, an empty optional input's None (`onnx/structure.py`)."""
    if input_dims is None:
        return None
    if not isinstance(input_dims, Mapping):
        raise ArgumentError(f"input_dims must be a mapping of input names to dimensions, got {type(input_dims).__name__}")
    out: dict[str, list[int] | None] = {}
    for name, dims in input_dims.items():
        if not isinstance(name, str):
            raise ArgumentError(f"input_dims: input names must be strings, got {name!r}")
        if dims is None:  # an empty optional input
            out[name] = None
            continue
        if isinstance(dims, (str, bytes)) or not isinstance(dims, (Sequence, np.ndarray)) or not all(
                isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise ArgumentError(f"input_dims[{name!r}] must be a sequence of non-negative integers, got {dims!r}")
        out[name] = [int(d) for d in dims]
    return out
