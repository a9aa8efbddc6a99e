"""The rule that lets a softmax join a matrix product's or convolution's epilogue.

A kernel computes its product in tiles of output channels (the GEMM's N), so a reduction whose
every run of elements lies within one tile can be computed in the epilogue, across the tile's
columns, instead of by a kernel of its own reading the product back (attention-style heads:
gemm -> reshape {..,3,64} -> transpose -> softmax over the 64).

Legality comes from the index maps alone: the epilogue's map sends an anchor index to the
softmax input's index; writing the anchor's channel index as c = q * L + r (L the softmax
axis' length), the softmax axis must read exactly r and no other axis may read r. Then each
softmax run is the L consecutive channels of one q at fixed other indices: an aligned run that
a tile of L (padded to a power of two) covers, which the GEMM template then chooses.
"""

from __future__ import annotations

from fusegraph.ir.index_expr import Var, free_vars, substitute
from fusegraph.ir.index_map import IndexMap
from fusegraph.ir.program import Instruction
from fusegraph.ops.base import OpKind
from fusegraph.ops.reduce import SegmentSoftmax
from fusegraph.passes.group_builder import GroupBuilder, Piece

MAX_RUN = 256  # the widest N tile the GEMM template chooses for a run


def run_length(m: IndexMap, anchor: Instruction, axis: int) -> int | None:
    """L when axis `axis` of the tensor `m` maps to is the anchor's channel index modulo L and
    no other axis reads the channel index but by its quotient; None otherwise."""
    channel = anchor.op.channel_axis(anchor.shape.ndim)
    n, length = anchor.shape.lens[channel], m.in_lens[axis]
    if length > MAX_RUN or n % length:
        return None
    q, r = Var("seg_q", n // length), Var("seg_r", length)
    split = {m.out_vars[channel].name: q * length + r}
    exprs = [substitute(e, split, check=False) for e in m.exprs]
    if exprs[axis] != r or any(r in free_vars(e) for j, e in enumerate(exprs) if j != axis):
        return None
    return length


def segment_softmax(anchor: Instruction, ins: Instruction, pieces: list[Piece], b: GroupBuilder) -> list[Piece] | None:
    """The pieces of softmax `ins` computed in `anchor`'s epilogue from its input's `pieces`,
    or None when its runs do not lie within tiles of the anchor's output channels."""
    if ins.op.algorithm != "softmax" or anchor.op.kind != OpKind.ANCHOR or anchor.op.family != "gemm":
        return None
    if anchor.op.attrs.get("group", 1) != 1 or len(pieces) != 1 or pieces[0].domain:
        return None  # grouped products tile their channels per group; split branches have parts only
    (p,) = pieces
    length = run_length(p.map, anchor, ins.op.axis)
    if length is None:
        return None
    channel = anchor.op.channel_axis(anchor.shape.ndim)
    value = b.add(SegmentSoftmax(channel, length, ins.op.log), [p.value], ins.origin)
    return [Piece(p.map, (), value)]

