"""A check of the memory plan: no kernel reads elements of a buffer that it writes.

Concat elimination lets a kernel store into its slice of a concat buffer while it reads
another slice of the same buffer (a C3 block's last convolution reads the bottleneck's
channels and writes its own). A kernel's programs run in any order, so this is only correct
when the elements read and the elements written are disjoint. The plan assumes it; this
module verifies it by enumerating both address sets, which is exact but costs time and
memory in proportion to the buffers, so tests run it on whole models rather than every
compile paying for it.
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.index_expr import evaluate
from fusegraph.ir.program import Instruction, Module
from fusegraph.ir.shape import Shape
from fusegraph.ops.base import is_fused, is_store
from fusegraph.targets.gpu.memory_plan import MemoryPlan, physical_shape, stored_buffer_input


def overlapping_reads(main: Module, plan: MemoryPlan) -> list[str]:
    """One line per kernel input that aliases elements its kernel writes (empty: all clear)."""
    problems = []
    for ins in main:
        if not is_fused(ins):
            continue
        k = stored_buffer_input(ins)
        if k is None:
            continue
        buffer = plan.of[id(ins)]
        readers = [(j, x) for j, x in enumerate(ins.inputs) if j != k and plan.of[id(x)] is buffer]
        if not readers:
            continue
        written = _written_addresses(ins, physical_shape(ins.inputs[k], plan))
        for j, x in readers:
            both = np.intersect1d(written, _view_addresses(physical_shape(x, plan)), assume_unique=True)
            if both.size:
                problems.append(f"kernel {ins.op.attrs['kernel']} writes {both.size} elements of buffer {buffer.id} "
                                f"that its input {j} ({x.op.name}) reads, e.g. element {int(both[0])}")
    return problems


def _view_addresses(shape: Shape) -> np.ndarray:
    address = np.full((), shape.offset, dtype=np.int64)
    for n, s in zip(shape.lens, shape.strides):
        address = address[..., None] + np.arange(n, dtype=np.int64) * s
    return np.unique(address)


def _written_addresses(fused: Instruction, dest: Shape) -> np.ndarray:
    """Element offsets, in the destination buffer, of every store of the fused sub-module."""
    out = []
    store = fused.op.module.returns[0]  # the further outputs have buffers of their own
    while is_store(store):
        m = store.op.attrs["map"]
        grids = np.indices(m.out_lens, dtype=np.int64) if m.out_lens else np.zeros((0,), np.int64)
        env = {v.name: g for v, g in zip(m.out_vars, grids)}
        shape = tuple(m.out_lens)
        address = np.full(shape, dest.offset, dtype=np.int64)
        for e, s in zip(m.exprs, dest.strides):
            address = address + np.broadcast_to(np.asarray(evaluate(e, env), dtype=np.int64), shape) * s
        keep = np.ones(shape, dtype=bool)
        for e, lo, hi in store.op.attrs["domain"]:
            value = np.asarray(evaluate(e, env))
            keep &= (value >= lo) & (value < hi)
        out.append(address[keep])
        store = store.inputs[0]
    return np.unique(np.concatenate(out)) if out else np.zeros(0, np.int64)
