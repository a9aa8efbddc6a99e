"""Parsers of the training losses ONNX defines as functions: NegativeLogLikelihoodLoss and
SoftmaxCrossEntropyLoss, each composed of ops that already fuse and have GPU kernels.

NLL picks each sample's log-probability of its target class with a GatherElements on the class
axis, weights it by the class weight (a Gather of the weights by target) and reduces; targets
equal to `ignore_index` weigh 0 and read class 0, so they never index out of range. The mean
divides by the sum of the weights used, as ONNX specifies.
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.program import Instruction
from fusegraph.ops import make_op
from fusegraph.ops import pointwise as pw
from fusegraph.ops import reduce
from fusegraph.ops import views as v
from fusegraph.ops.gather import GatherElements
from fusegraph.ops.movement import Gather
from fusegraph.onnx.context import ImportContext, onnx_op
from fusegraph.onnx.parsers.elementwise import binary


def _scalar(ctx: ImportContext, value: float | int, like: Instruction) -> Instruction:
    return ctx.literal(np.array(value, like.shape.dtype.numpy))


def _sum_all(ctx: ImportContext, x: Instruction) -> Instruction:
    total = ctx.add(make_op("reduce_sum", axes=range(x.shape.ndim)), [x])
    return ctx.add(v.Reshape([]), [total])


def nll_loss(ctx: ImportContext, logp: Instruction, target: Instruction, weight: Instruction | None) -> Instruction:
    """The loss of log-probabilities `logp` [N, C, ...] at `target` [N, ...] (see the module)."""
    if logp.shape.ndim < 2 or target.shape.lens != logp.shape.lens[:1] + logp.shape.lens[2:]:
        raise ctx.error(f"target {list(target.shape.lens)} does not match input {list(logp.shape.lens)} without its class axis")
    if not target.shape.dtype.is_integer:
        raise ctx.error(f"target must be integers, got {target.shape.dtype}")
    reduction = ctx.check_attr("reduction", ctx.attr("reduction", "mean"), ["none", "sum", "mean"])
    valid = None
    if ctx.has_attr("ignore_index"):
        ignored = binary(ctx, "equal", target, _scalar(ctx, ctx.attr("ignore_index"), target))
        valid = ctx.add(make_op("not"), [ignored])
        target = ctx.add(pw.Where(), ctx.broadcast(valid, target, _scalar(ctx, 0, target)))
    picked = ctx.add(GatherElements(1), [logp, ctx.add(v.Unsqueeze([1]), [target])])
    loss = ctx.add(make_op("neg"), [ctx.add(v.Squeeze([1]), [picked])])
    w = ctx.add(Gather(0), [weight, target]) if weight is not None else None
    if valid is not None:
        w = ctx.add(pw.Where(), ctx.broadcast(valid, w, _scalar(ctx, 0, w))) if w is not None \
            else ctx.convert(valid, loss.shape.dtype)
    if w is not None:
        loss = ctx.add(make_op("mul"), [loss, w])
    if reduction == "none":
        return loss
    if reduction == "sum":
        return _sum_all(ctx, loss)
    if w is None:
        return ctx.add(v.Reshape([]), [ctx.add(make_op("reduce_mean", axes=range(loss.shape.ndim)), [loss])])
    return ctx.add(make_op("div"), [_sum_all(ctx, loss), _sum_all(ctx, w)])


@onnx_op("NegativeLogLikelihoodLoss")
def parse_nll_loss(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    logp, target = ins[0], ins[1]
    assert logp is not None and target is not None
    return nll_loss(ctx, logp, target, ins[2] if len(ins) > 2 else None)


@onnx_op("SoftmaxCrossEntropyLoss")
def parse_softmax_cross_entropy(ctx: ImportContext, ins: list[Instruction | None]) -> list[Instruction]:
    """log_softmax over the class axis, then the NLL loss; the second output is the log_softmax."""
    scores, labels = ins[0], ins[1]
    assert scores is not None and labels is not None and ctx.node is not None
    if scores.shape.ndim < 2:
        raise ctx.error(f"scores need [N, C, ...], got {list(scores.shape.lens)}")
    logp = ctx.add(reduce.Softmax(1, True), [scores])
    loss = nll_loss(ctx, logp, labels, ins[2] if len(ins) > 2 else None)
    return [loss, logp][:max(1, len(ctx.node.output))]
