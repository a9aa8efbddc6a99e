"""The values an integer input may take where a gather reads it as indices.

A GPU kernel reads a gathered row at whatever index it is given: past the end of its axis it
reads another buffer, or faults, so a token id outside the vocabulary would give a wrong
result without a word. The reference target stops at the gather; the GPU target checks its
host inputs against these bounds before it copies them in (`CompiledProgram`).
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import numpy as np

from fusegraph.errors import InputError
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import input_map_of, is_fused, is_load, is_param
from fusegraph.ops.gather import GatherElements
from fusegraph.ops.movement import Gather


class IndexBound(NamedTuple):
    """Indices into an axis of `length` elements lie in [-length, length); `node` reads them."""

    length: int
    node: str

    def describe(self) -> str:
        return f"[{-self.length}, {self.length})"


def gather_index_bounds(main: Module) -> dict[str, IndexBound]:
    """For each program input that some gather reads as its indices (through views and type
    conversions, inside a fused kernel or not), the bound of the shortest axis it indexes."""
    out: dict[str, IndexBound] = {}
    for ins in main:
        sub = ins.op.module if is_fused(ins) else None
        for g in sub if sub is not None else [ins]:
            if not isinstance(g.op, (Gather, GatherElements)):
                continue
            name = _input_name(g.inputs[1], ins if sub is not None else None)
            length = g.inputs[0].shape.lens[g.op.attrs["axis"]]
            if name is not None and (name not in out or length < out[name].length):
                out[name] = IndexBound(length, g.origin or g.op.name)
    return out


def check_index_inputs(bounds: Mapping[str, IndexBound], arrays: Mapping[str, np.ndarray]) -> None:
    """Raise InputError for the first host array in `arrays` holding an index outside its bound."""
    for name, arr in arrays.items():
        bound = bounds.get(name)
        if bound is None or not np.asarray(arr).size:
            continue
        lo, hi = int(np.min(arr)), int(np.max(arr))
        if lo < -bound.length or hi >= bound.length:
            bad = hi if hi >= bound.length else lo
            raise InputError(f"input {name!r} holds {bad}, outside {bound.describe()}: node {bound.node} gathers "
                             f"along an axis of {bound.length} with it (a token id past the vocabulary, say)")


def _input_name(x: Instruction, fused: Instruction | None) -> str | None:
    """The program input whose values `x` holds, read through views and conversions, inside a
    kernel (`fused`) through its loads to its operands, and into the kernel that stored `x`;
    None for a value computed otherwise."""
    while True:
        if input_map_of(x) is not None or x.op.converts_type:
            x = x.inputs[0]
        elif fused is not None and is_load(x):
            x = x.inputs[0]
        elif fused is not None and is_param(x):  # the kernel's k-th parameter is its k-th operand
            x, fused = fused.inputs[list(fused.op.module.params.values()).index(x)], None
        elif fused is None and is_param(x):
            return x.op.attrs["name"]
        elif fused is None and is_fused(x) and len(x.op.module.returns) == 1:
            x, fused = x.op.module.returns[0].inputs[1], x  # a kernel storing one value (a conversion)
        else:
            return None
