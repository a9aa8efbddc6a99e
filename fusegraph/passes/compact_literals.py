"""Literal compaction: a constant that repeats along some axes becomes a broadcast of one slice.

An exported detection head may multiply by an anchor grid, a [1, 3, H, W, 2] tensor that only
varies with the anchor and the coordinate: stored whole, the fused head kernel loads it per
output element; as a [1, 3, 1, 1, 2] literal behind a broadcast, the load's index ignores the
pixel and the kernel reads a vector per tile. A layernorm's scale and bias, which the importer
broadcast to the input's lens (folded into a full literal when small), become their [K] rows
again the same way, and so do a batched product's weights repeated over its batch. Runs after
the last constant propagation, which would fold a small broadcast of a literal back into a
full one.
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import OpKind, is_literal
from fusegraph.ops.source import make_literal
from fusegraph.ops.views import MultiBroadcast
from fusegraph.passes.rewrite import rewrite_each


def repeated_axes(value: np.ndarray, axes: set[int] | None = None) -> list[int]:
    """Axes (longer than one; of `axes` only, if given) along which every slice equals the first.
    The second slice is compared first: a weight matrix differs there, and is then not compared
    whole (BERT-base's 84 weight matrices took 0.4 s of its compile that way)."""
    return [a for a, n in enumerate(value.shape) if n > 1 and (axes is None or a in axes)
            and np.array_equal(value.take([1], axis=a), value.take([0], axis=a))
            and bool(np.all(value == value.take([0], axis=a)))]


class CompactLiterals:
    name = "compact_literals"

    def apply(self, module: Module) -> bool:
        users = module.users()
        return rewrite_each(module, lambda ins: self._compact(module, ins, users))

    @staticmethod
    def _compact(module: Module, ins: Instruction, users: dict[Instruction, list[Instruction]]) -> bool:
        if not is_literal(ins) or ins.shape.elements < 2 or not users.get(ins):
            return False
        # only readers that take it element by element (pointwise ops, a layernorm's scale and
        # bias), or a batched product's weights along their batch axes: a weight's own axes or
        # an index operand keep their layout
        allowed = set(range(ins.shape.ndim))
        for u in users[ins]:
            if _batched_weights(u, ins):
                allowed &= set(range(ins.shape.ndim - 2))
            elif not _elementwise(u, ins):
                return False
        value = ins.op.value  # type: ignore[attr-defined]
        axes = repeated_axes(value, allowed)
        if not axes:
            return False
        small = value[tuple(slice(0, 1) if a in axes else slice(None) for a in range(value.ndim))]
        lit = make_literal(np.ascontiguousarray(small), origin=ins.origin)
        module.insert_before(ins, lit)
        module.replace(ins, module.make(MultiBroadcast(value.shape), [lit], ins.origin))
        return True


def _elementwise(reader: Instruction, ins: Instruction) -> bool:
    """Whether `reader` reads `ins` element by element at its own output index."""
    if reader.op.kind == OpKind.POINTWISE:
        return True
    return all(k in reader.op.elementwise_inputs for k, x in enumerate(reader.inputs) if x is ins)


def _batched_weights(reader: Instruction, ins: Instruction) -> bool:
    """Whether `reader` is a batched matrix product reading `ins` as its B only: the same
    weights repeated over the batch, kept as one [K, N] matrix behind a broadcast, let the
    product treat the batches as rows of one product (`templates/gemm_spec.dot_spec`)."""
    op = reader.op
    if op.kind != OpKind.ANCHOR or not op.k_is_last_axis or op.weight_input is None:
        return False
    return all((x is ins) == (k == op.weight_input) for k, x in enumerate(reader.inputs))
