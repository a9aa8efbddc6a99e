"""Which template lowers which anchor.

A template registers the op families it lowers (`op.family`: gemm, window, movement,
reduction; `depthwise`, which a convolution's `template_family` picks from its shapes). The
flat template lowers the window and movement families with one small emitter per op class,
each registered next to its code.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

from fusegraph.ir.program import Instruction, Module
from fusegraph.ir.shape import Shape
from fusegraph.ops.base import Op
from fusegraph.targets.gpu.errors import CodegenError
from fusegraph.targets.gpu.kernel_source import KernelSource
from fusegraph.targets.gpu.kernel_writer import Index, KernelInputs, KernelWriter, Tile

# (function name, kernel name, sub-module, inputs, anchor, allow_tf32, interpret) -> the kernel
Template = Callable[[str, str, Module, KernelInputs, Instruction, bool, bool], KernelSource]
# An anchor emitter writes the lines computing the anchor at `index` and returns its value.
Emitter = Callable[[KernelWriter, Instruction, Tile, Index], str]

TEMPLATES: dict[str, Template] = {}
EMITTERS: dict[type[Op], Emitter] = {}


def lowers(*families: str) -> Callable[[Template], Template]:
    """Decorator registering a template for the anchors of `families`."""

    def deco(fn: Template) -> Template:
        for family in families:
            if family in TEMPLATES:
                raise ValueError(f"template for family {family!r} registered twice")
            TEMPLATES[family] = fn
        return fn

    return deco


def emits(*op_types: type[Op]) -> Callable[[Emitter], Emitter]:
    """Decorator registering the flat template's emitter for anchors of `op_types`."""

    def deco(fn: Emitter) -> Emitter:
        for t in op_types:
            if t in EMITTERS:
                raise ValueError(f"emitter for {t.name} registered twice")
            EMITTERS[t] = fn
        return fn

    return deco


def template_for(op: Op, inputs: Sequence[Shape] | None = None) -> Template:
    """The template of `op`'s family; given its input shapes, of the family they choose
    (`Op.template_family`: a depthwise convolution's)."""
    family = op.family if inputs is None else op.template_family(inputs)
    try:
        return TEMPLATES[family]
    except KeyError:
        raise CodegenError(f"the GPU target has no template for op {op.name}") from None


def emitter_for(op: Op) -> Emitter:
    try:
        return EMITTERS[type(op)]
    except KeyError:
        raise CodegenError(f"the GPU target has no {op.family} emitter for op {op.name}") from None


def prologue_movement(w: KernelWriter, module: Module) -> None:
    """Have `w` compute each gather or pad of a reduction's prologue (`anchor.find_anchor`)
    wherever the reduction reads it, by the flat template's emitter of its op: each finds its
    element from the index it is read at, whatever the template's tile."""
    for ins in module:
        if ins.op.finds_elements and id(ins) not in w.anchor_values:
            w.anchor_values[id(ins)] = partial(emitter_for(ins.op), w, ins)
