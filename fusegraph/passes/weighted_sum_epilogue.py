"""The rule that lets a product of one output channel join another product's epilogue.

A 1x1 convolution (stride 1, no padding, one group) with a single output channel, or a matrix
product with a single output column, is a weighted sum over its input's channels (its K):
`y = sum_k x[.., k, ..] * w[k]`. When, through the epilogue's index map, that K axis is the
anchor's output channel index modulo K (the runs `reduction_epilogue.run_length` finds, as
for a softmax), every sum lies within one tile of the anchor's output channels: the epilogue
multiplies each column by its weight and adds across the run (a `segment_reduce`), instead of
a kernel of its own reading the anchor's output back. YOLOv8's distribution focal loss head
is this case: a softmax over 16 bins, then a 1x1 convolution with the weights 0..15 (the
expected bin).
"""

from __future__ import annotations

from fusegraph.ir.index_expr import Const, Expr
from fusegraph.ir.index_map import IndexMap
from fusegraph.ir.program import Instruction
from fusegraph.ops import make_op
from fusegraph.ops.reduce import SegmentReduce
from fusegraph.passes.group_builder import GroupBuilder, Piece
from fusegraph.passes.reduction_epilogue import gemm_template, run_length


def summed_axis(ins: Instruction) -> int | None:
    """The axis of `ins`'s first input that `ins` sums over when it is a weighted sum (a product
    of one output channel with no window), else None."""
    op = ins.op
    if op.weight_input != 1 or len(ins.inputs) != 2:
        return None
    x, w = ins.inputs
    if op.k_is_last_axis:
        return x.shape.ndim - 1 if w.shape.lens[-1] == 1 else None
    if not op.spatial_window or op.attrs.get("group") != 1 or w.shape.lens[0] != 1:
        return None
    if any(k != 1 for k in w.shape.lens[2:]) or any(s != 1 for s in op.attrs["stride"]) or any(op.attrs["padding"]):
        return None
    return 1


def weight_index(ins: Instruction, x_index: tuple[Expr, ...]) -> tuple[Expr, ...]:
    """Where the weight of the term at input index `x_index` lies: a matrix product's
    [.., K, 1] weights at the batch indices and k; a convolution's [1, K, 1, ..] at k."""
    if ins.op.k_is_last_axis:
        return (*x_index[:-2], x_index[-1], Const(0))
    return (Const(0), x_index[1], *[Const(0)] * (len(x_index) - 2))


def segment_weighted_sum(anchor: Instruction, ins: Instruction, pieces: list[Piece], b: GroupBuilder) -> list[Piece] | None:
    """The pieces of product `ins` computed in `anchor`'s epilogue from its first input's
    `pieces` (its weights read as a side input), or None when it is no weighted sum or its
    sums do not lie within tiles of the anchor's output channels."""
    axis = summed_axis(ins)
    if axis is None or not gemm_template(anchor) or anchor.op.attrs.get("group", 1) != 1:
        return None
    if len(pieces) != 1 or pieces[0].domain:
        return None
    (p,) = pieces
    length = run_length(p.map, anchor, axis)
    if length is None:
        return None
    w = ins.inputs[1]
    weights = b.gather(w, IndexMap(p.map.out_vars, weight_index(ins, p.map.exprs), w.shape.lens))
    terms = b.add(make_op("mul"), [p.value, weights], ins.origin)
    value = b.add(SegmentReduce(anchor.op.channel_axis(anchor.shape.ndim), length, "add"), [terms], ins.origin)
    kept = [Const(0) if j == axis else e for j, e in enumerate(p.map.exprs)]
    return [Piece(IndexMap(p.map.out_vars, kept, ins.shape.lens), (), value)]
