"""The rules that let a softmax, a row fold or a layernorm join a matrix product's or
convolution's epilogue.

A kernel computes its product in tiles of output channels (the GEMM's N), so a reduction whose
every run of elements lies within one tile can be computed in the epilogue, across the tile's
columns, instead of by a kernel of its own reading the product back (attention-style heads:
gemm -> reshape {..,3,64} -> transpose -> softmax over the 64).

A sum or mean over a convolution's pixels per sample and channel (the squeeze of an SE block;
or over the rows of a matrix product that are one sample's pixels, a ConvNeXt's global mean
after its last linear layer) spans many tiles of rows instead: it joins the epilogue as an
`epilogue_sum` that is only stored (each program adds its rows' part, the GPU template
combines the parts in a fixed order), legal when, through the epilogue's map, the reduced axes read only the anchor's pixel
indices and the kept axes only its sample and channel indices.

Legality comes from the index maps alone: the epilogue's map sends an anchor index to the
softmax input's index; writing the anchor's channel index as c = q * L + r (L the softmax
axis' length), the softmax axis must read exactly r and no other axis may read r. Then each
softmax run is the L consecutive channels of one q at fixed other indices: an aligned run that
a tile of L (padded to a power of two) covers, which the GEMM template then chooses.

A layernorm over the last axis joins by the same rule when each of its rows is such a run (a
norm over a convolution's channels read channels-last, ConvNeXt's stem and downsampling
norms): a `segment_layernorm` takes the row's mean and variance across the tile in float32
and applies the constant affine, and the normalized tensor is stored straight from the
product's kernel (beside the value it normalizes, when that is read elsewhere too).

A row's statistics alone (`row_rstd` and `row_mean`, what `defer_norm` leaves of a layernorm
whose readers scale their own rows or normalize as they read) join a matrix product's
epilogue when the reduced axis is exactly the product's output channels, whatever their
count: each column tile takes its part and the last to arrive combines them
(`epilogue_row_stat`, only stored, like `epilogue_sum`; both statistics of one value share
the rendezvous). A transformer's residual stream then costs no kernel between its products.
A depthwise convolution's kernel takes them too, with no rendezvous: its tile then holds all
channels of its pixels (`whole_rows`), ConvNeXt's 7x7 convolution before its layernorm.
`FUSEGRAPH_JOIN_ROW_STATS=0` keeps them apart, a small reduction kernel each, to measure the
rendezvous (a counter per row block that every column tile's program waits on at its end)
against.
"""

from __future__ import annotations

import os

from fusegraph.ir.dtypes import DType
from fusegraph.ir.index_expr import Const, Var, free_vars, substitute
from fusegraph.ir.index_map import IndexMap
from fusegraph.ir.program import Instruction
from fusegraph.ops.base import OpKind, is_literal, view_source
from fusegraph.ops.reduce import EpilogueRowStat, EpilogueSum, SegmentLayerNorm, SegmentReduce, SegmentSoftmax
from fusegraph.passes.group_builder import GroupBuilder, Piece

MAX_RUN = 256  # the widest N tile the GEMM template chooses for a run


def anchor_template(anchor: Instruction) -> str | None:
    """The GPU template family that lowers `anchor` on its inputs' shapes; None for a non-anchor."""
    return anchor.op.template_family([x.shape for x in anchor.inputs]) if anchor.op.kind == OpKind.ANCHOR else None


def gemm_template(anchor: Instruction) -> bool:
    """Whether `anchor` is a product the GEMM template lowers, the one that reduces in its
    epilogue (a depthwise convolution has a template of its own)."""
    return anchor_template(anchor) == "gemm"


def pixel_sum_template(anchor: Instruction) -> bool:
    """Whether `anchor` is a convolution whose template (GEMM or depthwise) sums over its pixels."""
    return anchor_template(anchor) in ("gemm", "depthwise")


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
    if ins.op.algorithm != "softmax" or not gemm_template(anchor):
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


def segment_layernorm(anchor: Instruction, ins: Instruction, pieces: list[Piece], b: GroupBuilder) -> list[Piece] | None:
    """The pieces of layernorm `ins` over its last axis computed in `anchor`'s epilogue when
    each of its rows is an aligned run of output channels (a layernorm over the channels of a
    convolution's or a product's output, read through a transpose to channels-last), or None.
    Its scale and bias, broadcast to its lens, are read through the same map as its input."""
    if ins.op.algorithm != "layernorm" or not gemm_template(anchor) or ins.op.attrs["axis"] != ins.shape.ndim - 1:
        return None
    if anchor.op.attrs.get("group", 1) != 1 or len(pieces) != 1 or pieces[0].domain:
        return None
    if not all(is_literal(view_source(x)) for x in ins.inputs[1:]):
        return None  # a computed affine could be a member of the group itself
    (p,) = pieces
    length = run_length(p.map, anchor, ins.op.attrs["axis"])
    if length is None:
        return None
    affine = [b.gather(x, p.map) for x in ins.inputs[1:]]
    op = SegmentLayerNorm(anchor.op.channel_axis(anchor.shape.ndim), length, ins.op.attrs["epsilon"], ins.op.center)
    return [Piece(p.map, (), b.add(op, [p.value, *affine], ins.origin))]


