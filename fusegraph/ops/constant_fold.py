"""Constant folding: evaluate an instruction whose inputs are all literals into a literal.

The ONNX importer folds shape subgraphs as it reads them and the constant_propagation pass
folds what the canonicalizer exposes; both sit above the ops, so the one rule lives here: fold
unless the result would be much larger than what it reads (a broadcast of a scalar to a feature
map stays a free view instead of a big literal).
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import is_literal
from fusegraph.ops.source import make_literal

#: Fold when the output has at most this many elements, or no more than the inputs have.
FOLD_LIMIT = 4096


def foldable(ins: Instruction) -> bool:
    if not ins.inputs or not all(is_literal(x) for x in ins.inputs):
        return False
    if getattr(ins.op, "module", None) is not None:
        return False
    return ins.shape.elements <= max(FOLD_LIMIT, sum(x.shape.elements for x in ins.inputs))


def reads_nothing(ins: Instruction) -> bool:
    """Whether every input of `ins` is empty: its value then follows from shapes alone (a sum
    over an empty axis is 0, a max -inf), whatever computes the inputs."""
    return bool(ins.inputs) and getattr(ins.op, "module", None) is None and all(x.shape.elements == 0 for x in ins.inputs)


def fold(module: Module, ins: Instruction) -> Instruction:
    """Replace `ins` (which must be foldable, or read nothing) by a literal holding its value;
    returns the literal."""
    args = [x.op.value if is_literal(x) else np.zeros(x.shape.lens, x.shape.dtype.numpy)  # type: ignore[attr-defined]
            for x in ins.inputs]
    with np.errstate(all="ignore"):
        value = ins.op.reference(args)
    lit = make_literal(np.asarray(value, dtype=ins.shape.dtype.numpy).reshape(ins.shape.lens), origin=ins.origin)
    module.replace(ins, lit)
    return lit
