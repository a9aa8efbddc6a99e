"""Parsers of ONNX sequence and optional ops, read away at import.

A sequence is a Python list of instructions and an optional its value or None (`context.Value`),
so their structure (a length, a position, whether an optional holds a value) must be known when
the model is read; the tensors in them are ordinary instructions, and nothing of a sequence
reaches the IR. A position computed at run time is a `DynamicValueError` naming the node.
A parser returns a sequence output inside a list (`[seq]`), as it returns several outputs.
"""

from __future__ import annotations

import numpy as np
import onnx

from fusegraph.ir.program import Instruction
from fusegraph.onnx.context import ImportContext, Value, onnx_op
from fusegraph.ops import views as v
from fusegraph.ops.movement import Concat


def _sequence(ctx: ImportContext, value: Value, what: str = "input 0") -> list[Instruction]:
    if not isinstance(value, list):
        raise ctx.error(f"{what} must be a sequence, got {'nothing' if value is None else 'a tensor'}")
    return value


def _tensor(ctx: ImportContext, value: Value, what: str) -> Instruction:
    if not isinstance(value, Instruction):
        raise ctx.error(f"{what} must be a tensor, got {'nothing' if value is None else 'a sequence'}")
    return value


def _position(ctx: ImportContext, ins: Value, length: int, default: int, inserting: bool = False) -> int:
    """A constant position in a sequence of `length` (negative counts from the end); inserting
    may also name the end."""
    if ins is None:
        return default
    values = ctx.require_ints(_tensor(ctx, ins, "the position"), "the position")
    if len(values) != 1:
        raise ctx.error(f"the position must be one integer, got {values}")
    top = length + inserting
    if not -length <= values[0] < top:
        raise ctx.error(f"position {values[0]} is out of range for a sequence of length {length}")
    return values[0] + length if values[0] < 0 else values[0]


@onnx_op("SequenceEmpty")
def parse_sequence_empty(ctx: ImportContext, ins: list[Value]) -> list[list[Instruction]]:
    return [[]]


@onnx_op("SequenceConstruct")
def parse_sequence_construct(ctx: ImportContext, ins: list[Value]) -> list[list[Instruction]]:
    return [[_tensor(ctx, x, f"input {k}") for k, x in enumerate(ins)]]


@onnx_op("SequenceAt", sequences=True)
def parse_sequence_at(ctx: ImportContext, ins: list[Value]) -> Instruction:
    seq = _sequence(ctx, ins[0])
    return seq[_position(ctx, ins[1], len(seq), 0)]


@onnx_op("SequenceInsert", sequences=True)
def parse_sequence_insert(ctx: ImportContext, ins: list[Value]) -> list[list[Instruction]]:
    seq = list(_sequence(ctx, ins[0]))
    seq.insert(_position(ctx, ins[2] if len(ins) > 2 else None, len(seq), len(seq), inserting=True),
               _tensor(ctx, ins[1], "input 1"))
    return [seq]


@onnx_op("SequenceErase", sequences=True)
def parse_sequence_erase(ctx: ImportContext, ins: list[Value]) -> list[list[Instruction]]:
    seq = list(_sequence(ctx, ins[0]))
    if not seq:
        raise ctx.error("cannot erase from an empty sequence")
    del seq[_position(ctx, ins[1] if len(ins) > 1 else None, len(seq), len(seq) - 1)]
    return [seq]


@onnx_op("SequenceLength", sequences=True)
def parse_sequence_length(ctx: ImportContext, ins: list[Value]) -> Instruction:
    return ctx.literal(np.array(len(_sequence(ctx, ins[0])), np.int64))


@onnx_op("SplitToSequence")
def parse_split_to_sequence(ctx: ImportContext, ins: list[Value]) -> list[list[Instruction]]:
    """Slices of the input (views, which fuse); without split sizes, one slice per index,
    squeezed unless keepdims."""
    x = _tensor(ctx, ins[0], "input 0")
    axis = ctx.axis(ctx.attr("axis", 0), x.shape.ndim)
    n = x.shape.lens[axis]
    split = ins[1] if len(ins) > 1 else None
    if split is None:
        parts = [ctx.add(v.Slice([axis], [k], [k + 1]), [x]) for k in range(n)]
        return [parts if ctx.attr("keepdims", 1) else [ctx.add(v.Squeeze([axis]), [p]) for p in parts]]
    sizes = ctx.require_ints(_tensor(ctx, split, "split"), "split")
    if ctx.require_const(split, "split").ndim == 0:
        if sizes[0] <= 0:
            raise ctx.error(f"the split size must be positive, got {sizes[0]}")
        sizes = [min(sizes[0], n - start) for start in range(0, n, sizes[0])]
    if sum(sizes) != n or any(s < 0 for s in sizes):
        raise ctx.error(f"split sizes {sizes} do not add up to {n} on axis {axis}")
    starts = np.cumsum([0] + sizes)
    return [[ctx.add(v.Slice([axis], [int(a)], [int(b)]), [x]) for a, b in zip(starts[:-1], starts[1:])]]


@onnx_op("ConcatFromSequence", sequences=True)
def parse_concat_from_sequence(ctx: ImportContext, ins: list[Value]) -> Instruction:
    """Concat of the elements, each first unsqueezed at `axis` with new_axis."""
    seq = _sequence(ctx, ins[0])
    if not seq:
        raise ctx.error("cannot concatenate an empty sequence")
    axis = ctx.attr("axis")
    if axis is None:
        raise ctx.error("missing attribute 'axis'")
    if ctx.attr("new_axis", 0):
        axis = ctx.axis(axis, seq[0].shape.ndim + 1)
        seq = [ctx.add(v.Unsqueeze([axis]), [x]) for x in seq]
    else:
        axis = ctx.axis(axis, seq[0].shape.ndim)
    return seq[0] if len(seq) == 1 else ctx.add(Concat(axis), seq)


@onnx_op("SequenceMap", sequences=True)
def parse_sequence_map(ctx: ImportContext, ins: list[Value]) -> list[list[Instruction]]:
    """The body read once per element: sequence inputs give their element, tensors themselves."""
    body = ctx.attr("body")
    if not isinstance(body, onnx.GraphProto):
        raise ctx.error("missing attribute 'body'")
    length = len(_sequence(ctx, ins[0]))
    lengths = {len(x) for x in ins if isinstance(x, list)}
    if lengths != {length}:
        raise ctx.error(f"the input sequences have different lengths {sorted(lengths)}")
    if len(body.input) != len(ins):
        raise ctx.error(f"the body takes {len(body.input)} inputs, the node gives {len(ins)}")
    outs: list[list[Instruction]] = [[] for _ in body.output]
    for k in range(length):
        values = ctx.read_graph(body, [x[k] if isinstance(x, list) else x for x in ins], f"{ctx.node.name}/{k}")
        for out, value in zip(outs, values):
            out.append(_tensor(ctx, value, "each body output"))
    return outs


@onnx_op("Optional", sequences=True)
def parse_optional(ctx: ImportContext, ins: list[Value]) -> list[Value]:
    return [ins[0] if ins else None]


@onnx_op("OptionalHasElement", sequences=True)
def parse_optional_has_element(ctx: ImportContext, ins: list[Value]) -> Instruction:
    return ctx.literal(np.array(bool(ins) and ins[0] is not None))


@onnx_op("OptionalGetElement", sequences=True)
def parse_optional_get_element(ctx: ImportContext, ins: list[Value]) -> list[Value]:
    if not ins or ins[0] is None:
        raise ctx.error("the optional is empty (known when the model is read): there is no element to get")
    return [ins[0]]
