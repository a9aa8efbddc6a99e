"""Anchor operators: convolution, transposed convolution, dot and pooling.

Anchors carry most of the work of a network and host fused epilogues. Their references
accumulate in float32 (float64 for float64 inputs), as the GPU kernels do, and cast back to
the input type at the end.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from fusegraph.ir.shape import Shape
from fusegraph.ops.base import Op, OpKind, is_float, register, require


def _acc_type(dtype: np.dtype) -> type:
    return np.float64 if dtype == np.float64 else np.float32


def window_out_len(n: int, k: int, stride: int, dilation: int, pad_begin: int, pad_end: int, ceil_mode: bool = False) -> int:
    """Output length of a sliding window: floor (or ceil) of (n + pads - effective k) / stride + 1."""
    span = n + pad_begin + pad_end - (dilation * (k - 1) + 1)
    if span < 0:
        return 0
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= n + pad_begin:
        out -= 1  # the last window must start inside the input or the begin padding
    return out


def _windows(x: np.ndarray, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
             out_lens: Sequence[int]) -> np.ndarray:
    """View of shape x.shape[:2] + out_lens + kernel: every window position and tap (x already padded)."""
    spatial = tuple(range(2, x.ndim))
    eff = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    w = sliding_window_view(x, eff, axis=spatial)
    idx = (slice(None), slice(None))
    idx += tuple(slice(0, o * s, s) for o, s in zip(out_lens, stride))
    idx += tuple(slice(None, None, d) for d in dilation)
    return w[idx]


# A convolution with one input channel per group and at most this many output channels per
# group runs as a direct depthwise convolution: as an implicit GEMM each group is a product
# whose N is those few channels, and a tensor-core tile is at least 16 columns wide
DEPTHWISE_MAX_MULTIPLIER = 8


@register
class Convolution(Op):
    """N-d convolution of x [N, C, *spatial] with w [M, C/group, *kernel]; padding is begins then ends."""

    name = "convolution"
    short_name = "conv"
    kind = OpKind.ANCHOR
    family = "gemm"
    weight_input = 1
    spatial_window = True

    def __init__(self, padding: Sequence[int], stride: Sequence[int], dilation: Sequence[int], group: int = 1) -> None:
        super().__init__(padding=tuple(padding), stride=tuple(stride), dilation=tuple(dilation), group=int(group))

    def channel_axis(self, rank: int) -> int:
        return 1

    def weight_channel_axis(self, rank: int) -> int:
        return 0

    def is_depthwise(self, inputs: Sequence[Shape]) -> bool:
        """One input channel per group (weights [M, 1, *kernel]) and at most
        DEPTHWISE_MAX_MULTIPLIER output channels per group."""
        _, w = inputs
        return w.lens[1] == 1 and w.lens[0] // self.group <= DEPTHWISE_MAX_MULTIPLIER

    def template_family(self, inputs: Sequence[Shape]) -> str:
        return "depthwise" if self.is_depthwise(inputs) else self.family

    def out_spatial(self, x: Sequence[int], kernel: Sequence[int]) -> list[int]:
        k = len(kernel)
        p = self.padding
        return [window_out_len(x[i], kernel[i], self.stride[i], self.dilation[i], p[i], p[i + k]) for i in range(k)]

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        x, w = inputs
        k = x.ndim - 2
        require(x.ndim >= 3 and w.ndim == x.ndim, f"input rank {x.ndim} and weight rank {w.ndim} must match (>= 3)")
        require(len(self.padding) == 2 * k and len(self.stride) == k and len(self.dilation) == k,
                "padding, stride and dilation must match the spatial rank")
        require(x.lens[1] == w.lens[1] * self.group, f"input channels {x.lens[1]} != weight channels {w.lens[1]} x group {self.group}")
        require(w.lens[0] % self.group == 0, f"output channels {w.lens[0]} not divisible by group {self.group}")
        require(x.dtype == w.dtype, f"input type {x.dtype} != weight type {w.dtype}")
        out = self.out_spatial(x.lens[2:], w.lens[2:])
        require(all(o > 0 for o in out), f"kernel larger than padded input (output {out})")
        return Shape.of(x.dtype, [x.lens[0], w.lens[0], *out])

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        x, w = args
        acc = _acc_type(x.dtype)
        k = x.ndim - 2
        kernel = w.shape[2:]
        out = self.out_spatial(x.shape[2:], kernel)
        pads = [(0, 0), (0, 0)] + [(self.padding[i], self.padding[i + k]) for i in range(k)]
        xp = np.pad(x.astype(acc), pads)
        win = _windows(xp, kernel, self.stride, self.dilation, out)  # N, C, *out, *kernel
        n, g = x.shape[0], self.group
        cg, mg = x.shape[1] // g, w.shape[0] // g
        res = np.empty((n, w.shape[0], math.prod(out)), dtype=acc)
        order = (0,) + tuple(range(2, 2 + k)) + (1,) + tuple(range(2 + k, 2 + 2 * k))
        for gi in range(g):
            cols = win[:, gi * cg:(gi + 1) * cg].transpose(order).reshape(n * math.prod(out), -1)
            wg = w[gi * mg:(gi + 1) * mg].astype(acc).reshape(mg, -1)
            res[:, gi * mg:(gi + 1) * mg] = (cols @ wg.T).reshape(n, math.prod(out), mg).transpose(0, 2, 1)
        return res.reshape(n, w.shape[0], *out).astype(x.dtype)


def transpose_pads(in_lens: Sequence[int], kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
                   output_padding: Sequence[int], output_shape: Sequence[int], auto_pad: str) -> list[int]:
    """Begin-then-end padding of a transposed convolution whose output is `output_shape` (the
    ONNX rule): the total padding is what the full output has beyond it, SAME_UPPER puts the
    smaller half first, the others the larger. An output longer than the full one (a negative
    total) gets its extra zero rows at the end, as ONNX Runtime adds them."""
    begins, ends = [], []
    for n, k, s, d, extra, o in zip(in_lens, kernel, strides, dilations, output_padding, output_shape):
        total = s * (n - 1) + extra + (k - 1) * d + 1 - o
        small, big = total // 2, total - total // 2
        begin = 0 if total < 0 else small if auto_pad == "SAME_UPPER" else big
        begins.append(begin)
        ends.append(total - begin)
    return begins + ends


@register
class ConvTranspose(Op):
    """N-d transposed convolution of x [N, C, *spatial] with w [C, M/group, *kernel], the ONNX
    attributes kept as given: `out[o] += x[i] * w[k]` where `o = i * stride + k * dilation - pad`.

    `pads` (begins then ends) holds unless `output_shape` is given or `auto_pad` is SAME_UPPER or
    SAME_LOWER (output `input * stride`, but never longer than the full output, as in ONNX
    Runtime); then the pads come from that output (`transpose_pads`).
    It is no `spatial_window`: the passes that rewrite a convolution's window do not apply.
    """

    name = "conv_transpose"
    short_name = "convt"
    kind = OpKind.ANCHOR
    family = "gemm"
    weight_input = 1

    def __init__(self, strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int], group: int = 1,
                 output_padding: Sequence[int] | None = None, output_shape: Sequence[int] = (),
                 auto_pad: str = "NOTSET") -> None:
        extra = tuple(output_padding) if output_padding is not None else (0,) * len(strides)
        super().__init__(strides=tuple(strides), pads=tuple(pads), dilations=tuple(dilations), group=int(group),
                         output_padding=extra, output_shape=tuple(output_shape), auto_pad=str(auto_pad))

    def channel_axis(self, rank: int) -> int:
        return 1

    def weight_channel_axis(self, rank: int) -> int:
        return 1

    def padding_for(self, in_lens: Sequence[int], kernel: Sequence[int]) -> list[int]:
        """The explicit begin-then-end pads for an input of spatial lens `in_lens`."""
        if self.output_shape or self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = self.output_shape or tuple(min(n * s, s * (n - 1) + e + (k - 1) * d + 1) for n, k, s, d, e in zip(
                in_lens, kernel, self.strides, self.dilations, self.output_padding))
            return transpose_pads(in_lens, kernel, self.strides, self.dilations, self.output_padding, out, self.auto_pad)
        return [0] * (2 * len(kernel)) if self.auto_pad == "VALID" else list(self.pads)

    def out_spatial(self, in_lens: Sequence[int], kernel: Sequence[int]) -> list[int]:
        p, k = self.padding_for(in_lens, kernel), len(kernel)
        return [s * (n - 1) + e + (kk - 1) * d + 1 - p[j] - p[j + k]
                for j, (n, kk, s, d, e) in enumerate(zip(in_lens, kernel, self.strides, self.dilations, self.output_padding))]

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        x, w = inputs
        k = x.ndim - 2
        require(x.ndim >= 3 and w.ndim == x.ndim, f"input rank {x.ndim} and weight rank {w.ndim} must match (>= 3)")
        require(len(self.pads) == 2 * k and len(self.strides) == k and len(self.dilations) == k
                and len(self.output_padding) == k and len(self.output_shape) in (0, k),
                "pads, strides, dilations, output_padding and output_shape must match the spatial rank")
        require(self.group > 0 and x.lens[1] % self.group == 0, f"input channels {x.lens[1]} not divisible by group {self.group}")
        require(w.lens[0] == x.lens[1], f"weight rows {w.lens[0]} != input channels {x.lens[1]}")
        require(x.dtype == w.dtype, f"input type {x.dtype} != weight type {w.dtype}")
        out = self.out_spatial(x.lens[2:], w.lens[2:])
        require(all(o > 0 for o in out), f"non-positive output size {out}")
        return Shape.of(x.dtype, [x.lens[0], w.lens[1] * self.group, *out])

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        """Scatter every tap's product into a buffer wide enough for the full output and any
        negative padding, then cut the output out of it."""
        x, w = args
        acc = _acc_type(x.dtype)
        k, g = x.ndim - 2, self.group
        kernel, n_in = w.shape[2:], x.shape[2:]
        pads, out = self.padding_for(n_in, kernel), self.out_spatial(n_in, kernel)
        full = [s * (n - 1) + (kk - 1) * d + 1 for n, kk, s, d in zip(n_in, kernel, self.strides, self.dilations)]
        lo = [min(0, pads[j]) for j in range(k)]
        hi = [max(full[j], pads[j] + out[j]) for j in range(k)]
        cg, mg = x.shape[1] // g, w.shape[1]
        buf = np.zeros((x.shape[0], mg * g, *(h - l for l, h in zip(lo, hi))), dtype=acc)
        xs, ws = x.astype(acc), w.astype(acc)
        for tap in np.ndindex(*kernel):
            at = tuple(slice(t * d - l, t * d - l + s * (n - 1) + 1, s)
                       for t, d, l, s, n in zip(tap, self.dilations, lo, self.strides, n_in))
            for gi in range(g):
                part = np.tensordot(xs[:, gi * cg:(gi + 1) * cg], ws[(slice(gi * cg, (gi + 1) * cg), slice(None), *tap)], ([1], [0]))
                buf[(slice(None), slice(gi * mg, (gi + 1) * mg), *at)] += np.moveaxis(part, -1, 1)
        cut = tuple(slice(pads[j] - lo[j], pads[j] - lo[j] + out[j]) for j in range(k))
        return buf[(slice(None), slice(None), *cut)].astype(x.dtype)


@register
class Dot(Op):
    """Batched matrix product [..., M, K] x [..., K, N]; batch dims equal (the importer broadcasts)."""

    name = "dot"
    kind = OpKind.ANCHOR
    family = "gemm"
    weight_input = 1
    k_is_last_axis = True

    def channel_axis(self, rank: int) -> int:
        return rank - 1

    def weight_channel_axis(self, rank: int) -> int:
        return rank - 1

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        a, b = inputs
        require(a.ndim >= 2 and a.ndim == b.ndim, f"dot needs equal ranks >= 2, got {a.ndim} and {b.ndim}")
        require(a.lens[:-2] == b.lens[:-2], f"batch dims differ: {list(a.lens[:-2])} vs {list(b.lens[:-2])}")
        require(a.lens[-1] == b.lens[-2], f"inner dims differ: {a.lens[-1]} vs {b.lens[-2]}")
        require(a.dtype == b.dtype, f"operand types differ: {a.dtype} vs {b.dtype}")
        return Shape.of(a.dtype, [*a.lens[:-1], b.lens[-1]])

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        a, b = args
        acc = _acc_type(a.dtype) if is_float(a.dtype) else np.int64
        return np.matmul(a.astype(acc), b.astype(acc)).astype(a.dtype)


@register
class Pooling(Op):
    """Max or average pooling over the spatial dims of [N, C, *spatial]."""

    name = "pooling"
    short_name = "pool"
    kind = OpKind.ANCHOR
    family = "window"
    spatial_window = True

    def __init__(self, mode: str, lengths: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                 dilation: Sequence[int] | None = None, ceil_mode: bool = False, count_include_pad: bool = False) -> None:
        dilation = tuple(dilation) if dilation is not None else (1,) * len(lengths)
        super().__init__(mode=mode, lengths=tuple(lengths), stride=tuple(stride), padding=tuple(padding),
                         dilation=dilation, ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad))

    def channel_axis(self, rank: int) -> int:
        return 1

    def out_spatial(self, x: Sequence[int]) -> list[int]:
        k = len(self.lengths)
        p = self.padding
        return [window_out_len(x[i], self.lengths[i], self.stride[i], self.dilation[i], p[i], p[i + k], self.ceil_mode)
                for i in range(k)]

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        k = len(self.lengths)
        require(self.mode in ("max", "average"), f"unknown pooling mode {self.mode!r}")
        require(x.ndim == k + 2, f"input rank {x.ndim} does not match a {k}-d window")
        require(len(self.padding) == 2 * k and len(self.stride) == k, "padding and stride must match the window rank")
        out = self.out_spatial(x.lens[2:])
        require(all(o > 0 for o in out), f"window larger than padded input (output {out})")
        return Shape.of(x.dtype, [*x.lens[:2], *out])

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        (x,) = args
        k = len(self.lengths)
        out = self.out_spatial(x.shape[2:])
        # extra end padding so every (ceil mode) window fits; it never counts as data
        extra = []
        for i in range(k):
            need = (out[i] - 1) * self.stride[i] + self.dilation[i] * (self.lengths[i] - 1) + 1
            have = x.shape[2 + i] + self.padding[i] + self.padding[i + k]
            extra.append(max(0, need - have))
        pads = [(0, 0), (0, 0)] + [(self.padding[i], self.padding[i + k] + extra[i]) for i in range(k)]
        acc = _acc_type(x.dtype) if is_float(x.dtype) else x.dtype
        if self.mode == "max":
            fill = -np.inf if is_float(x.dtype) else np.iinfo(x.dtype).min
            xp = np.pad(x.astype(acc), pads, constant_values=fill)
            win = _windows(xp, self.lengths, self.stride, self.dilation, out)
            return win.max(axis=tuple(range(2 + k, 2 + 2 * k))).astype(x.dtype)
        xp = np.pad(x.astype(acc), pads)
        win = _windows(xp, self.lengths, self.stride, self.dilation, out)
        total = win.sum(axis=tuple(range(2 + k, 2 + 2 * k)))
        if self.count_include_pad:
            mask_pads = [(0, 0), (0, 0)] + [(0, extra[i]) for i in range(k)]
            ones = np.pad(np.ones((1, 1, *(x.shape[2 + i] + self.padding[i] + self.padding[i + k] for i in range(k))), acc), mask_pads)
            mwin = _windows(ones, self.lengths, self.stride, self.dilation, out)
        else:
            ones = np.pad(np.ones((1, 1, *x.shape[2:]), acc), pads)
            mwin = _windows(ones, self.lengths, self.stride, self.dilation, out)
        count = mwin.sum(axis=tuple(range(2 + k, 2 + 2 * k)))
        return (total / count).astype(x.dtype)
