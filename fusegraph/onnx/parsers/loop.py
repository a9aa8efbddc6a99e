"""Loops whose iterations are known at import are unrolled: the body read once per iteration.

A Loop's trip count and each iteration's condition must be constants (shape arithmetic folds to
literals as it is read, so a loop over a sequence's length or a dimension qualifies); anything
else is a `DynamicValueError` naming the node. Loop-carried values may be sequences or
optionals; scan outputs are the iterations' tensors stacked on a new axis. A Scan runs once per
index of its scan inputs' axis, which the shapes give; each iteration reads a slice of them.
"""

from __future__ import annotations

import numpy as np
import onnx

from fusegraph.ir.program import Instruction
from fusegraph.onnx.context import ImportContext, Value, onnx_op
from fusegraph.ops import views as v
from fusegraph.ops.movement import Concat

#: the most iterations unrolled; a longer loop would build a program too large to be useful
MAX_ITERATIONS = 4096


def _flag(ctx: ImportContext, value: Value, what: str) -> bool:
    if not isinstance(value, Instruction):
        raise ctx.error(f"{what} must be a tensor, got {'nothing' if value is None else 'a sequence'}")
    const = ctx.require_const(value, what).reshape(-1)
    if const.size != 1:
        raise ctx.error(f"{what} must hold one value, got {const.size}")
    return bool(const[0])


def _stack(ctx: ImportContext, parts: list[Value], k: int, axis: int = 0) -> Instruction:
    """The iterations' values of scan output `k` stacked on a new axis."""
    if not parts:
        raise ctx.error(f"scan output {k} of a loop that runs no iteration has no known shape")
    if not all(isinstance(p, Instruction) for p in parts):
        raise ctx.error(f"scan output {k} must be a tensor in every iteration")
    axis = ctx.axis(axis, parts[0].shape.ndim + 1, f"scan output {k}'s axis")  # type: ignore[union-attr]
    rows = [ctx.add(v.Unsqueeze([axis]), [p]) for p in parts]
    return rows[0] if len(rows) == 1 else ctx.add(Concat(axis), rows)


@onnx_op("Loop", sequences=True)
def parse_loop(ctx: ImportContext, ins: list[Value]) -> list[Value]:
    node, body = ctx.node, ctx.attr("body")
    assert node is not None
    if not isinstance(body, onnx.GraphProto):
        raise ctx.error("missing attribute 'body'")
    trips = ins[0] if ins else None
    if isinstance(trips, list):
        raise ctx.error("the trip count must be a tensor, got a sequence")
    count = MAX_ITERATIONS + 1 if trips is None else int(ctx.require_ints(trips, "the trip count")[0])
    going = True if len(ins) < 2 or ins[1] is None else _flag(ctx, ins[1], "the loop condition")
    carried = list(ins[2:])
    if len(body.output) < 1 + len(carried):
        raise ctx.error(f"the body gives {len(body.output)} outputs, fewer than 1 + {len(carried)} loop-carried values")
    scans: list[list[Value]] = [[] for _ in body.output[1 + len(carried):]]
    k = 0
    while going and k < count:
        if k == MAX_ITERATIONS:
            raise ctx.error(f"the loop runs more than {MAX_ITERATIONS} iterations (or its end is only known at run time)")
        flag = ctx.literal(np.array(going))
        outs = ctx.read_graph(body, [ctx.literal(np.array(k, np.int64)), flag, *carried], f"{node.name}/{k}")
        going = _flag(ctx, outs[0], f"the condition after iteration {k}")
        carried = outs[1:1 + len(carried)]
        for scan, value in zip(scans, outs[1 + len(carried):]):
            scan.append(value)
        k += 1
    return [*carried, *(_stack(ctx, parts, j) for j, parts in enumerate(scans))]


@onnx_op("Scan")
def parse_scan(ctx: ImportContext, ins: list[Value]) -> list[Value]:
    node, body = ctx.node, ctx.attr("body")
    assert node is not None
    if ctx.opset < 9:
        raise ctx.error("Scan before opset 9 (a batch axis and sequence lengths) is not supported")
    if not isinstance(body, onnx.GraphProto):
        raise ctx.error("missing attribute 'body'")
    m = ctx.attr("num_scan_inputs", 0)
    n = len(ins) - m
    if not 0 < m <= len(ins):
        raise ctx.error(f"num_scan_inputs={m} does not fit {len(ins)} inputs")
    xs = [_input(ctx, x, k) for k, x in enumerate(ins[n:])]
    axes = [ctx.axis(a, x.shape.ndim, "scan input axis") for a, x in zip(ctx.attr("scan_input_axes", [0] * m), xs)]
    lengths = {x.shape.lens[a] for x, a in zip(xs, axes)}
    if len(lengths) != 1:
        raise ctx.error(f"the scan inputs have different lengths {sorted(lengths)} on their scan axes")
    count, reverse = lengths.pop(), ctx.attr("scan_input_directions", [0] * m)
    states: list[Value] = list(ins[:n])
    scans: list[list[Value]] = [[] for _ in body.output[n:]]
    for t in range(count):
        at = [count - 1 - t if r else t for r in reverse]
        rows = [ctx.add(v.Squeeze([a]), [ctx.add(v.Slice([a], [i], [i + 1]), [x])]) for x, a, i in zip(xs, axes, at)]
        outs = ctx.read_graph(body, [*states, *rows], f"{node.name}/{t}")
        states = outs[:n]
        for scan, value in zip(scans, outs[n:]):
            scan.append(value)
    out_axes = ctx.attr("scan_output_axes", [0] * len(scans))
    out_reverse = ctx.attr("scan_output_directions", [0] * len(scans))
    return [*states, *(_stack(ctx, parts[::-1] if r else parts, k, a)
                       for k, (parts, a, r) in enumerate(zip(scans, out_axes, out_reverse)))]


def _input(ctx: ImportContext, x: Value, k: int) -> Instruction:
    if not isinstance(x, Instruction):
        raise ctx.error(f"scan input {k} must be a tensor")
    return x
