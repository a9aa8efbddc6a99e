"""Buffers of a fused program and their places in one arena.

Values of the main module live in buffers: a fused instruction writes a fresh buffer or
(concat elimination) into a buffer an earlier instruction made; views are the same buffer
read through other strides. A buffer lives from the instruction that makes it to the last
reader of any value in it. Buffers whose lifetimes do not overlap share arena bytes; the
offsets come from a greedy first-fit by decreasing size, and the plan reports the arena's
size next to the lower bound (the most bytes live at any one instruction). Scratch buffers
(split-k partial sums and tile counters) are added by the compiler once it knows the kernels'
configs; they live for the whole run, outside the arena.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from fusegraph.ir.program import Instruction, Module
from fusegraph.ir.shape import Shape, standard_strides
from fusegraph.ops.base import OpKind, is_allocate, is_fused, is_fused_output, is_literal, is_param, is_store
from fusegraph.ops.views import view_strides
from fusegraph.targets.gpu.errors import CodegenError

ALIGN = 256


def aliases_input(ins: Instruction) -> bool:
    """Whether `ins` is a view whose value lies in its input's buffer (a view that exists only
    as an index map, such as a depth-to-space rearrangement, does not)."""
    return ins.op.kind == OpKind.VIEW and ins.op.aliases_input


class BufferKind(StrEnum):
    """Where a buffer's storage comes from (a StrEnum, so each kind equals its lower-case name)."""

    PARAM = "param"  # a program input, supplied at each run
    LITERAL = "literal"  # a weight, uploaded once
    ARENA = "arena"  # an intermediate, at an offset in the shared arena
    OUTPUT = "output"  # a returned value, in storage of its own
    SCRATCH = "scratch"  # kernel workspace named in kernel arguments: split-k slots, and tile counters zeroed once and left zeroed by every kernel


@dataclass
class Buffer:
    """Storage for one or more values."""

    id: int
    shape: Shape  # its standard shape (dtype, lens)
    kind: BufferKind
    name: str = ""
    start: int = 0
    end: int = 0
    offset: int = -1  # in the arena, bytes
    perm: tuple[int, ...] | None = None  # dims stored in this order (weight_layout.py, activation_layout.py)

    @property
    def nbytes(self) -> int:
        return max(1, self.shape.elements) * self.shape.dtype.itemsize


@dataclass
class MemoryPlan:
    buffers: list[Buffer]
    of: dict[int, Buffer]  # main-module instruction id -> its buffer
    arena_bytes: int = 0
    lower_bound: int = 0
    output_bytes: int = 0
    scratch: dict[str, Buffer] = field(default_factory=dict)  # kernel argument name -> its scratch buffer
    further: dict[int, list[Buffer]] = field(default_factory=dict)  # fused id -> buffers of its outputs 1, 2, ... (fused_output)

    def add_scratch(self, name: str, shape: Shape) -> Buffer:
        """A scratch buffer that kernels name `name` in their arguments, with an id of its own."""
        if name in self.scratch:
            raise CodegenError(f"scratch buffer {name!r} is already planned")
        b = Buffer(max((x.id for x in self.buffers), default=-1) + 1, shape, BufferKind.SCRATCH, name)
        self.buffers.append(b)
        self.scratch[name] = b
        return b

    def describe(self) -> str:
        mib = 1 << 20
        return (f"arena {self.arena_bytes / mib:.2f} MiB (liveness lower bound {self.lower_bound / mib:.2f} MiB), "
                f"outputs {self.output_bytes / mib:.2f} MiB, "
                f"{sum(1 for b in self.buffers if b.kind == BufferKind.ARENA)} intermediate buffers")


def stored_buffer_input(fused: Instruction) -> int | None:
    """Which input of `fused` its stores write into (concat elimination), or None for a fresh one."""
    root = fused.op.module.returns[0]
    while is_store(root):
        root = root.inputs[0]
    if is_allocate(root):
        return None
    params = list(fused.op.module.params.values())
    return params.index(root)


