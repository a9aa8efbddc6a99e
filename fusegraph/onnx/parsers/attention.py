"""Parsers of the attention operators: ONNX's `Attention` (opset 23) and ONNX Runtime's
`com.microsoft` `MultiHeadAttention` and `Attention`.

Each becomes the `attention` op on [B, heads, S, D] tensors with explicit views around it (the
head split of packed [B, S, heads * D] inputs, grouped K/V heads repeated by a broadcast, the
head merge of the output), so fusion treats them exactly as attention found in plain ops.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction
from fusegraph.ops import views as v
from fusegraph.ops.attention import Attention
from fusegraph.ops.base import make_op
from fusegraph.ops.movement import Concat
from fusegraph.onnx.context import BODY_FORMS, ImportContext, onnx_op
from fusegraph.onnx.parsers.elementwise import binary
from fusegraph.onnx.parsers.nn import matmul


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


def _body_form(node: onnx.NodeProto) -> bool:
    """Forms of ONNX Attention that the attention op does not express (a softcap, local windows,
    per-batch key lengths, the scores as a fourth output): read through the op's function body."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    windowed = any(attrs.get(w, -1) != -1 for w in ("left_window_size", "right_window_size"))
    extra_input = len(node.input) > 6 and bool(node.input[6])
    scores_out = len(node.output) > 3 and bool(node.output[3])
    return bool(attrs.get("softcap", 0.0)) or windowed or extra_input or scores_out


BODY_FORMS["Attention"] = _body_form


@onnx_op("Attention")
def parse_attention(ctx: ImportContext, ins: list[Instruction | None]) -> list[Instruction]:
    q, k, v_, mask = (list(ins) + [None] * 4)[:4]
    past_k, past_v = (list(ins[4:]) + [None, None])[:2]
    assert q is not None and k is not None and v_ is not None
    if ctx.attr("softcap", 0.0):
        raise ctx.error("attribute softcap is not supported")
    for window in ("left_window_size", "right_window_size"):
        if ctx.attr(window, -1) != -1:
            raise ctx.error(f"attribute {window} (local window attention) is not supported")
    if len(ins) > 6 and ins[6] is not None:
        raise ctx.error("input nonpad_kv_seqlen is not supported")
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


def _padding_mask(ctx: ImportContext, mask: Instruction, b: int, total: int, fill: float, dtype: DType) -> Instruction:
    """ONNX Runtime's key_padding_mask / mask_index of [B, total] ones and zeros as an additive
    [B, 1, 1, total] mask: 0 where it is non-zero, `fill` (mask_filter_value) elsewhere."""
    if mask.shape.lens != (b, total):
        raise ctx.error(f"key padding mask {list(mask.shape.lens)} is not supported (only [batch, total_sequence] = "
                        f"{[b, total]})")
    zero = ctx.literal(np.array(0, mask.shape.dtype.numpy))
    keep = ctx.add(make_op("not"), [binary(ctx, "equal", mask, zero)])
    kept = ctx.add(make_op("where"), ctx.broadcast(keep, ctx.literal(np.array(0, dtype.numpy)),
                                                   ctx.literal(np.array(fill, dtype.numpy))))
    return ctx.add(v.Reshape([b, 1, 1, total]), [kept])


def runtime_attention(ctx: ImportContext, q: Instruction, k: Instruction, v_: Instruction,
                      ins: dict[str, Instruction | None]) -> list[Instruction]:
    """The part ONNX Runtime's `MultiHeadAttention` and `Attention` share: [B, S, hidden]
    projections split into `num_heads`, cached keys in front, a padding mask and an attention
    bias added, `unidirectional` as causal masking; the output merged to [B, S, heads * Dv]."""
    heads = int(ctx.attr("num_heads", 0))
    fill = float(ctx.attr("mask_filter_value", -10000.0))
    q4, k4, v4 = (split_heads(ctx, x, heads, what) for x, what in ((q, "query"), (k, "key"), (v_, "value")))
    k4, v4 = _past(ctx, ins.get("past_key"), k4), _past(ctx, ins.get("past_value"), v4)
    b, _, sq, _ = q4.shape.lens
    total = k4.shape.lens[2]
    mask = ins.get("attention_bias")
    padding = ins.get("padding")
    if padding is not None:
        pm = _padding_mask(ctx, padding, b, total, fill, q4.shape.dtype)
        mask = pm if mask is None else binary(ctx, "add", mask, pm)
    offset = total - sq if ctx.attr("unidirectional", 0) else None
    y = attend(ctx, q4, k4, v4, mask, ctx.attr("scale") or None, offset)
    return [merge_heads(ctx, y), k4, v4]


@onnx_op("com.microsoft.MultiHeadAttention")
def parse_ms_multi_head_attention(ctx: ImportContext, ins: list[Instruction | None]) -> list[Instruction]:
    names = ["query", "key", "value", "bias", "padding", "attention_bias", "past_key", "past_value"]
    if len(ins) > len(names):
        raise ctx.error("past_sequence_length and cache_indirection are not supported")
    got = dict(zip(names, list(ins) + [None] * len(names)))
    q, k, v_ = got["query"], got["key"], got["value"]
    if q is None or k is None or v_ is None or q.shape.ndim != 3:
        raise ctx.error("only separate query [B, S, hidden], key and value inputs are supported (not packed QKV or KV)")
    bias = got["bias"]
    if bias is not None:
        hq, hk = q.shape.lens[2], k.shape.lens[-1] * (1 if k.shape.ndim == 3 else k.shape.lens[1])
        if k.shape.ndim != 3 or v_.shape.ndim != 3:
            raise ctx.error("a bias with key and value in [B, heads, S, D] layout is not supported")
        q, k, v_ = (binary(ctx, "add", x, ctx.add(v.Slice([0], [lo], [hi]), [bias]))
                    for x, lo, hi in ((q, 0, hq), (k, hq, hq + hk), (v_, hq + hk, bias.shape.lens[0])))
    return runtime_attention(ctx, q, k, v_, got)


@onnx_op("com.microsoft.Attention")
def parse_ms_attention(ctx: ImportContext, ins: list[Instruction | None]) -> list[Instruction]:
    """ONNX Runtime's fused self-attention: the QKV projection (input x weights + bias) is
    written out as a matrix product, then the attention as for `MultiHeadAttention`."""
    x, w, bias, mask, past, attention_bias = (list(ins) + [None] * 6)[:6]
    assert x is not None and w is not None
    if past is not None or ctx.attr("do_rotary", 0) or ctx.attr("past_present_share_buffer", 0):
        raise ctx.error("past, do_rotary and past_present_share_buffer are not supported")
    hidden = w.shape.lens[1] // 3
    sizes = list(ctx.attr("qkv_hidden_sizes", [hidden, hidden, hidden]))
    qkv = matmul(ctx, x, w)
    if bias is not None:
        qkv = binary(ctx, "add", qkv, bias)
    starts = [0, sizes[0], sizes[0] + sizes[1]]
    q, k, v_ = (ctx.add(v.Slice([2], [s], [s + n]), [qkv]) for s, n in zip(starts, sizes))
    return runtime_attention(ctx, q, k, v_, {"padding": mask, "attention_bias": attention_bias})[:1]
