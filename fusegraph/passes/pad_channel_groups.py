"""Channel-group padding: output channels that a reshape splits into groups of an odd size are
padded, per group, to a power of two.

An anchor-based detection head's convolution has, for example, 255 = 3 x 85 output channels,
and the reshape after it splits them into 3 anchors of 85. The fused kernel gives each anchor
one N tile of 128 lanes; with the weights padded the same way (zero rows, 384 channels) every
tile starts at an aligned weight row, the weights can be stored N-major like any other
convolution's, and the tile loads them unmasked with 16-byte copies. A slice after the reshape
drops the padding, so every reader sees the original values; the padded channels are computed
and never stored.

    conv(x, W[255]) + b[255] -> reshape {1, 3, 85, H, W}
    => conv(x, W'[384]) + b'[384] -> reshape {1, 3, 128, H, W} -> slice [0:85] on axis 2
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import is_literal
from fusegraph.ops.source import make_literal
from fusegraph.ops.views import Reshape, Slice
from fusegraph.passes.fold_into_weights import add_bias
from fusegraph.passes.literal_values import broadcast_literal
from fusegraph.passes.rewrite import rewrite_each

MAX_GROUP = 256  # wider groups gain nothing: a tile is at most this wide


def padded(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _split(conv: Instruction, reshape: Instruction) -> tuple[int, int] | None:
    """(groups, group size) when `reshape` splits the conv's channel axis into exactly two dims."""
    lens, dims = conv.shape.lens, reshape.shape.lens
    if len(dims) != len(lens) + 1 or dims[0] != lens[0] or tuple(dims[3:]) != tuple(lens[2:]):
        return None
    groups, size = dims[1], dims[2]
    return (groups, size) if groups * size == lens[1] else None


def _pad_rows(value: np.ndarray, groups: int, size: int, axis: int) -> np.ndarray:
    """`value` with its `axis` of groups*size entries padded to groups*padded(size) with zeros."""
    shape = list(value.shape)
    split = shape[:axis] + [groups, size] + shape[axis + 1:]
    out = np.zeros(shape[:axis] + [groups, padded(size)] + shape[axis + 1:], dtype=value.dtype)
    out[(slice(None),) * (axis + 1) + (slice(0, size),)] = value.reshape(split)
    return out.reshape(shape[:axis] + [groups * padded(size)] + shape[axis + 1:])


class PadChannelGroups:
    name = "pad_channel_groups"

    def apply(self, module: Module) -> bool:
        # a rewrite replaces only its own chain, so the other convolutions' readers stay valid
        users = module.users()
        return rewrite_each(module, lambda conv: self._rewrite(module, conv, users))

    def _rewrite(self, module: Module, conv: Instruction, users: dict[Instruction, list[Instruction]]) -> bool:
        op = conv.op
        if op.family != "gemm" or not op.spatial_window or op.attrs["group"] != 1 or not is_literal(conv.inputs[1]):
            return False  # a convolution with constant weights, [M, C, *k]
        chain = [conv]
        bias = None
        (nxt, *more) = users.get(conv, []) or [None]
        if more or nxt is None or conv in module.returns:
            return False
        if nxt.op.algebra == "sum" and nxt.inputs[0] is conv:
            value = broadcast_literal(nxt.inputs[1])
            if value is None or value.shape[0] != 1:
                return False
            first = value[(slice(None), slice(None)) + (slice(0, 1),) * (value.ndim - 2)]
            if not np.all(value == first):  # a per-channel bias (constant folding may have spread it)
                return False
            bias = first
            chain.append(nxt)
            (nxt, *more) = users.get(nxt, []) or [None]
            if more or nxt is None or chain[-1] in module.returns:
                return False
        if not nxt.op.keeps_order:  # on the standard layout of its input: a reshape
            return False
        split = _split(conv, nxt)
        if split is None:
            return False
        groups, size = split
        if size & (size - 1) == 0 or size < 16 or padded(size) > MAX_GROUP or groups < 2:
            return False
        weights = conv.inputs[1].op.value  # type: ignore[attr-defined]
        w_lit = make_literal(_pad_rows(weights, groups, size, 0), origin=conv.inputs[1].origin)
        module.insert_before(conv, w_lit)
        out = module.make(conv.op, [conv.inputs[0], w_lit], conv.origin)
        module.insert_before(conv, out)
        if bias is not None:
            vector = np.broadcast_to(bias.reshape(-1), (conv.shape.lens[1],))
            out = add_bias(module, nxt, out, _pad_rows(vector, groups, size, 0), 1, origin=chain[1].origin)
        dims = list(nxt.shape.lens)
        dims[2] = padded(size)
        r = module.make(Reshape(dims), [out], nxt.origin)
        module.insert_before(nxt, r)
        s = module.make(Slice([2], [0], [size]), [r], nxt.origin)
        module.replace(nxt, s)
        for old in reversed(chain):
            module.remove(old)
        return True
