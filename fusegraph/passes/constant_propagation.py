"""Constant propagation: evaluate instructions whose inputs are all literals.

The same rule serves the ONNX importer (which folds shape subgraphs as it reads them) and
the canonicalizer: fold unless the result would be much larger than what it reads (a
broadcast of a scalar to a feature map stays a free view instead of a big literal).
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import is_literal

#: Fold when the output has at most this many elements, or no more than the inputs have.
FOLD_LIMIT = 4096


def foldable(ins: Instruction) -> bool:
    if not ins.inputs or not all(is_literal(x) for x in ins.inputs):
        return False
    if getattr(ins.op, "module", None) is not None:
        return False
    return ins.shape.elements <= max(FOLD_LIMIT, sum(x.shape.elements for x in ins.inputs))


def fold(module: Module, ins: Instruction) -> Instruction:
    """Replace `ins` (which must be foldable) by a literal holding its value; returns the literal."""
    with np.errstate(all="ignore"):
        value = ins.op.reference([x.op.value for x in ins.inputs])  # type: ignore[attr-defined]
    lit = module.make_literal(np.asarray(value, dtype=ins.shape.dtype.numpy).reshape(ins.shape.lens), origin=ins.origin)
    module.replace(ins, lit)
    return lit


class ConstantPropagation:
    name = "constant_propagation"

    def apply(self, module: Module) -> bool:
        changed = False
        for ins in list(module.instructions):
            if foldable(ins):
                fold(module, ins)
                changed = True
        return changed
