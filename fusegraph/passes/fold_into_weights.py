"""Folding per-channel affine ops into convolution and dot weights.

`conv(x, W) -> batch_norm` and `conv(x, W) * s` (s a scalar or per-output-channel literal)
become `conv(x, W') (+ b')` with the scale baked into the weights at compile time, so the
kernel does no extra work and the epilogue keeps only the bias add. Applies when the anchor's
weights are a literal and the anchor has no other reader.
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import is_literal, make_op
from fusegraph.ops.source import make_literal
from fusegraph.ops.views import MultiBroadcast
from fusegraph.passes.literal_values import broadcast_literal, per_channel
from fusegraph.passes.rewrite import rewrite_each


def _only_reader(users: dict[Instruction, list[Instruction]], ins: Instruction, module: Module) -> bool:
    return len(users.get(ins, [])) == 1 and ins not in module.returns


def _anchor_weights(anchor: Instruction) -> tuple[np.ndarray, int] | None:
    """The literal weights of a product (convolution, dot) and the axis of output channels in them;
    None also when that axis does not list every output channel once: a grouped transposed
    convolution's [C, M/group, *k] holds each group's channels on it, so a per-channel scale
    would not be one factor per weight slice."""
    op = anchor.op
    if op.family != "gemm" or op.weight_input is None or not is_literal(anchor.inputs[op.weight_input]):
        return None
    w = anchor.inputs[op.weight_input]
    axis = op.weight_channel_axis(w.shape.ndim)
    if w.shape.lens[axis] != anchor.shape.lens[op.channel_axis(anchor.shape.ndim)]:
        return None
    return w.op.value, axis  # type: ignore[attr-defined]


def _channel_axis(anchor: Instruction) -> int:
    return anchor.op.channel_axis(anchor.shape.ndim)


def _rescale(module: Module, anchor: Instruction, scale: np.ndarray) -> Instruction:
    """The anchor with its weights times `scale` per output channel, computed from the float32
    weights a half program narrowed where kept (`Literal.wide`), so they are rounded once."""
    weights, axis = _anchor_weights(anchor)  # type: ignore[misc]
    shape = [1] * weights.ndim
    shape[axis] = -1
    acc = np.float64
    k = anchor.op.weight_input
    exact = anchor.inputs[k].op.wide  # type: ignore[attr-defined]
    source = exact if exact is not None and exact.shape == weights.shape else weights
    new_w = (source.astype(acc) * scale.astype(acc).reshape(shape)).astype(weights.dtype)
    lit = make_literal(new_w, origin=anchor.inputs[k].origin)
    module.insert_before(anchor, lit)
    inputs = list(anchor.inputs)
    inputs[k] = lit
    new = module.make(anchor.op, inputs, anchor.origin)
    module.insert_before(anchor, new)
    return new


def add_bias(module: Module, before: Instruction, out: Instruction, bias: np.ndarray, axis: int,
             origin: str | None = None) -> Instruction:
    """`out + bias` (a vector along `axis`, broadcast), placed before `before`; the new
    instructions take `origin` (default: `before`'s)."""
    origin = before.origin if origin is None else origin
    shape = [1] * out.shape.ndim
    shape[axis] = -1
    lit = make_literal(bias.astype(out.shape.dtype.numpy).reshape(shape), origin=origin)
    module.insert_before(before, lit)
    b = module.make(MultiBroadcast(out.shape.lens), [lit], origin)
    module.insert_before(before, b)
    add = module.make(make_op("add"), [out, b], origin)
    module.insert_before(before, add)
    return add


class FoldIntoWeights:
    name = "fold_into_weights"

    def apply(self, module: Module) -> bool:
        users = module.users()

        def fold(ins: Instruction) -> bool:
            nonlocal users
            done = False
            if ins.op.name == "batch_norm":
                done = self._fold_batch_norm(module, ins, users)
            elif ins.op.algebra == "product":
                done = self._fold_scale(module, ins, users)
            if done:  # the rewrite only touched this instruction's producers
                users = module.users()
            return done

        return rewrite_each(module, fold, drop_dead=True)

    def _fold_batch_norm(self, module: Module, bn: Instruction, users: dict) -> bool:
        x = bn.inputs[0]
        bias0 = None
        anchor = x
        if x.op.algebra == "sum" and _only_reader(users, x, module):
            anchor, bias0 = x.inputs[0], broadcast_literal(x.inputs[1], wide=True)
            if bias0 is None:
                return False
        if _anchor_weights(anchor) is None or not _only_reader(users, anchor, module):
            return False
        axis, channels = _channel_axis(anchor), anchor.shape.lens[_channel_axis(anchor)]
        if axis != 1:
            return False  # batch_norm normalizes axis 1
        params = [per_channel(broadcast_literal(p, wide=True), bn.shape.ndim, axis, channels) for p in bn.inputs[1:]]
        b0 = per_channel(bias0, bn.shape.ndim, axis, channels) if bias0 is not None else np.zeros(channels)
        if any(p is None for p in params) or b0 is None:
            return False
        scale, beta, mean, var = (p.astype(np.float64) for p in params)  # type: ignore[union-attr]
        s = scale / np.sqrt(var + bn.op.epsilon)  # type: ignore[attr-defined]
        new = _rescale(module, anchor, s)
        out = add_bias(module, bn, new, (b0.astype(np.float64) - mean) * s + beta, axis)
        module.replace_uses(bn, out)
        return True

    def _fold_scale(self, module: Module, mul: Instruction, users: dict) -> bool:
        anchor, factor = mul.inputs
        value = broadcast_literal(factor, wide=True)
        if value is None:
            anchor, factor = factor, anchor
            value = broadcast_literal(factor, wide=True)
        if value is None or _anchor_weights(anchor) is None or not _only_reader(users, anchor, module):
            return False
        axis = _channel_axis(anchor)
        s = per_channel(value, mul.shape.ndim, axis, anchor.shape.lens[axis])
        if s is None:
            return False
        new = _rescale(module, anchor, s)
        module.replace_uses(mul, new)
        return True
