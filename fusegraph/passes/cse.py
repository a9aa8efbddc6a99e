"""Common-subexpression elimination: equal computations on equal inputs are computed once.

Exporters repeat work per layer: BERT's attention mask `where(mask, 0, -inf)` is built again in
each of its 12 layers from the same inputs, each a kernel of its own. Two instructions with
equal ops (same class, equal attributes) reading the same instructions compute the same value,
so readers of the later one read the earlier one. Literals merge when they hold the same bytes
in the same dtype and shape (bytes, not values: -0.0 and 0.0 stay apart, equal NaNs merge).
Visiting in program order merges whole chains: once two inputs merged, their readers compare
equal too. Parameters, fused groups and the memory ops inside them are never merged.
"""

from __future__ import annotations

import hashlib
from typing import Hashable

import numpy as np

from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import OpKind, is_literal

_NEVER = (OpKind.PARAM, OpKind.MEMORY, OpKind.FUSED)
SAMPLE = 4096  # elements of a literal its key digests


def _key(ins: Instruction) -> Hashable | None:
    """What two instructions must share to compute the same value; None if never merged."""
    op = ins.op
    if op.kind in _NEVER:
        return None
    if is_literal(ins):
        value = op.value  # type: ignore[attr-defined]
        return ("@literal", value.dtype.str, value.shape, _sample_digest(value))
    try:
        hash(op)
    except TypeError:  # an attribute that is not hashable: compare nothing
        return None
    return (op, tuple(id(x) for x in ins.inputs), ins.shape)


def _sample_digest(value: np.ndarray) -> bytes:
    """A digest of `SAMPLE` evenly spaced elements of `value` (all of a small one): hashing
    every byte of every weight took 0.3 s of BERT-base's compile, and `_same` compares the
    whole values where two samples agree."""
    flat = value.reshape(-1)
    sample = flat[::max(1, flat.size // SAMPLE)]
    return hashlib.blake2b(np.ascontiguousarray(sample).tobytes(), digest_size=16).digest()


def _same(a: Instruction, b: Instruction) -> bool:
    """Confirm a key match (literals agreeing on their samples may differ elsewhere)."""
    if is_literal(a):
        return a.op.value.tobytes() == b.op.value.tobytes()  # type: ignore[attr-defined]
    return True


class CommonSubexpressions:
    name = "common_subexpressions"

    def apply(self, module: Module) -> bool:
        seen: dict[Hashable, list[Instruction]] = {}  # the distinct values of each key
        merged: dict[int, Instruction] = {}  # readers of the key read the value
        returned = {id(r) for r in module.returns}
        keep: list[Instruction] = []
        for ins in module.instructions:
            ins.inputs = [merged.get(id(x), x) for x in ins.inputs]
            key = _key(ins)
            alike = seen.setdefault(key, []) if key is not None else []
            first = next((x for x in alike if _same(x, ins)), None)
            if first is None:
                if key is not None:
                    alike.append(ins)
                keep.append(ins)
                continue
            merged[id(ins)] = first
            if id(ins) in returned and id(first) in returned:
                keep.append(ins)  # two outputs stay two buffers; only other readers move
            elif id(ins) in returned:
                returned.add(id(first))
        if not merged:
            return False
        module.instructions = keep
        kept = {id(i) for i in keep}
        module.returns = [r if id(r) in kept else merged[id(r)] for r in module.returns]
        return True
