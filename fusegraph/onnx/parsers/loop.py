"""A Loop whose iterations are known at import is unrolled: its body read once per iteration.

The trip count and each iteration's condition must be constants (shape arithmetic folds to
literals as it is read, so a loop over a sequence's length or a dimension qualifies); anything
else is a `DynamicValueError` naming the node. Loop-carried values may be sequences or
optionals; scan outputs are the iterations' tensors stacked on a new first axis.
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
    const = ctx.require_const(value if isinstance(value, Instruction) else None, what).reshape(-1)
    if const.size != 1:
        raise ctx.error(f"{what} must hold one value, got {const.size}")
    return bool(const[0])


def _stack(ctx: ImportContext, parts: list[Value], k: int) -> Instruction:
    if not parts:
        raise ctx.error(f"scan output {k} of a loop that runs no iteration has no known shape")
    if not all(isinstance(p, Instruction) for p in parts):
        raise ctx.error(f"scan output {k} must be a tensor in every iteration")
    rows = [ctx.add(v.Unsqueeze([0]), [p]) for p in parts]
    return rows[0] if len(rows) == 1 else ctx.add(Concat(0), rows)


@onnx_op("Loop", sequences=True)
def parse_loop(ctx: ImportContext, ins: list[Value]) -> list[Value]:
    node, body = ctx.node, ctx.attr("body")
    assert node is not None
    if not isinstance(body, onnx.GraphProto):
        raise ctx.error("missing attribute 'body'")
    trips = ins[0] if ins else None
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