def plan_memory(main: Module) -> MemoryPlan:
    buffers: list[Buffer] = []
    of: dict[int, Buffer] = {}
    further: dict[int, list[Buffer]] = {}
    outputs = {id(r) for r in main.returns}

    def new(ins: Instruction, kind: BufferKind, pos: int, name: str = "") -> Buffer:
        b = Buffer(len(buffers), ins.shape.as_standard(), kind, name, start=pos, end=pos)
        buffers.append(b)
        return b

    for pos, ins in enumerate(main.instructions):
        if is_param(ins):
            of[id(ins)] = new(ins, BufferKind.PARAM, pos, ins.op.attrs["name"])
        elif is_literal(ins):
            of[id(ins)] = new(ins, BufferKind.LITERAL, pos)
        elif is_allocate(ins):
            of[id(ins)] = new(ins, BufferKind.ARENA, pos)
        elif aliases_input(ins):
            of[id(ins)] = of[id(ins.inputs[0])]
        elif is_fused(ins):
            k = stored_buffer_input(ins)
            of[id(ins)] = new(ins, BufferKind.ARENA, pos) if k is None else of[id(ins.inputs[k])]
            # its further outputs, written by its kernel: live from here on (read or not)
            further[id(ins)] = [new(r, BufferKind.ARENA, pos) for r in ins.op.module.returns[1:]]
        elif is_fused_output(ins):
            of[id(ins)] = further[id(ins.inputs[0])][ins.op.attrs["index"] - 1]
        else:
            raise CodegenError(f"instruction {ins.name} ({ins.op.name}) was left unfused; "
                               "the GPU target runs fused kernels only")
    for pos, ins in enumerate(main.instructions):
        for x in ins.inputs:
            b = of.get(id(x))
            if b is not None:
                b.end = max(b.end, pos)
    end = len(main.instructions)
    for r in main.returns:
        b = of[id(r)]
        if b.kind == BufferKind.ARENA:
            b.kind = BufferKind.OUTPUT
        b.end = end
    plan = MemoryPlan(buffers, of, further=further)
    _place(plan, [b for b in buffers if b.kind == BufferKind.ARENA])
    plan.output_bytes = sum(b.nbytes for b in buffers if b.kind == BufferKind.OUTPUT)
    return plan


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _place(plan: MemoryPlan, bufs: list[Buffer]) -> None:
    placed: list[Buffer] = []
    for b in sorted(bufs, key=lambda b: (-b.nbytes, b.start)):
        clashes = sorted((p.offset, p.offset + _aligned(p.nbytes)) for p in placed
                         if not (p.end < b.start or b.end < p.start))
        offset = 0
        for lo, hi in clashes:
            if offset + _aligned(b.nbytes) <= lo:
                break
            offset = max(offset, hi)
        b.offset = offset
        placed.append(b)
    plan.arena_bytes = max((b.offset + _aligned(b.nbytes) for b in placed), default=0)
    events = sorted({b.start for b in bufs})
    plan.lower_bound = max((sum(_aligned(b.nbytes) for b in bufs if b.start <= t <= b.end) for t in events), default=0)


def strided_shape(shape: Shape, perm: tuple[int, ...] | None) -> Shape:
    """`shape` as stored in `perm` order: the same lens, the strides of the permuted layout."""
    if perm is None:
        return shape
    physical = standard_strides([shape.lens[p] for p in perm])
    strides = [0] * shape.ndim
    for j, p in enumerate(perm):
        strides[p] = physical[j]
    return Shape.of(shape.dtype, shape.lens, strides)


def physical_shape(value: Instruction, plan: MemoryPlan) -> Shape:
    """How `value` lies in its buffer once the buffer has its chosen layout.

    A value that makes or fills a buffer spans all of it; a view's strides follow from its
    input's by the view's own shape rule, so a slice of a channels-last concat buffer is
    addressed channels-last too. Raises CodegenError for a reshape the layout cannot alias.
    """
    b = plan.of[id(value)]
    if b.perm is None:
        return value.shape
    if not aliases_input(value):
        return strided_shape(value.shape, b.perm)
    x = physical_shape(value.inputs[0], plan)
    if value.op.falls_back_to_copy:  # its shape rule would give a copy's strides, not an alias's
        strides = view_strides(x.lens, x.strides, value.shape.lens)
        if strides is None:
            raise CodegenError(f"{value.name} ({value.op.name}) cannot view buffer {b.id} in its layout {b.perm}")
        return Shape.of(x.dtype, value.shape.lens, strides, x.offset)
    return value.op.compute_shape([x])
