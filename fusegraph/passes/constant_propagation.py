"""Constant propagation: fold every instruction whose inputs are all literals.

The folding rule (ops/constant_fold.py) is the importer's too, so a program folds the same
whether a constant was seen at import or exposed by a later rewrite.
"""

from __future__ import annotations

from fusegraph.ir.program import Module
from fusegraph.ops.constant_fold import fold, foldable


class ConstantPropagation:
    name = "constant_propagation"

    def apply(self, module: Module) -> bool:
        changed = False
        for ins in list(module.instructions):
            if foldable(ins):
                fold(module, ins)
                changed = True
        return changed
