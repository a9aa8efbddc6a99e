"""Scaled dot-product attention as one anchor: softmax(Q Kᵀ · scale + mask) V.

It exists so that attention found in plain ONNX ops (`passes/fuse_attention.py`) or read from
an attention operator becomes one kernel: the scores never leave the chip. Q, K and V stay
inputs in whatever layout their producers wrote (the group reads them through index maps),
so the head split and merge around it cost nothing.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fusegraph.ir.shape import Shape
from fusegraph.ops.base import Op, OpKind, register, require


def causal_keep(sq: int, sk: int) -> np.ndarray:
    """Which scores a causal mask keeps: query i sees keys j <= i + (sk - sq), so the last
    query row sees every key (a query block at the end of a longer key sequence)."""
    return np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)


@register
class Attention(Op):
    """q [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv] and an optional additive mask
    [..., Sq, Sk] (batch dims equal: the importer and the pass broadcast explicitly) ->
    [..., Sq, Dv]. `causal` drops the scores above the diagonal `causal_keep` draws.

    A query row whose every score is -inf gives zeros (ONNX's `Attention` and the runtimes
    agree on that), where a softmax written out in ops gives NaN."""

    name = "attention"
    kind = OpKind.ANCHOR
    family = "attention"
    recomputed_inputs = (3,)  # the mask is read once per score: its pointwise producers run in the kernel

    def __init__(self, scale: float, causal: bool = False) -> None:
        super().__init__(scale=float(scale), causal=bool(causal))

    def channel_axis(self, rank: int) -> int:
        return rank - 1

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        require(len(inputs) in (3, 4), f"attention takes q, k, v and an optional mask, got {len(inputs)} inputs")
        q, k, v = inputs[:3]
        require(q.ndim >= 2 and k.ndim == q.ndim and v.ndim == q.ndim, f"q, k, v need one rank >= 2, got {q.ndim}, {k.ndim}, {v.ndim}")
        require(q.lens[:-2] == k.lens[:-2] == v.lens[:-2],
                f"batch dims differ: {list(q.lens[:-2])}, {list(k.lens[:-2])}, {list(v.lens[:-2])}")
        require(q.lens[-1] == k.lens[-1], f"q and k head sizes differ: {q.lens[-1]} vs {k.lens[-1]}")
        require(k.lens[-2] == v.lens[-2], f"k and v sequence lengths differ: {k.lens[-2]} vs {v.lens[-2]}")
        require(q.dtype == k.dtype == v.dtype and q.dtype.is_float, f"q, k, v need one float type, got {q.dtype}, {k.dtype}, {v.dtype}")
        require(not self.causal or k.lens[-2] >= q.lens[-2], "a causal mask needs at least as many keys as queries")
        if len(inputs) == 4:
            m = inputs[3]
            want = (*q.lens[:-1], k.lens[-2])
            require(m.lens == want, f"mask shape {list(m.lens)} != {list(want)}")
            require(m.dtype.is_float, f"the additive mask must be float, got {m.dtype}")
        return Shape.of(q.dtype, [*q.lens[:-1], v.lens[-1]])

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        q, k, v = (a.astype(np.float64) for a in args[:3])
        s = np.matmul(q, np.swapaxes(k, -1, -2)) * self.scale
        if len(args) == 4:
            s = s + args[3].astype(np.float64)
        if self.causal:
            s = np.where(causal_keep(s.shape[-2], s.shape[-1]), s, -np.inf)
        m = np.max(s, axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(s - m)
        total = np.sum(e, axis=-1, keepdims=True)
        p = e / np.where(total == 0, 1.0, total)
        return np.matmul(p, v).astype(args[0].dtype)