def segment_fold(anchor: Instruction, ins: Instruction, pieces: list[Piece], b: GroupBuilder) -> list[Piece] | None:
    """The pieces of a sum, mean, max or min `ins` over one axis whose runs lie within tiles
    of `anchor`'s output channels (as for a softmax), or None."""
    red = ins.op.reduction
    if red is None or red.combine not in ("add", "max", "min") or red.finalize not in (None, "div"):
        return None
    if not gemm_template(anchor) or anchor.op.attrs.get("group", 1) != 1:
        return None
    axes = ins.op.reduced_axes(ins.shape.ndim)
    if len(axes) != 1 or len(pieces) != 1 or pieces[0].domain:
        return None
    (p,), (axis,) = pieces, axes
    length = run_length(p.map, anchor, axis)
    if length is None:
        return None
    value = b.add(SegmentReduce(anchor.op.channel_axis(anchor.shape.ndim), length, red.combine, red.finalize),
                  [p.value], ins.origin)
    kept = [Const(0) if j == axis else e for j, e in enumerate(p.map.exprs)]
    return [Piece(IndexMap(p.map.out_vars, kept, ins.shape.lens), (), value)]


JOIN_ROW_STATS_ENV = "FUSEGRAPH_JOIN_ROW_STATS"  # "0": row statistics keep kernels of their own


# A depthwise convolution's program takes all channels of its pixels when its epilogue takes
# their statistics (a power-of-two tile of up to this many), so no rendezvous is needed.
WHOLE_ROW_CHANNELS = 1024


def whole_rows(anchor: Instruction) -> bool:
    """Whether `anchor`'s kernel can hold every output channel of its pixels in one tile: a
    depthwise convolution of at most WHOLE_ROW_CHANNELS channels (ConvNeXt's 7x7, whose
    output a layernorm over the channels reads)."""
    return (anchor_template(anchor) == "depthwise"
            and anchor.shape.lens[anchor.op.channel_axis(anchor.shape.ndim)] <= WHOLE_ROW_CHANNELS)


def row_statistics(anchor: Instruction, ins: Instruction, pieces: list[Piece], b: GroupBuilder) -> list[Piece] | None:
    """The pieces of `row_rstd` or `row_mean` `ins` over its last axis when that axis is exactly
    the anchor's output channels (each row of `ins`'s input one row of the anchor's output,
    whole), or None: a matrix product's, whose column tiles each add their part, or a depthwise
    convolution's whose tile holds every channel (`whole_rows`). It is only stored
    (`EpilogueRowStat`)."""
    if ins.op.algorithm != "row_stat" or os.environ.get(JOIN_ROW_STATS_ENV) == "0":
        return None
    product = gemm_template(anchor) and anchor.op.k_is_last_axis and anchor.op.attrs.get("group", 1) == 1
    if not (product or whole_rows(anchor)) or len(pieces) != 1 or pieces[0].domain:
        return None  # (a shifted window's parts each hold some rows: not yet)
    (p,) = pieces
    axis, channel = ins.shape.ndim - 1, anchor.op.channel_axis(anchor.shape.ndim)
    if ins.op.attrs["axis"] != axis or ins.inputs[0].shape.dtype == DType.float64:
        return None  # (the parts are combined in float32)
    n = p.map.out_vars[channel]
    if p.map.exprs[axis] != n or p.map.in_lens[axis] != n.extent:
        return None
    if any(n in free_vars(e) for j, e in enumerate(p.map.exprs) if j != axis):
        return None
    a = ins.op.attrs
    op = EpilogueRowStat(channel, ins.op.stat, a.get("epsilon", 0.0), a.get("center", True))
    kept = [Const(0) if j == axis else e for j, e in enumerate(p.map.exprs)]
    return [Piece(IndexMap(p.map.out_vars, kept, ins.shape.lens), (), b.add(op, [p.value], ins.origin))]


def pixel_axes(anchor: Instruction) -> range | None:
    """The axes of `anchor`'s output that are a sample's pixels, after its sample axis: a
    convolution's spatial axes (N, C, pixels...), or the middle axes of a matrix product over
    rows of pixels with weights shared by every row (N, pixels..., C: ConvNeXt-T's last linear
    layer before its global mean), whose kernel makes them its rows; None for any other anchor.
    A split k loop does not stop it: the program that finishes a tile's sum adds its rows."""
    if not pixel_sum_template(anchor):
        return None
    rank = anchor.shape.ndim
    if anchor.op.spatial_window:
        return range(2, rank)
    if not anchor.op.k_is_last_axis or rank < 3 or anchor.op.attrs.get("group", 1) != 1:
        return None
    w = anchor.inputs[1]
    shared = w.inputs[0] if w.op.broadcasts else w
    if any(d != 1 for d in shared.shape.lens[:-2]):
        return None
    return range(1, rank - 1)


def pixel_reduction(anchor: Instruction, ins: Instruction, pieces: list[Piece], b: GroupBuilder) -> list[Piece] | None:
    """The pieces of reduce_sum or reduce_mean `ins` over each sample's pixels of `anchor`'s
    output (`pixel_axes`, through the epilogue's map), or None when it reduces anything else."""
    red = ins.op.reduction
    if red is None or red.combine != "add" or red.finalize not in (None, "div") or ins.shape.dtype == DType.float64:
        return None  # (the parts are added in float32)
    axes = pixel_axes(anchor)
    if axes is None or len(pieces) != 1 or pieces[0].domain:
        return None
    (p,) = pieces
    reduced = set(ins.op.reduced_axes(ins.shape.ndim))
    pixels = {p.map.out_vars[a].name for a in axes}
    read = [{v.name for v in free_vars(e)} for e in p.map.exprs]
    if any(read[j] - pixels if j in reduced else read[j] & pixels for j in range(len(read))):
        return None
    if set().union(*(read[j] for j in reduced)) != pixels:
        return None
    value = b.add(EpilogueSum(axes, red.finalize == "div"), [p.value], ins.origin)
    kept = [Const(0) if j in reduced else e for j, e in enumerate(p.map.exprs)]
    return [Piece(IndexMap(p.map.out_vars, kept, ins.shape.lens), (), value)]
