"""The NumPy reference target: runs any Program, fused or not, one instruction at a time.

It is the oracle of every test, so it stays simple: each op's own `reference`, values freed
after their last reader, no layout tricks (views are computed as NumPy views).
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

import numpy as np

from fusegraph.errors import InputError
from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction, Module, Program
from fusegraph.ir.shape import Shape
from fusegraph.ops.base import is_fused, is_fused_output, is_param
from fusegraph.passes.to_half import ToHalf


def check_inputs(params: Mapping[str, Shape], inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Match run-time inputs to the program's parameters by name, shape and dtype.

    Scalars and lists are accepted and converted; anything that would need a silent cast or
    reshape is an InputError that names the input.
    """
    unknown = sorted(set(inputs) - set(params))
    missing = sorted(set(params) - set(inputs))
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"unknown input(s) {', '.join(map(repr, unknown))}")
        if missing:
            parts.append(f"missing input(s) {', '.join(map(repr, missing))}")
        raise InputError(f"{'; '.join(parts)}; the program expects: " +
                         ", ".join(f"{k} {list(s.lens)} {s.dtype.numpy.name}" for k, s in params.items()))
    out: dict[str, np.ndarray] = {}
    for name, shape in params.items():
        value = inputs[name]
        try:
            arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        except ValueError as e:  # a ragged nested list
            raise InputError(f"input {name!r} is not an array: {e}") from None
        want = shape.dtype.numpy
        if arr.dtype != want and arr.dtype.newbyteorder("=") == want:
            arr = arr.astype(want)  # the same values in the other byte order (a .npy from another machine)
        if arr.dtype != want:
            raise InputError(f"input {name!r} has dtype {arr.dtype.name}, expected {want.name}")
        if tuple(arr.shape) != shape.lens:
            raise InputError(f"input {name!r} has shape {list(arr.shape)}, expected {list(shape.lens)}")
        out[name] = arr
    return out


def run_module(module: Module, args: Mapping[Instruction, np.ndarray] | None = None,
               params: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
    """Evaluate `module`; parameters come from `args` (by instruction) or `params` (by name)."""
    values = _module_values(module, args or {}, params or {}, free=True)
    return [values[id(r)] for r in module.returns]


def _module_values(module: Module, args: Mapping[Instruction, np.ndarray], params: Mapping[str, np.ndarray],
                   free: bool) -> dict[int, np.ndarray]:
    """Every instruction's value by instruction id; with `free`, each value but the returned ones
    is dropped after its last reader (a run keeps only what is still needed)."""
    last_use: dict[int, int] = {}
    for k, ins in enumerate(module.instructions):
        for x in ins.inputs:
            last_use[id(x)] = k
    keep = {id(r) for r in module.returns}
    values: dict[int, np.ndarray] = {}
    further: dict[tuple[int, int], np.ndarray] = {}  # (group, k) -> a group's k-th stored value
    with np.errstate(all="ignore"):
        for k, ins in enumerate(module.instructions):
            if ins in args:
                values[id(ins)] = args[ins]
            elif is_param(ins):
                values[id(ins)] = params[ins.op.attrs["name"]]
            elif is_fused_output(ins):
                values[id(ins)] = further.pop((id(ins.inputs[0]), ins.op.attrs["index"]))
            else:
                try:
                    outs = _evaluate(ins, [values[id(x)] for x in ins.inputs])
                except KeyError:
                    raise RuntimeError(f"instruction {ins.op} reads a value that is not computed yet") from None
                except IndexError as e:  # a run-time index (a token id, gather indices) out of its range
                    raise InputError(f"node {ins.origin or ins.op.name}: {e}; check the inputs that feed it") from None
                values[id(ins)] = outs[0]
                further.update({(id(ins), j): v for j, v in enumerate(outs) if j})
            for x in ins.inputs:
                if free and last_use.get(id(x)) == k and id(x) not in keep:
                    values.pop(id(x), None)
    return values


def instruction_values(program: Program, inputs: Mapping[str, Any]) -> dict[int, np.ndarray]:
    """The value of every instruction of the main module, by `id(instruction)`, on checked
    inputs: what a per-instruction comparison with another target reads (a run frees them)."""
    return _module_values(program.main, {}, check_inputs(program.input_shapes, inputs), free=False)


def _evaluate(ins: Instruction, args: list[np.ndarray]) -> list[np.ndarray]:
    """One instruction's values: a fused group runs its sub-module on its inputs (every value it
    stores, its own first), any other op its own NumPy reference."""
    if is_fused(ins):
        sub = ins.op.module  # type: ignore[attr-defined]
        return run_module(sub, args=dict(zip(sub.params.values(), args)))
    return [ins.op.reference(args)]


def run_program(program: Program, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Run the main module with checked inputs; returns outputs by their ONNX names."""
    checked = check_inputs(program.input_shapes, inputs)
    results = run_module(program.main, params=checked)
    # np.asarray keeps 0-d results 0-d (np.ascontiguousarray would make them 1-d)
    return {name: np.asarray(v, order="C") for name, v in zip(program.main.return_names, results)}


class RefProgram:
    """A program compiled for the ref target: nothing is generated, each run evaluates it.

    It answers `input_shapes`, `output_names` and `run` as the gpu target's CompiledProgram does,
    so code that runs a compiled program works on either target.
    """

    target = "ref"

    def __init__(self, program: Program) -> None:
        self.program = program

    @property
    def input_shapes(self) -> dict[str, Shape]:
        return self.program.input_shapes

    @property
    def output_names(self) -> list[str]:
        return self.program.output_names

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Outputs by their ONNX names; inputs are checked by name, shape and dtype."""
        return run_program(self.program, inputs)


def compile_ref(program: Program, *, fp16: bool = False, bf16: bool = False) -> RefProgram:
    """`program` for the ref target; fp16/bf16 convert a copy's weights and inputs first, as the
    gpu target does, so the reference shows what the lower precision alone changes."""
    if not (fp16 or bf16):
        return RefProgram(program)
    half = copy.deepcopy(program)
    ToHalf(DType.bfloat16 if bf16 else DType.float16).apply(half.main)
    return RefProgram(half)
