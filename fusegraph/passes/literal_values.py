"""Reading constant operands through the broadcasts the importer puts in front of them.

Canonicalizing passes ask "is this operand a constant, and per which axis does it vary?"
(a bias, a scale, the 1 of a multiplication); the answer lives here once.
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.program import Instruction
from fusegraph.ops.base import is_literal


def broadcast_literal(ins: Instruction, wide: bool = False) -> np.ndarray | None:
    """The value of a literal seen through its broadcast, at the broadcast's rank (size-1 dims
    kept); with `wide`, the float32 values a half-precision literal was narrowed from, where it
    keeps them (`Literal.wide`), for a fold that computes new weights from them."""
    rank = ins.shape.ndim
    while ins.op.broadcasts:
        ins = ins.inputs[0]
    if not is_literal(ins):
        return None
    v = ins.op.value  # type: ignore[attr-defined]
    if wide and ins.op.wide is not None:  # type: ignore[attr-defined]
        v = ins.op.wide  # type: ignore[attr-defined]
    return v.reshape((1,) * (rank - v.ndim) + v.shape)


def per_channel(value: np.ndarray | None, rank: int, axis: int, channels: int) -> np.ndarray | None:
    """`value` as a vector over `axis` if it varies along that axis only (or nowhere)."""
    if value is None or value.ndim != rank:
        return None
    if any(n != 1 for i, n in enumerate(value.shape) if i != axis):
        return None
    return np.broadcast_to(value.reshape(-1), (channels,)) if value.shape[axis] in (1, channels) else None
