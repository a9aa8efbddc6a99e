"""Identity elimination: drop instructions that return their input unchanged.

Views to the same lens (in the same layout), no-op converts and multiplications by one or
additions of zero cost a kernel launch or an index computation for nothing.
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import OpKind
from fusegraph.passes.literal_values import broadcast_literal
from fusegraph.passes.rewrite import rewrite_each


def is_identity(ins: Instruction) -> bool:
    op = ins.op
    if op.kind == OpKind.VIEW or op.converts_type:
        src = ins.inputs[0].shape
        return src.lens == ins.shape.lens and src.dtype == ins.shape.dtype and src.strides == ins.shape.strides \
            and src.offset == ins.shape.offset
    if op.kind == OpKind.POINTWISE and op.right_identity is not None:
        value = broadcast_literal(ins.inputs[1])
        return value is not None and ins.inputs[0].shape == ins.shape and bool(np.all(value == op.right_identity))
    return False


class EliminateIdentity:
    name = "eliminate_identity"

    def apply(self, module: Module) -> bool:
        def drop(ins: Instruction) -> bool:
            if not is_identity(ins):
                return False
            module.replace(ins, ins.inputs[0])
            return True

        return rewrite_each(module, drop)
