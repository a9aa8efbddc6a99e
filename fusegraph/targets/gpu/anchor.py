"""The anchor of a fused group: the one op that a template lowers.

Everything else in a group is a parameter, a load, a store, an allocation or a pointwise op,
which the kernel writer handles whatever the template; the anchor's family picks the template.
"""

from __future__ import annotations

from fusegraph.ir.program import Instruction
from fusegraph.ops.base import OpKind
from fusegraph.targets.gpu.errors import CodegenError


def find_anchor(fused: Instruction) -> Instruction | None:
    """The one op of the group that is not pointwise, load, store, allocation or a reduction
    within the anchor's tile; a product's prologue may also hold normalizations, which the
    product's template computes, and a reduction's gathers and pads."""
    anchors = []
    for ins in fused.op.module:
        if ins.op.kind in (OpKind.PARAM, OpKind.MEMORY, OpKind.POINTWISE) or ins.op.in_epilogue:
            continue
        if not ins.op.family:
            raise CodegenError(f"kernel {fused.op.attrs['kernel']}: the GPU target has no template for op {ins.op.name}")
        anchors.append(ins)
    # a reduction's prologue may also hold gathers and pads, which find each element on their own
    # wherever it is read (templates/movement.py)
    reductions = [a for a in anchors if a.op.kind == OpKind.REDUCE]
    if len(reductions) == 1 and all(a.op.finds_elements for a in anchors if a is not reductions[0]):
        return reductions[0]
    products = [a for a in anchors if a.op.kind == OpKind.ANCHOR]
    if len(products) == 1 and all(a.op.algorithm == "layernorm" for a in anchors if a is not products[0]):
        return products[0]
    if len(anchors) > 1:
        raise CodegenError(f"kernel {fused.op.attrs['kernel']} holds {len(anchors)} anchors "
                           f"({', '.join(a.op.name for a in anchors)}); one per kernel is supported")
    return anchors[0] if anchors else None
