"""Identity elimination: drop instructions that return their input unchanged.

Views to the same lens (in the same layout), no-op converts and multiplications by one or
additions of zero cost a kernel launch or an index computation for nothing.
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.program import Instruction, Module
from fusegraph.passes.literal_values import broadcast_literal


def is_identity(ins: Instruction) -> bool:
    op = ins.op.name
    if op in ("reshape", "transpose", "multibroadcast", "slice", "squeeze", "unsqueeze", "flatten", "convert"):
        src = ins.inputs[0].shape
        return src.lens == ins.shape.lens and src.dtype == ins.shape.dtype and src.strides == ins.shape.strides \
            and src.offset == ins.shape.offset
    if op in ("mul", "add", "sub", "div"):
        value = broadcast_literal(ins.inputs[1])
        neutral = 1 if op in ("mul", "div") else 0
        return value is not None and ins.inputs[0].shape == ins.shape and bool(np.all(value == neutral))
    return False


class EliminateIdentity:
    name = "eliminate_identity"

    def apply(self, module: Module) -> bool:
        changed = False
        for ins in list(module.instructions):
            if is_identity(ins):
                module.replace(ins, ins.inputs[0])
                changed = True
        return changed
