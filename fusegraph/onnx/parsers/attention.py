"""Parsers of the attention operators: ONNX's `Attention` (opset 23) and ONNX Runtime's
`com.microsoft` `MultiHeadAttention` and `Attention`.

Each becomes the `attention` op on [B, heads, S, D] tensors with explicit views around it (the
head split of packed [B, S, heads * D] inputs, grouped K/V heads repeated by a broadcast, the
head merge of the output), so fusion treats them exactly as attention found in plain ops.
"""

from __future__ import annotations

import math

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction
from fusegraph.ops import views as v
from fusegraph.ops.attention import Attention
from fusegraph.ops.base import make_op
from fusegraph.ops.movement import Concat
from fusegraph.onnx.context import ImportContext, onnx_op
from fusegraph.onnx.parsers.elementwise import binary


def split_heads(ctx: ImportContext, x: Instruction, heads: int, what: str) -> Instruction:
    """[B, S, heads * D] -> [B, heads, S, D]; a 4-D input is taken as already split."""
    if x.shape.ndim == 4:
        return x
    if x.shape.ndim != 3 or heads <= 0 or x.shape.lens[2] % heads:
        raise ctx.error(f"{what} {list(x.shape.lens)} must be [B, heads, S, D], or [B, S, hidden] with hidden "
                        f"divisible by the number of heads ({heads})")
    b, s, hidden = x.shape.lens
    r = ctx.add(v.Reshape([b, s, heads, hidden // heads]), [x])
    return ctx.add(v.Transpose([0, 2, 1, 3]), [r])


def merge_heads(ctx: ImportContext, y: Instruction) -> Instruction:
    """[B, heads, S, D] -> [B, S, heads * D]."""
    b, h, s, d = y.shape.lens
    return ctx.add(v.Reshape([b, s, h * d]), [ctx.add(v.Transpose([0, 2, 1, 3]), [y])])


def repeat_heads(ctx: ImportContext, x: Instruction, heads: int) -> Instruction:
    """K or V of fewer heads (grouped-query attention) read by `heads` query heads: query head
    h reads head h // (heads / kv_heads), through a broadcast view."""
    b, kvh, s, d = x.shape.lens
    if kvh == heads:
        return x
    if kvh == 0 or heads % kvh:
        raise ctx.error(f"{heads} query heads cannot share {kvh} key/value heads")
    r = ctx.add(v.Reshape([b, kvh, 1, s, d]), [x])
    wide = ctx.add(v.MultiBroadcast([b, kvh, heads // kvh, s, d]), [r])
    return ctx.add(v.Reshape([b, heads, s, d]), [wide])


def additive_mask(ctx: ImportContext, mask: Instruction, lens: tuple[int, ...], dtype: DType) -> Instruction:
    """A boolean mask (True: attend) as 0 / -inf, a float one in the scores' type, broadcast to `lens`."""
    try:
        np.broadcast_shapes(mask.shape.lens, lens)
    except ValueError:
        raise ctx.error(f"attention mask {list(mask.shape.lens)} does not broadcast to {list(lens)}") from None
    if mask.shape.dtype.is_float:
        mask = ctx.convert(mask, dtype)
    else:
        zero, neg = ctx.literal(np.array(0, dtype.numpy)), ctx.literal(np.array(-np.inf, dtype.numpy))
        mask = ctx.add(make_op("where"), ctx.broadcast(ctx.convert(mask, DType.bool), zero, neg))
    return mask if mask.shape.lens == lens else ctx.add(v.MultiBroadcast(lens), [mask])


def attend(ctx: ImportContext, q: Instruction, k: Instruction, v_: Instruction, mask: Instruction | None,
           scale: float | None, causal_offset: int | None) -> Instruction:
    """The attention op on [B, heads, S, D] inputs (K and V heads repeated to Q's), with an
    optional additive mask and causal masking where key j is seen by query i iff
    j <= i + causal_offset (None: not causal)."""
    b, h, sq, d = q.shape.lens
    k, v_ = repeat_heads(ctx, k, h), repeat_heads(ctx, v_, h)
    sk = k.shape.lens[2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    causal = causal_offset is not None and causal_offset == sk - sq
    if causal_offset is not None and not causal:  # another alignment: the triangle as a constant mask
        keep = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + causal_offset
        tri = ctx.literal(np.where(keep, 0, -np.inf).astype(q.shape.dtype.numpy))
        mask = tri if mask is None else binary(ctx, "add", mask, tri)
    if mask is not None:
        mask = additive_mask(ctx, mask, (b, h, sq, sk), q.shape.dtype)
    return ctx.add(Attention(scale, causal), [q, k, v_] + ([mask] if mask is not None else []))


def _past(ctx: ImportContext, past: Instruction | None, x: Instruction) -> Instruction:
    """The cached keys or values in front of the new ones (axis 2 of [B, heads, S, D])."""
    if past is None:
        return x
    return ctx.add(Concat(2), [past, x])


@onnx_op("Attention")
def parse_attention(ctx: ImportContext, ins: list[Instruction | None]) -> list[Instruction]:
    q, k, v_, mask = (list(ins) + [None] * 4)[:4]
    past_k, past_v = (list(ins[4:]) + [None, None])[:2]
    assert q is not None and k is not None and v_ is not None
    if ctx.attr("softcap", 0.0):
        raise ctx.error("attribute softcap is not supported")
    if (past_k is None) != (past_v is None):
        raise ctx.error("past_key and past_value must be given together")
    packed = q.shape.ndim == 3
    qh, kvh = int(ctx.attr("q_num_heads", 0)), int(ctx.attr("kv_num_heads", 0))
    q4 = split_heads(ctx, q, qh, "Q")
    k4 = _past(ctx, past_k, split_heads(ctx, k, kvh, "K"))
    v4 = _past(ctx, past_v, split_heads(ctx, v_, kvh, "V"))
    past = past_k.shape.lens[2] if past_k is not None else 0
    offset = past if ctx.attr("is_causal", 0) else None
    y = attend(ctx, q4, k4, v4, mask, ctx.attr("scale"), offset)
    return [merge_heads(ctx, y) if packed else y, k4, v4]
