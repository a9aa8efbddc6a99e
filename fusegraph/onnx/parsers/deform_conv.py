"""The DeformConv parser: a convolution whose taps read the input at learned offsets.

Each tap (i, j) of each output pixel reads the input at its usual position plus the offset
given for it (per offset group), bilinearly: four GatherElements at run-time flat indices,
corners outside the input reading zero, as GridSample's zeros padding does; the optional mask
scales each tap. The sampled columns [N, C, kH*kW, oH*oW] then meet the weights in one
batched product per group (the im2col form of a convolution), and the bias is added per
channel. Sampling and product are ops both targets already run; 2-d inputs only (ONNX's
reference implements no other).
"""

from __future__ import annotations

import itertools

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction
from fusegraph.ops import views as v
from fusegraph.ops.anchors import window_out_len
from fusegraph.ops.gather import GatherElements
from fusegraph.onnx.context import ImportContext, onnx_op
from fusegraph.onnx.parsers.grid_sample import PointwiseMath, fetch_tap
from fusegraph.onnx.parsers.nn import channel_bias, matmul, per_spatial


@onnx_op("DeformConv")
def parse_deform_conv(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x, w, offset = ins[:3]
    bias, mask = (ins + [None, None])[3:5]
    assert x is not None and w is not None and offset is not None
    if x.shape.ndim != 4 or w.shape.ndim != 4:
        raise ctx.error(f"needs a 2-d input [N, C, H, W] and weights [M, C/group, kH, kW], "
                        f"got {list(x.shape.lens)} and {list(w.shape.lens)}")
    n, c, h, wd = x.shape.lens
    m, kernel = w.shape.lens[0], list(w.shape.lens[2:])
    if list(ctx.attr("kernel_shape", kernel)) != kernel:
        raise ctx.error(f"kernel_shape {list(ctx.attr('kernel_shape'))} does not match weights {list(w.shape.lens)}")
    strides, dilations = per_spatial(ctx, "strides", 2), per_spatial(ctx, "dilations", 2)
    pads = list(ctx.attr("pads", [0] * 4))
    if len(pads) != 4 or any(p < 0 for p in pads):
        raise ctx.error(f"pads {pads} must be 4 values >= 0")
    group, groups = ctx.attr("group", 1), ctx.attr("offset_group", 1)
    if group < 1 or groups < 1 or c % groups or m % group or w.shape.lens[1] * group != c:
        raise ctx.error(f"weights {list(w.shape.lens)}, group {group} and offset_group {groups} "
                        f"do not fit {c} input channels")
    out = [window_out_len(x.shape.lens[2 + d], kernel[d], strides[d], dilations[d], pads[d], pads[d + 2])
           for d in range(2)]
    taps = kernel[0] * kernel[1]
    if offset.shape.lens != (n, groups * 2 * taps, *out):
        raise ctx.error(f"offset {list(offset.shape.lens)} must be {[n, groups * 2 * taps, *out]}")
    if mask is not None and mask.shape.lens != (n, groups * taps, *out):
        raise ctx.error(f"mask {list(mask.shape.lens)} must be {[n, groups * taps, *out]}")
    cols = _sampled(ctx, x, offset, mask, kernel, strides, dilations, pads, groups, out)
    per_group = (c // group) * taps
    product = matmul(ctx, ctx.add(v.Reshape([group, m // group, per_group]), [w]),
                     ctx.add(v.Reshape([n, group, per_group, out[0] * out[1]]), [cols]))
    y = ctx.add(v.Reshape([n, m, *out]), [product])
    return channel_bias(ctx, y, bias) if bias is not None else y


def _sampled(ctx: ImportContext, x: Instruction, offset: Instruction, mask: Instruction | None, kernel: list[int],
             strides: list[int], dilations: list[int], pads: list[int], groups: int, out: list[int]) -> Instruction:
    """[N, C, kH*kW*oH*oW]: the input at each tap's offset position, bilinear, zero outside,
    times the tap's mask."""
    n, c, h, wd = x.shape.lens
    kh, kw = kernel
    q = kh * kw * out[0] * out[1]
    mth = PointwiseMath(ctx, x.shape.dtype)
    spread = [n, groups, kh, kw, *out]
    moved = ctx.add(v.Reshape([n, groups, kh, kw, 2, *out]), [ctx.convert(offset, x.shape.dtype)])
    per_axis = []
    for d in range(2):
        base = np.arange(out[d]) * strides[d] - pads[d] + np.arange(kernel[d])[:, None] * dilations[d]
        base = base.reshape([kh, 1, out[0], 1] if d == 0 else [1, kw, 1, out[1]]).astype(x.shape.dtype.numpy)
        part = ctx.add(v.Reshape(spread), [ctx.add(v.Slice([4], [d], [d + 1]), [moved])])
        coord = mth("add", part, ctx.literal(base))
        floor = mth("floor", coord)
        frac = mth("sub", coord, floor)
        per_axis.append([(floor, mth("sub", 1.0, frac)), (mth("add", floor, 1.0), frac)])
    data = ctx.add(v.Reshape([n, groups, c // groups, h * wd]), [x])
    scale = ctx.add(v.Reshape(spread), [ctx.convert(mask, x.shape.dtype)]) if mask is not None else None
    zero = ctx.literal(np.zeros((), x.shape.dtype.numpy))
    total = None
    for (row, wr), (col, wc) in itertools.product(*per_axis):
        (row, row_in), (col, col_in) = fetch_tap(mth, row, h, "zeros", True), fetch_tap(mth, col, wd, "zeros", True)
        assert row_in is not None and col_in is not None  # zeros padding says where
        inside = mth("logical_and", row_in, col_in)
        flat = mth("add", mth("mul", row, float(wd)), col)
        index = ctx.add(v.Reshape([n, groups, 1, q]), [ctx.convert(flat, DType.int64)])
        value = ctx.add(GatherElements(3), [data, ctx.add(v.MultiBroadcast([n, groups, c // groups, q]), [index])])
        weight = mth("mul", wr, wc) if scale is None else mth("mul", mth("mul", wr, wc), scale)
        value = mth("mul", mth("where", ctx.add(v.Reshape([n, groups, 1, q]), [inside]), value, zero),
                    ctx.add(v.Reshape([n, groups, 1, q]), [weight]))
        total = value if total is None else mth("add", total, value)
    assert total is not None
    return ctx.add(v.Reshape([n, c, q]), [total])
