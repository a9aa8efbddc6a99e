"""View-chain simplification: merge reshapes, compose transposes, cancel pairs.

ONNX exporters emit long view chains (Unsqueeze, Reshape, Flatten, Squeeze one after the
other; a Transpose and its inverse around an op). Every view is free in a fused kernel, but a
shorter chain gives simpler index expressions and a program a person can read.
"""

from __future__ import annotations

from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import OpKind
from fusegraph.ops.views import Reshape, Transpose

RESHAPES = ("reshape", "squeeze", "unsqueeze", "flatten")


def _merge(module: Module, ins: Instruction) -> bool:
    if ins.op.kind != OpKind.VIEW or not ins.inputs:
        return False
    src = ins.inputs[0]
    if ins.op.name in RESHAPES and src.op.name in RESHAPES and src.inputs[0].shape.standard():
        new = module.make(Reshape(ins.shape.lens), [src.inputs[0]], ins.origin)
    elif ins.op.name == "transpose" and src.op.name == "transpose":
        inner, outer = src.op.permutation, ins.op.permutation  # type: ignore[attr-defined]
        new = module.make(Transpose([inner[p] for p in outer]), [src.inputs[0]], ins.origin)
    elif ins.op.name in ("squeeze", "unsqueeze", "flatten") and ins.inputs[0].shape.standard():
        new = module.make(Reshape(ins.shape.lens), [src], ins.origin)
    else:
        return False
    module.replace(ins, new)
    return True


class SimplifyViews:
    name = "simplify_views"

    def apply(self, module: Module) -> bool:
        changed = False
        again = True
        while again:
            again = False
            for ins in list(module.instructions):
                if ins in module.instructions and _merge(module, ins):
                    again = changed = True
        if changed:
            from fusegraph.passes.dead_code import DeadCodeElimination

            DeadCodeElimination().apply(module)
        return changed
