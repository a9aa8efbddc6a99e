"""The computed side of a GEMM's A operand: which loads stay raw, and row statistics.

A product's A operand may be computed by its prologue (`passes/prologue_rule.py`): pointwise
ops and selects between concat parts are plain kernel-writer values, read in the k loop. A
layernorm in the prologue needs its rows' statistics before the first product: a loop over
the row's K (in BK chunks) computes each of the tile's BM rows' mean and variance in float32,
by Chan's combination of per-chunk means and squared deviations (exact two-pass sums within a
chunk, no `E[x^2] - E[x]^2` cancellation), and the k loop then normalizes the A tile as it
loads it. The affine is not here: `fold_norm_affine` moved it into the weights.
"""

from __future__ import annotations

from typing import Callable

from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import is_load, is_select
from fusegraph.targets.gpu.kernel_writer import Index, KernelWriter, Tile


def selected_loads(a: Instruction) -> list[Instruction] | None:
    """The loads an A operand reads when it computes nothing (a load, or a select between the
    loads of concat parts, zero wherever masked): they keep their storage type. None otherwise."""
    if is_load(a):
        return [a]
    if is_select(a) and all(is_load(x) for x in a.inputs):
        return list(a.inputs)
    return None


def prologue_norms(module: Module, anchor: Instruction) -> list[Instruction]:
    """The layernorms a product's prologue computes (the group's other non-pointwise ops)."""
    return [ins for ins in module if ins is not anchor and ins.op.algorithm == "layernorm"]


class RowStatistics:
    """Emits the statistics loop of each prologue layernorm and gives its normalized value."""

    def __init__(self, w: KernelWriter, norms: list[Instruction], a_index: Index, k: int) -> None:
        self.w, self.norms, self.a_index, self.k = w, norms, a_index, k
        self.names: dict[int, tuple[str, str]] = {}
        for ln in norms:
            w.anchor_values[id(ln)] = self._normalized(ln)

    def emit(self, m_bound: str) -> None:
        """Before the k loop: mean and 1/std of the tile's rows, for every prologue layernorm."""
        if not self.norms:
            return
        w, k = self.w, self.k
        tile = Tile({"rm": "rm[:, None]", "rk": "rk[None, :]", "gz": "gz"}, {"rm": m_bound, "rk": f"(rk[None, :] < {k})"})
        for j, _ in enumerate(self.norms):
            w.emit(f"ln{j}_mean = tl.zeros([BM], dtype=tl.float32)")
            w.emit(f"ln{j}_m2 = tl.zeros([BM], dtype=tl.float32)")
        with w.block(f"for k1 in range(0, {k}, BK):"):
            w.emit("rk = k1 + tl.arange(0, BK)")
            w.emit(f"ln_in_row = rk[None, :] < {k}")
            w.emit("ln_seen = k1 * 1.0")
            w.emit("ln_count = tl.sum(ln_in_row.to(tl.float32))")
            for j, ln in enumerate(self.norms):
                x = w.value(ln.inputs[0], tile, self.a_index)
                self._combine(f"ln{j}", x)
        for j, ln in enumerate(self.norms):
            rstd = w.let(f"1.0 / tl.sqrt(ln{j}_m2 / {k}.0 + {ln.op.attrs['epsilon']})", f"ln{j}_rstd")
            self.names[id(ln)] = (f"ln{j}_mean", rstd)

    def _combine(self, name: str, x: str) -> None:
        """Fold one chunk of rows `x` into the running mean and squared deviations `name`."""
        w = self.w
        chunk = w.let(f"tl.sum(tl.where(ln_in_row, {x}, 0.0), axis=1) / ln_count", "cm")
        dev = w.let(f"tl.where(ln_in_row, {x} - {chunk}[:, None], 0.0)", "dev")
        delta = w.let(f"{chunk} - {name}_mean", "delta")
        total = w.let("ln_seen + ln_count", "total")
        w.emit(f"{name}_mean = {name}_mean + {delta} * (ln_count / {total})")
        w.emit(f"{name}_m2 = {name}_m2 + tl.sum({dev} * {dev}, axis=1) + {delta} * {delta} * (ln_seen * ln_count / {total})")

    def _normalized(self, ln: Instruction) -> Callable[[Tile, Index], str]:
        """The k loop's value of `ln` at a tile index: its input there, normalized by its row's statistics."""

        def value(tile: Tile, index: Index) -> str:
            mean, rstd = self.names[id(ln)]
            x = self.w.value(ln.inputs[0], tile, index)
            return self.w.let(f"({x} - {mean}[:, None]) * {rstd}[:, None]")

        return value
