"""Parsers of ONNX network ops: convolution (plain and transposed), pooling, matrix products,
normalizations, reductions, resize and pad."""

from __future__ import annotations

import math

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction
from fusegraph.ops import anchors, movement, reduce
from fusegraph.ops import pointwise as pw
from fusegraph.ops import views as v
from fusegraph.ops.base import make_op
from fusegraph.onnx.context import ImportContext, onnx_op, prod
from fusegraph.onnx.parsers.elementwise import binary
from fusegraph.onnx.parsers.resample import resample


def _window_pads(ctx: ImportContext, spatial: tuple[int, ...], kernel: list[int], strides: list[int],
                 dilations: list[int]) -> list[int]:
    """Explicit begins-then-ends padding, resolving auto_pad."""
    k = len(kernel)
    auto = ctx.attr("auto_pad", "NOTSET")
    ctx.check_attr("auto_pad", auto, ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
    if auto == "VALID":
        return [0] * (2 * k)
    if auto == "NOTSET":
        pads = list(ctx.attr("pads", [0] * (2 * k)))
        if len(pads) != 2 * k:
            raise ctx.error(f"pads has {len(pads)} values, expected {2 * k}")
        if any(p < 0 for p in pads):
            raise ctx.error(f"negative pads {pads}")
        return pads
    begins, ends = [], []
    for n, kk, s, d in zip(spatial, kernel, strides, dilations):
        out = -(-n // s)
        total = max(0, (out - 1) * s + (kk - 1) * d + 1 - n)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(big if auto == "SAME_UPPER" else small)
    return begins + ends


def per_spatial(ctx: ImportContext, name: str, k: int) -> list[int]:
    values = list(ctx.attr(name, [1] * k))
    if len(values) != k:
        raise ctx.error(f"{name} has {len(values)} values, expected {k}")
    if any(x <= 0 for x in values):
        raise ctx.error(f"{name} must be positive, got {values}")
    return values


def channel_bias(ctx: ImportContext, out: Instruction, bias: Instruction) -> Instruction:
    """Add a per-channel bias [C] to [N, C, ...]."""
    c = out.shape.lens[1]
    if bias.shape.lens != (c,):
        raise ctx.error(f"bias shape {list(bias.shape.lens)} does not match {c} output channels")
    b = ctx.add(v.Reshape([c] + [1] * (out.shape.ndim - 2)), [bias])
    return binary(ctx, "add", out, b)


@onnx_op("Conv")
def parse_conv(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    if x.shape.ndim < 3:
        raise ctx.error(f"input must be [N, C, spatial...], got {list(x.shape.lens)}")
    k = x.shape.ndim - 2
    kernel = list(ctx.attr("kernel_shape", w.shape.lens[2:]))
    if tuple(kernel) != w.shape.lens[2:]:
        raise ctx.error(f"kernel_shape {kernel} does not match weights {list(w.shape.lens)}")
    strides, dilations = per_spatial(ctx, "strides", k), per_spatial(ctx, "dilations", k)
    pads = _window_pads(ctx, x.shape.lens[2:], kernel, strides, dilations)
    group = ctx.attr("group", 1)
    if group < 1:
        raise ctx.error(f"group must be positive, got {group}")
    out = ctx.add(anchors.Convolution(pads, strides, dilations, group), [x, w])
    if len(ins) > 2 and ins[2] is not None:
        out = channel_bias(ctx, out, ins[2])
    return out


def _transpose_attrs(ctx: ImportContext, x: Instruction, w: Instruction) -> anchors.ConvTranspose:
    """The ConvTranspose op of the node, its attributes checked against the input and weights."""
    k = x.shape.ndim - 2
    kernel = list(ctx.attr("kernel_shape", w.shape.lens[2:]))
    if tuple(kernel) != w.shape.lens[2:]:
        raise ctx.error(f"kernel_shape {kernel} does not match weights {list(w.shape.lens)}")
    strides, dilations = per_spatial(ctx, "strides", k), per_spatial(ctx, "dilations", k)
    auto = ctx.check_attr("auto_pad", ctx.attr("auto_pad", "NOTSET"), ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
    pads = list(ctx.attr("pads", [0] * (2 * k)))
    if len(pads) != 2 * k or any(p < 0 for p in pads):
        raise ctx.error(f"pads {pads} must be {2 * k} values >= 0")
    extra = list(ctx.attr("output_padding", [0] * k))
    if len(extra) != k or any(not 0 <= e < max(s, d) for e, s, d in zip(extra, strides, dilations)):
        raise ctx.error(f"output_padding {extra} must be {k} values, each >= 0 and below its stride or dilation")
    shape = list(ctx.attr("output_shape", []))
    if len(shape) == k + 2:  # the old form, batch and channels included
        shape = shape[2:]
    if shape and (len(shape) != k or any(o <= 0 for o in shape)):
        raise ctx.error(f"output_shape {shape} must be {k} positive values")
    group = ctx.attr("group", 1)
    if group <= 0 or x.shape.lens[1] % group or w.shape.lens[0] != x.shape.lens[1]:
        raise ctx.error(f"weights {list(w.shape.lens)} and group {group} do not fit {x.shape.lens[1]} input channels")
    op = anchors.ConvTranspose(strides, pads, dilations, group, extra, shape, auto)
    p = op.padding_for(x.shape.lens[2:], kernel)
    if any(p[j] + p[j + k] <= -s for j, s in enumerate(strides)):  # more than output_padding could add
        raise ctx.error(f"output_shape {shape} is longer than input {list(x.shape.lens[2:])} can reach with strides {strides}")
    if any(o <= 0 for o in op.out_spatial(x.shape.lens[2:], kernel)):
        raise ctx.error(f"pads {pads} leave no output for input {list(x.shape.lens[2:])}")
    return op


@onnx_op("ConvTranspose")
def parse_conv_transpose(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    if x.shape.ndim < 3 or w.shape.ndim != x.shape.ndim:
        raise ctx.error(f"input [N, C, spatial...] and weights of its rank expected, got {list(x.shape.lens)} and {list(w.shape.lens)}")
    out = ctx.add(_transpose_attrs(ctx, x, w), [x, w])
    if len(ins) > 2 and ins[2] is not None:
        out = channel_bias(ctx, out, ins[2])
    return out


def _pool(ctx: ImportContext, x: Instruction, mode: str, include_pad: bool | None = None) -> Instruction:
    """Max or average pooling by the node's window attributes; `include_pad` overrides
    count_include_pad (LpPool sums through an average that counts the padding)."""
    if x.shape.ndim < 3:
        raise ctx.error(f"input must be [N, C, spatial...], got {list(x.shape.lens)}")
    kernel = ctx.attr("kernel_shape")
    if kernel is None:
        raise ctx.error("missing attribute kernel_shape")
    k = len(kernel)
    if k != x.shape.ndim - 2:
        raise ctx.error(f"kernel_shape {list(kernel)} does not match input rank {x.shape.ndim}")
    if any(n < 1 for n in kernel):
        raise ctx.error(f"kernel_shape must be positive, got {list(kernel)}")
    strides, dilations = per_spatial(ctx, "strides", k), per_spatial(ctx, "dilations", k)
    pads = _window_pads(ctx, x.shape.lens[2:], kernel, strides, dilations)
    if ctx.attr("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER") and mode == "average":
        count_include_pad = False
    else:
        count_include_pad = bool(ctx.attr("count_include_pad", 0))
    if include_pad is not None:
        count_include_pad = include_pad
    op = anchors.Pooling(mode, kernel, strides, pads, dilations, bool(ctx.attr("ceil_mode", 0)), count_include_pad)
    return ctx.add(op, [x])


@onnx_op("MaxPool")
def parse_max_pool(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction | list[Instruction]:
    x = ins[0]
    assert ctx.node is not None and x is not None
    order = ctx.check_attr("storage_order", ctx.attr("storage_order", 0), [0, 1])
    pooled = _pool(ctx, x, "max")
    if len(ctx.node.output) < 2 or not ctx.node.output[1]:
        return pooled
    return [pooled, _max_indices(ctx, x, pooled, pooled.op, bool(order))]  # type: ignore[arg-type]


def _max_indices(ctx: ImportContext, x: Instruction, pooled: Instruction, op: anchors.Pooling,
                 column_major: bool) -> Instruction:
    """MaxPool's Indices: the flat input index of each window's max, the first in the window's
    row-major order on ties, as ONNX Runtime picks it. Each tap of the window is a strided slice
    of the input padded with the lowest value, and its input positions are constants; visiting
    the taps last to first, where(tap == max, its index, the index so far) ends at the first
    equal tap. The spatial index is row- or column-major (`storage_order`); the channel's
    offset is added last."""
    k = len(op.lengths)
    spatial = x.shape.lens[2:]
    out = op.out_spatial(spatial)
    reach = [(o - 1) * s + d * (n - 1) + 1 for o, s, d, n in zip(out, op.stride, op.dilation, op.lengths)]
    ends = [max(op.padding[i + k], r - spatial[i] - op.padding[i]) for i, r in enumerate(reach)]
    pads = [0, 0, *op.padding[:k], 0, 0, *ends]
    dtype = x.shape.dtype
    low = -np.inf if dtype.is_float else float(np.iinfo(dtype.numpy).min)
    padded = ctx.add(movement.Pad(pads, "constant", low), [x]) if any(pads) else x
    flat = np.arange(prod(spatial), dtype=np.int64)
    positions = flat.reshape(spatial[::-1]).T if column_major else flat.reshape(spatial)
    positions = np.pad(positions, [(pads[2 + i], pads[4 + k + i]) for i in range(k)], constant_values=-1)
    chosen = None
    for tap in reversed(list(np.ndindex(*op.lengths))):
        starts = [t * d for t, d in zip(tap, op.dilation)]
        stops = [b + (o - 1) * s + 1 for b, o, s in zip(starts, out, op.stride)]
        at = ctx.literal(np.ascontiguousarray(positions[tuple(map(slice, starts, stops, op.stride))]))
        if chosen is None:
            chosen = at
            continue
        value = ctx.add(v.Slice(range(2, 2 + k), starts, stops, op.stride), [padded])
        chosen = ctx.add(pw.Where(), ctx.broadcast(binary(ctx, "equal", value, pooled), at, chosen))
    assert chosen is not None
    n, c = x.shape.lens[:2]
    offsets = (np.arange(n * c, dtype=np.int64) * prod(spatial)).reshape(n, c, *[1] * k)
    return binary(ctx, "add", chosen, ctx.literal(offsets))


@onnx_op("AveragePool")
def parse_average_pool(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    return _pool(ctx, ins[0], "average")  # type: ignore[arg-type]


@onnx_op("LpPool")
def parse_lp_pool(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """(sum over the window of |x|^p)^(1/p): an average pooling counting the padding, times the
    window's size."""
    x = ins[0]
    assert x is not None
    p = float(ctx.attr("p", 2))
    if p <= 0:
        raise ctx.error(f"p must be positive, got {p}")
    powered = binary(ctx, "pow", ctx.add(make_op("abs"), [x]), ctx.literal(np.array(p, x.shape.dtype.numpy)))
    mean = _pool(ctx, powered, "average", include_pad=True)
    size = ctx.literal(np.array(math.prod(ctx.attr("kernel_shape")), x.shape.dtype.numpy))
    return binary(ctx, "pow", binary(ctx, "mul", mean, size), ctx.literal(np.array(1 / p, x.shape.dtype.numpy)))


@onnx_op("GlobalAveragePool", "GlobalMaxPool")
def parse_global_pool(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None and ctx.node is not None
    name = "reduce_mean" if ctx.node.op_type == "GlobalAveragePool" else "reduce_max"
    return ctx.add(make_op(name, axes=list(range(2, x.shape.ndim))), [x])


@onnx_op("LRN")
def parse_lrn(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    size = ctx.attr("size")
    if size is None:
        raise ctx.error("missing attribute size")
    op = movement.LRN(size, ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0))
    return ctx.add(op, [ins[0]])  # type: ignore[list-item]


def matmul(ctx: ImportContext, a: Instruction, b: Instruction) -> Instruction:
    """NumPy matmul semantics (1-D operands, broadcast batch dims) on top of the `dot` op."""
    squeeze = []
    if a.shape.ndim == 1:
        a = ctx.add(v.Unsqueeze([0]), [a])
        squeeze.append(-2)
    if b.shape.ndim == 1:
        b = ctx.add(v.Unsqueeze([1]), [b])
        squeeze.append(-1)
    if a.shape.lens[-1] != b.shape.lens[-2]:
        raise ctx.error(f"inner dimensions differ: {list(a.shape.lens)} x {list(b.shape.lens)}")
    try:
        batch = tuple(np.broadcast_shapes(a.shape.lens[:-2], b.shape.lens[:-2]))
    except ValueError:
        raise ctx.error(f"batch dimensions cannot be broadcast: {list(a.shape.lens)} x {list(b.shape.lens)}") from None
    if a.shape.lens[:-2] != batch:
        a = ctx.add(v.MultiBroadcast(batch + a.shape.lens[-2:]), [a])
    if b.shape.lens[:-2] != batch:
        b = ctx.add(v.MultiBroadcast(batch + b.shape.lens[-2:]), [b])
    out = ctx.add(anchors.Dot(), [a, b])
    if squeeze:
        r = out.shape.ndim
        out = ctx.add(v.Squeeze([r + s for s in squeeze]), [out])
    return out


@onnx_op("MatMul")
def parse_matmul(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    return matmul(ctx, ins[0], ins[1])  # type: ignore[arg-type]


@onnx_op("Gemm")
def parse_gemm(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    a, b = ins[0], ins[1]
    assert a is not None and b is not None
    if a.shape.ndim != 2 or b.shape.ndim != 2:
        raise ctx.error(f"A and B must be 2-D, got {list(a.shape.lens)} and {list(b.shape.lens)}")
    if ctx.attr("transA", 0):
        a = ctx.add(v.Transpose([1, 0]), [a])
    if ctx.attr("transB", 0):
        b = ctx.add(v.Transpose([1, 0]), [b])
    out = matmul(ctx, a, b)
    dt = out.shape.dtype.numpy
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    if alpha != 1.0:
        out = binary(ctx, "mul", out, ctx.literal(np.array(alpha, dt)))
    c = ins[2] if len(ins) > 2 else None
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = binary(ctx, "mul", c, ctx.literal(np.array(beta, dt)))
        out = binary(ctx, "add", out, c)
    return out


@onnx_op("Softmax", "LogSoftmax")
def parse_softmax(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None and ctx.node is not None
    log = ctx.node.op_type == "LogSoftmax"
    r = x.shape.ndim
    if ctx.opset >= 13:
        return ctx.add(reduce.Softmax(ctx.axis(ctx.attr("axis", -1), r), log), [x])
    # before opset 13 the input is coerced to 2-D at `axis` and normalized over the second part
    axis = ctx.axis(ctx.attr("axis", 1), r)
    if axis == r - 1:
        return ctx.add(reduce.Softmax(axis, log), [x])
    flat = ctx.add(v.Flatten(axis), [x])
    out = ctx.add(reduce.Softmax(1, log), [flat])
    return ctx.add(v.Reshape(x.shape.lens), [out])


def _moments(ctx: ImportContext, x: Instruction, axes: list[int]) -> tuple[Instruction, Instruction, Instruction]:
    """The mean over `axes`, x - mean and the (biased) variance, statistics kept as length-1 dims."""
    mean = ctx.add(make_op("reduce_mean", axes=axes), [x])
    centered = binary(ctx, "sub", x, mean)
    return mean, centered, ctx.add(make_op("reduce_mean", axes=axes), [ctx.add(make_op("mul"), [centered, centered])])


def _standardize(ctx: ImportContext, x: Instruction, axes: list[int],
                 epsilon: float) -> tuple[Instruction, Instruction, Instruction]:
    """(x - mean) / sqrt(var + epsilon) over the trailing `axes`, with the mean and
    1 / sqrt(var + epsilon) (kept as length-1 dims): the core of the normalizations without an
    op of their own. Both statistics come from one `row_moments` (one kernel), each converted
    to x's type where it is read, as the decomposed statistics were (half precision converts
    those converts too)."""
    first = axes[0]
    if list(axes) != list(range(first, x.shape.ndim)):
        raise ctx.error(f"normalizes over axes {axes}, not the trailing ones")
    moments = ctx.add(reduce.RowMoments(first, epsilon), [x])
    mean, inv_std = (ctx.add(pw.Convert(x.shape.dtype), [ctx.add(v.Slice([first], [k], [k + 1]), [moments])])
                     for k in (0, 1))
    return binary(ctx, "mul", binary(ctx, "sub", x, mean), inv_std), mean, inv_std


def _stash_type(ctx: ImportContext) -> DType:
    """The type normalizations compute their statistics in; only float32 (the default) is supported."""
    if ctx.attr("stash_type", 1) != 1:
        raise ctx.error(f"stash_type={ctx.attr('stash_type')} is not supported (only 1, float32 statistics)")
    return DType.float32


def _per_channel(ctx: ImportContext, p: Instruction, x: Instruction, what: str) -> Instruction:
    """A [C] parameter as [C, 1, ...] against x [N, C, ...]."""
    c = x.shape.lens[1]
    if p.shape.elements != c:
        raise ctx.error(f"{what} of shape {list(p.shape.lens)} does not match {c} channels")
    return ctx.add(v.Reshape([c] + [1] * (x.shape.ndim - 2)), [p])


@onnx_op("LayerNormalization")
def parse_layer_norm(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction | list[Instruction]:
    """One layernorm op; the optional Mean and InvStdDev outputs (float32) are computed beside it."""
    x, scale = ins[0], ins[1]
    assert x is not None and scale is not None and ctx.node is not None
    stash = _stash_type(ctx)
    axis = ctx.axis(ctx.attr("axis", -1), x.shape.ndim)
    epsilon = ctx.attr("epsilon", 1e-5)
    bias = ins[2] if len(ins) > 2 and ins[2] is not None else ctx.literal(np.zeros((), x.shape.dtype.numpy))
    xb, scale, bias = ctx.broadcast(x, scale, bias)
    y = ctx.add(reduce.LayerNorm(axis, epsilon), [xb, scale, bias])
    if not any(ctx.node.output[1:]):
        return y
    _, mean, inv_std = _standardize(ctx, ctx.convert(x, stash), list(range(axis, x.shape.ndim)), epsilon)
    return [y, mean, inv_std]


@onnx_op("BatchNormalization")
def parse_batch_norm(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction | list[Instruction]:
    """Normalize with the given mean and variance. Before opset 7 `is_test=1` says so (0 asks for
    batch statistics); before opset 9 `spatial=0` gives each element of [C, D1, ...] its own
    parameters instead of each channel. With training_mode=1 (opset 14) the statistics are the
    batch's, and the running mean and variance are updated by `momentum` (`_batch_statistics`)."""
    x, scale, bias, mean, var = ins[:5]
    assert x is not None and scale is not None and bias is not None and mean is not None and var is not None
    if ctx.opset < 7 and not ctx.attr("is_test", 0):
        raise ctx.error("is_test=0 (training: statistics of the batch) is not supported "
                        "(fusegraph compiles for inference; export with is_test=1)")
    if x.shape.ndim < 2:
        raise ctx.error(f"input must be [N, C, ...], got rank {x.shape.ndim}")
    c = x.shape.lens[1]
    if ctx.opset < 9 and not ctx.attr("spatial", 1):
        lens, what = list(x.shape.lens[1:]), f"the input's {list(x.shape.lens[1:])} (spatial=0)"
    else:
        lens, what = [c] + [1] * (x.shape.ndim - 2), f"{c} channels"
    params = []
    for p in (scale, bias, mean, var):
        if p.shape.elements != prod(lens):
            raise ctx.error(f"parameter of shape {list(p.shape.lens)} does not match {what}")
        params.append(ctx.add(v.Reshape(lens), [ctx.convert(p, x.shape.dtype)]))
    running: list[Instruction] = []
    if ctx.check_attr("training_mode", ctx.attr("training_mode", 0), [0, 1]):
        params[2:], running = _batch_statistics(ctx, x, mean, var)
    y = ctx.add(pw.BatchNorm(ctx.attr("epsilon", 1e-5)), ctx.broadcast(x, *params))
    return [y, *running] if running else y


def _batch_statistics(ctx: ImportContext, x: Instruction, mean: Instruction,
                      var: Instruction) -> tuple[list[Instruction], list[Instruction]]:
    """Training mode: the batch's per-channel mean and (biased) variance, and the running
    statistics momentum * given + (1 - momentum) * batch's, in the given statistics' type."""
    batch_mean, _, batch_var = _moments(ctx, x, [a for a in range(x.shape.ndim) if a != 1])
    momentum, kind = ctx.attr("momentum", 0.9), x.shape.dtype.numpy
    running = []
    for given, batch in ((mean, batch_mean), (var, batch_var)):
        flat = ctx.add(v.Reshape(given.shape.lens), [batch])
        kept = binary(ctx, "mul", ctx.convert(given, x.shape.dtype), ctx.literal(np.array(momentum, kind)))
        moved = binary(ctx, "mul", flat, ctx.literal(np.array(1 - momentum, kind)))
        running.append(ctx.convert(binary(ctx, "add", kept, moved), given.shape.dtype))
    return [batch_mean, batch_var], running


@onnx_op("InstanceNormalization")
def parse_instance_norm(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x, scale, bias = ins[:3]
    assert x is not None and scale is not None and bias is not None
    if x.shape.ndim < 3:
        raise ctx.error(f"input must be [N, C, spatial...], got {list(x.shape.lens)}")
    y, _, _ = _standardize(ctx, x, list(range(2, x.shape.ndim)), ctx.attr("epsilon", 1e-5))
    y = binary(ctx, "mul", y, _per_channel(ctx, scale, x, "scale"))
    return binary(ctx, "add", y, _per_channel(ctx, bias, x, "bias"))


@onnx_op("GroupNormalization")
def parse_group_norm(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """Standardize [N, G, C/G * spatial] over its last axis, then scale and shift per channel.

    Opset 18 gave scale and bias per group; opset 21 per channel. Both are read.
    """
    x, scale, bias = ins[:3]
    assert x is not None and scale is not None and bias is not None
    g = ctx.attr("num_groups")
    if x.shape.ndim < 3 or g is None or g <= 0 or x.shape.lens[1] % g:
        raise ctx.error(f"needs input [N, C, spatial...] with C divisible by num_groups={g}, got {list(x.shape.lens)}")
    n, c = x.shape.lens[:2]
    grouped = ctx.add(v.Reshape([n, g, prod(x.shape.lens[1:]) // g]), [ctx.convert(x, _stash_type(ctx))])
    y, _, _ = _standardize(ctx, grouped, [2], ctx.attr("epsilon", 1e-5))
    y = ctx.convert(ctx.add(v.Reshape(x.shape.lens), [y]), x.shape.dtype)
    params = []
    for p in (scale, bias):
        if p.shape.elements == g != c and ctx.opset < 21:  # per group: repeat each C/G times
            p = ctx.add(v.Reshape([c]), [ctx.add(v.MultiBroadcast([g, c // g]), [ctx.add(v.Reshape([g, 1]), [p])])])
        params.append(_per_channel(ctx, p, x, "scale and bias"))
    return binary(ctx, "add", binary(ctx, "mul", y, params[0]), params[1])


@onnx_op("MeanVarianceNormalization")
def parse_mvn(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """(x - mean) / (std + 1e-9), as ONNX's function body defines it (epsilon added to the std)."""
    x = ins[0]
    assert x is not None
    axes = ctx.axes(ctx.attr("axes", [0, 2, 3]), x.shape.ndim)
    _, centered, var = _moments(ctx, x, axes)
    std = binary(ctx, "add", ctx.add(make_op("sqrt"), [var]), ctx.literal(np.array(1e-9, x.shape.dtype.numpy)))
    return binary(ctx, "div", centered, std)


@onnx_op("RMSNormalization")
def parse_rms_norm(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """x / sqrt(mean(x^2) + epsilon) over the axes from `axis` on, times scale: one rmsnorm op
    (its statistics in float32, as the default stash type asks), which fuses as a layernorm."""
    x, scale = ins[0], ins[1]
    assert x is not None and scale is not None
    axis = ctx.axis(ctx.attr("axis", -1), x.shape.ndim)
    bias = ctx.literal(np.zeros((), x.shape.dtype.numpy))
    xb, scale, bias = ctx.broadcast(x, ctx.convert(scale, x.shape.dtype), bias)
    return ctx.add(reduce.RMSNorm(axis, ctx.attr("epsilon", 1e-5)), [xb, scale, bias])


@onnx_op("LpNormalization")
def parse_lp_norm(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """x / ||x||_p along `axis`; a zero norm gives 0, as the ONNX reference and ONNX Runtime do."""
    from fusegraph.ops.pointwise import Where

    x = ins[0]
    assert x is not None
    axis = ctx.axis(ctx.attr("axis", -1), x.shape.ndim)
    p = ctx.check_attr("p", ctx.attr("p", 2), [1, 2])
    if p == 1:
        norm = ctx.add(make_op("reduce_sum", axes=[axis]), [ctx.add(make_op("abs"), [x])])
    else:
        norm = ctx.add(make_op("sqrt"), [ctx.add(make_op("reduce_sum", axes=[axis]), [ctx.add(make_op("mul"), [x, x])])])
    zero = ctx.literal(np.zeros((), x.shape.dtype.numpy))
    is_zero = binary(ctx, "equal", norm, zero)
    return ctx.add(Where(), ctx.broadcast(is_zero, zero, binary(ctx, "div", x, norm)))


@onnx_op("ArgMax", "ArgMin")
def parse_arg_reduce(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None and ctx.node is not None
    axis = ctx.axis(ctx.attr("axis", 0), x.shape.ndim)
    op = reduce.ArgReduce(ctx.node.op_type == "ArgMax", axis, bool(ctx.attr("select_last_index", 0)))
    out = ctx.add(op, [x])
    return out if ctx.attr("keepdims", 1) else ctx.add(v.Squeeze([axis]), [out])


_REDUCE = {
    "ReduceSum": "reduce_sum", "ReduceMean": "reduce_mean", "ReduceMax": "reduce_max",
    "ReduceMin": "reduce_min", "ReduceProd": "reduce_prod", "ReduceSumSquare": "reduce_sum",
    "ReduceL1": "reduce_sum", "ReduceL2": "reduce_sum", "ReduceLogSum": "reduce_sum",
    "ReduceLogSumExp": "reduce_sum",
}
#: opset from which the axes of each reduction are an input instead of an attribute
_AXES_INPUT_SINCE = {"ReduceSum": 13}


@onnx_op(*_REDUCE)
def parse_reduce(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    """A reduce op with its elementwise parts: x*x before SumSquare and L2, |x| before L1, sqrt after
    L2, log after LogSum; LogSumExp is m + log(sum(exp(x - m))) with m the max, so it cannot
    overflow. With empty axes and noop_with_empty_axes=1 only the reduction is skipped: the
    elementwise parts still apply, as ONNX clarified (onnx/onnx#7394)."""
    x = ins[0]
    assert x is not None and ctx.node is not None
    t = ctx.node.op_type
    r = x.shape.ndim
    if ctx.opset >= _AXES_INPUT_SINCE.get(t, 18):
        axes = [int(a) for a in ctx.require_const(ins[1], "axes").reshape(-1)] if len(ins) > 1 and ins[1] is not None else []
    else:
        axes = list(ctx.attr("axes", []))
    noop = not axes and bool(ctx.attr("noop_with_empty_axes", 0))
    axes = ctx.axes(axes, r) if axes or noop else list(range(r))

    def reduce_(name: str, y: Instruction) -> Instruction:
        return y if noop else ctx.add(make_op(name, axes=axes), [y])

    if t == "ReduceLogSumExp":
        m = reduce_("reduce_max", x)
        zero = ctx.literal(np.zeros((), x.shape.dtype.numpy))
        m = ctx.add(pw.Where(), ctx.broadcast(ctx.add(pw.IsInf(), [m]), zero, m))  # all -inf rows: m = 0
        total = reduce_("reduce_sum", ctx.add(make_op("exp"), [binary(ctx, "sub", x, m)]))
        out = binary(ctx, "add", ctx.add(make_op("log"), [total]), m)
    else:
        pre = {"ReduceSumSquare": "sq", "ReduceL2": "sq", "ReduceL1": "abs"}.get(t)
        y = x
        if pre == "sq":
            y = ctx.add(make_op("mul"), [x, x])
        elif pre:
            y = ctx.add(make_op(pre), [x])
        out = reduce_(_REDUCE[t], y)
        if t == "ReduceL2":
            out = ctx.add(make_op("sqrt"), [out])
        elif t == "ReduceLogSum":
            out = ctx.add(make_op("log"), [out])
    if not ctx.attr("keepdims", 1) and not noop:
        out = ctx.add(v.Squeeze(axes), [out])
    return out


def _upsample_1_scales(ctx: ImportContext, x: Instruction) -> list[float]:
    """Opset 1's Upsample scaled the last two dims of [N, C, H, W] by two float attributes."""
    if x.shape.ndim != 4 or not (ctx.has_attr("height_scale") and ctx.has_attr("width_scale")):
        raise ctx.error("needs a 4-d input and attributes height_scale and width_scale")
    return [1.0, 1.0, float(ctx.attr("height_scale")), float(ctx.attr("width_scale"))]


def _resize_roi(ctx: ImportContext, roi_in: Instruction | None, axes: list[int], r: int) -> list[tuple[float, float]]:
    """(start, end) per axis of a crop-and-resize, from the roi input [starts..., ends...] over
    `axes`; axes it does not name keep the whole input (0, 1)."""
    if roi_in is None:
        raise ctx.error("coordinate_transformation_mode='tf_crop_and_resize' needs the roi input")
    roi = [float(v) for v in ctx.require_const(roi_in, "roi").reshape(-1)]
    if len(roi) != 2 * len(axes):
        raise ctx.error(f"roi has {len(roi)} values for {len(axes)} axes (needs starts and ends)")
    spans = [(0.0, 1.0)] * r
    for i, a in enumerate(axes):
        spans[a] = (roi[i], roi[i + len(axes)])
    return spans


@onnx_op("Resize", "Upsample")
def parse_resize(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None and ctx.node is not None
    r = x.shape.ndim
    mode = ctx.attr("mode", "nearest")
    mode = ctx.check_attr("mode", "linear" if mode == "bilinear" and ctx.opset < 7 else mode, ["nearest", "linear", "cubic"])
    if ctx.node.op_type == "Upsample" or ctx.opset < 11:
        scales_in, sizes_in = ins[1] if len(ins) > 1 else None, None
        coord = "asymmetric"
        if ctx.has_attr("scales"):
            scales_in = ctx.literal(np.array(ctx.attr("scales"), np.float32))
        elif ctx.opset < 7:
            scales_in = ctx.literal(np.array(_upsample_1_scales(ctx, x), np.float32))
    else:
        scales_in = ins[2] if len(ins) > 2 else None
        sizes_in = ins[3] if len(ins) > 3 else None
        coord = ctx.attr("coordinate_transformation_mode", "half_pixel")
    ctx.check_attr("coordinate_transformation_mode", coord, ["half_pixel", "pytorch_half_pixel", "align_corners",
                                                             "asymmetric", "half_pixel_symmetric", "tf_crop_and_resize"])
    ctx.check_attr("antialias", ctx.attr("antialias", 0), [0, 1])
    axes = ctx.axes(ctx.attr("axes", list(range(r))), r)
    roi = _resize_roi(ctx, ins[1], axes, r) if coord == "tf_crop_and_resize" else []
    policy = ctx.check_attr("keep_aspect_ratio_policy", ctx.attr("keep_aspect_ratio_policy", "stretch"),
                            ["stretch", "not_larger", "not_smaller"])
    scales_v = ctx.require_const(scales_in, "scales") if scales_in is not None else None
    sizes_v = ctx.require_const(sizes_in, "sizes") if sizes_in is not None else None
    scales = [1.0] * r
    out = list(x.shape.lens)
    if sizes_v is not None and sizes_v.size:
        sizes = [int(s) for s in sizes_v.reshape(-1)]
        if len(sizes) != len(axes):
            raise ctx.error(f"sizes has {len(sizes)} values for {len(axes)} axes")
        if policy != "stretch":
            ratios = [sizes[i] / x.shape.lens[a] for i, a in enumerate(axes)]
            s = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                out[a] = int(math.floor(x.shape.lens[a] * s + 0.5))
                scales[a] = s
        else:
            for i, a in enumerate(axes):
                out[a] = sizes[i]
                scales[a] = sizes[i] / x.shape.lens[a]
    elif scales_v is not None and scales_v.size:
        sv = [float(s) for s in scales_v.reshape(-1)]
        if len(sv) != len(axes):
            raise ctx.error(f"scales has {len(sv)} values for {len(axes)} axes")
        for i, a in enumerate(axes):
            if sv[i] <= 0:
                raise ctx.error(f"scales must be positive, got {sv}")
            scales[a] = sv[i]
            out[a] = int(math.floor(x.shape.lens[a] * sv[i]))
    else:
        raise ctx.error("needs scales or sizes")
    nearest_mode = ctx.attr("nearest_mode", "round_prefer_floor")
    if ctx.node.op_type == "Upsample" or ctx.opset < 11:
        # before nearest_mode existed, nearest upsampling repeats each element (floor), as the ONNX
        # reference and ONNX Runtime do; their downsampling rounding differs, so it is refused
        nearest_mode = "floor"
        if mode == "nearest" and any(s < 1 for s in scales):
            raise ctx.error("nearest downsampling before opset 11 is not supported (its rounding is unspecified)")
    op = movement.Resize(out, scales, mode, coord, nearest_mode, ctx.attr("cubic_coeff_a", -0.75),
                         bool(ctx.attr("exclude_outside", 0)), bool(ctx.attr("antialias", 0)), roi,
                         ctx.attr("extrapolation_value", 0.0))
    ctx.check_attr("nearest_mode", op.nearest_mode, ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
    return resample(ctx, x, op)


@onnx_op("Pad")
def parse_pad(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x = ins[0]
    assert x is not None
    r = x.shape.ndim
    mode = ctx.check_attr("mode", ctx.attr("mode", "constant"), ["constant", "reflect", "edge", "wrap"])
    if ctx.opset < 11:
        name = "paddings" if ctx.opset < 2 else "pads"  # opset 1 named the attribute paddings
        if not ctx.has_attr(name):
            raise ctx.error(f"missing attribute {name!r}")
        pads, value = list(ctx.attr(name)), float(ctx.attr("value", 0.0))
        axes = list(range(r))
    else:
        pads = [int(p) for p in ctx.require_const(ins[1], "pads").reshape(-1)]
        cv = ctx.require_const(ins[2], "constant_value") if len(ins) > 2 and ins[2] is not None else None
        value = float(cv.reshape(-1)[0]) if cv is not None and cv.size else 0.0
        axes = ctx.axes([int(a) for a in ctx.require_const(ins[3], "axes").reshape(-1)], r) \
            if len(ins) > 3 and ins[3] is not None else list(range(r))
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"pads has {len(pads)} values for {len(axes)} axes")
    full = [0] * (2 * r)
    for i, a in enumerate(axes):
        full[a], full[a + r] = pads[i], pads[i + len(axes)]
    if not any(full):
        return x
    return ctx.add(movement.Pad(full, mode, value), [x])
