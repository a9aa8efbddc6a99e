"""View-chain simplification: merge reshapes, compose transposes, cancel pairs.

ONNX exporters emit long view chains (Unsqueeze, Reshape, Flatten, Squeeze one after the
other; a Transpose and its inverse around an op). Every view is free in a fused kernel, but a
shorter chain gives simpler index expressions and a program a person can read.
"""

from __future__ import annotations

from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import OpKind
from fusegraph.ops.views import Reshape, Transpose
from fusegraph.passes.dead_code import DeadCodeElimination
from fusegraph.passes.rewrite import rewrite_each


def _merge(module: Module, ins: Instruction) -> bool:
    """Replace `ins` by a simpler view: one reshape for two order-keeping views, one transpose
    for two permutations, a reshape for any other order-keeping view of a standard tensor."""
    if ins.op.kind != OpKind.VIEW or not ins.inputs:
        return False
    src = ins.inputs[0]
    reshape = Reshape(ins.shape.lens)
    outer, inner = ins.op.axis_permutation(), src.op.axis_permutation()
    if ins.op.keeps_order and src.op.keeps_order and src.inputs[0].shape.standard():
        new = module.make(reshape, [src.inputs[0]], ins.origin)
    elif outer is not None and inner is not None:
        new = module.make(Transpose([inner[p] for p in outer]), [src.inputs[0]], ins.origin)
    elif ins.op.keeps_order and ins.op != reshape and src.shape.standard():
        new = module.make(reshape, [src], ins.origin)
    else:
        return False
    module.replace(ins, new)
    return True


class SimplifyViews:
    name = "simplify_views"

    def apply(self, module: Module) -> bool:
        changed = False
        while rewrite_each(module, lambda ins: ins in module.instructions and _merge(module, ins)):
            changed = True
        if changed:
            DeadCodeElimination().apply(module)
        return changed
