"""Space-to-depth: a strided convolution over a few input channels becomes a stride-1
convolution over blocks of pixels.

A network's first layer is often a large convolution (6x6, say) of stride 2 over the 3
channels of the image. Read in place, each of its GEMM rows gathers pixels two apart from three
planes: two bytes per load and no vector copies, far from what its bytes allow. Cut into 2x2
blocks, the image is a map of 12 channels at half the resolution, and the same convolution is
a 3x3 one of stride 1 over it:

    conv(x[N, C, H, W], W[M, C, s*a, s*b], stride s, pads s*p)
    => y = reshape(x, [N, C, H/s, s, W/s, s]) -> transpose to [N, s, s, C, H/s, W/s]
           -> reshape [N, s*s*C, H/s, W/s] -> pad channels with zeros to a multiple of 16
       conv(y, W'[M, 16k, a, b], stride 1, pads p),  W'[m, (i*s + j)*C + c, u, v] = W[m, c, s*u + i, s*v + j]

The pad becomes one data-movement kernel that writes the blocks channels-last, and the
convolution reads 16 channels per pixel: tap-major, in 16-byte vector copies.

A patch embedding (a window as large as its stride, no padding: ConvNeXt's and Swin's 4x4 stem
of stride 4) is left alone. Its windows do not overlap, so read in place each pixel is read
once, in runs of s neighbours, and the blocks would only be a copy of the image in front of
the convolution: a kernel of its own for nothing the convolution lacks.
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.anchors import Convolution
from fusegraph.ops.base import is_literal
from fusegraph.ops.movement import Pad
from fusegraph.ops.source import make_literal
from fusegraph.ops.views import Reshape, Transpose
from fusegraph.passes.rewrite import rewrite_each

CHANNEL_MULTIPLE = 16  # channels per k chunk of a tap-major convolution
MAX_CHANNELS = 64  # wider blocks would waste more reads than the gathers cost


def block_stride(conv: Instruction) -> int:
    """The stride s when `conv` can run over s x s blocks of its input; 0 when not."""
    if conv.op.family != "gemm" or not conv.op.spatial_window or not is_literal(conv.inputs[1]):
        return 0  # not a convolution with constant weights
    a = conv.op.attrs
    x, w = conv.inputs
    if x.shape.ndim != 4 or a["group"] != 1 or any(d != 1 for d in a["dilation"]):
        return 0
    s = a["stride"][0]
    channels = x.shape.lens[1]
    if s < 2 or a["stride"][1] != s or channels % CHANNEL_MULTIPLE == 0 or channels * s * s > MAX_CHANNELS:
        return 0
    if tuple(w.shape.lens[2:]) == (s, s) and not any(a["padding"]):
        return 0  # a patch embedding: read in place, each pixel once
    sizes = (*x.shape.lens[2:], *w.shape.lens[2:], *a["padding"])
    return s if all(n % s == 0 for n in sizes) else 0


def block_weights(w: np.ndarray, s: int, channels: int) -> np.ndarray:
    """W[M, C, s*a, s*b] as W'[M, channels, a, b] over the (i, j, c) block channels, zero padded."""
    m, c, kh, kw = w.shape
    blocks = w.reshape(m, c, kh // s, s, kw // s, s).transpose(0, 3, 5, 1, 2, 4).reshape(m, s * s * c, kh // s, kw // s)
    out = np.zeros((m, channels, kh // s, kw // s), dtype=w.dtype)
    out[:, :s * s * c] = blocks
    return out


class SpaceToDepth:
    name = "space_to_depth"

    def apply(self, module: Module) -> bool:
        return rewrite_each(module, lambda conv: self._rewrite(module, conv))

    @staticmethod
    def _rewrite(module: Module, conv: Instruction) -> bool:
        s = block_stride(conv)
        if not s:
            return False
        x, w = conv.inputs
        n, c, h, wd = x.shape.lens
        channels = -(-s * s * c // CHANNEL_MULTIPLE) * CHANNEL_MULTIPLE
        steps = [Reshape([n, c, h // s, s, wd // s, s]), Transpose([0, 3, 5, 1, 2, 4]), Reshape([n, s * s * c, h // s, wd // s]),
                 Pad([0, 0, 0, 0, 0, channels - s * s * c, 0, 0])]
        y = x
        for op in steps:
            y = module.insert_before(conv, module.make(op, [y], conv.origin))
        lit = module.insert_before(conv, make_literal(block_weights(w.op.value, s, channels),  # type: ignore[attr-defined]
                                                      origin=w.origin))
        a = conv.op.attrs
        op = Convolution([p // s for p in a["padding"]], [1, 1], [1, 1], 1)
        module.replace(conv, module.make(op, [y, lit], conv.origin))
        return True
