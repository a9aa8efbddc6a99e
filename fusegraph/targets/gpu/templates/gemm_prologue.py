"""The computed side of a GEMM's A operand: which loads stay raw, row statistics, row stores.

A product's A operand may be computed by its prologue (`passes/prologue_rule.py`): pointwise
ops and selects between concat parts are plain kernel-writer values, read in the k loop. A
layernorm in the prologue needs its rows' statistics before the first product: a loop over
the row's K (in BK chunks) computes each of the tile's BM rows' mean and variance in float32,
by Chan's combination of per-chunk means and squared deviations (exact two-pass sums within a
chunk, no `E[x^2] - E[x]^2` cancellation; a layernorm of another's rows gets a loop after
that one's), and the k loop then normalizes the A tile as it loads it, times gamma plus beta
when the layernorm still has its affine (read as the [K] vectors behind their broadcasts, one
[1, BK] load per chunk; `fold_norm_affine` has moved a constant affine into the weights
wherever only products read the layernorm).

When other readers need the normalized rows, the group also stores them (a further output
whose value is computed from the inputs, not from the product: `row_stores`). The k loop's
normalized A tile is that value at the A index, so the programs of the first column block
(`pid_n == 0`) store it as they load it: with split-k each program walks its own k chunks
and the splits together cover K, so every element is written exactly once, in the output's
type, with no second pass over the rows.
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


def row_stores(module: Module, anchor: Instruction) -> list[Instruction]:
    """The group's stored values that its prologue computes: stores (and chains of them)
    whose values do not depend on the product, so they live at the A index."""
    return [r for r in module.returns[1:] if not _reaches(r, anchor)]


def _reaches(ins: Instruction, target: Instruction) -> bool:
    """Whether `ins` is `target` or computed from it."""
    stack, seen = [ins], set()
    while stack:
        x = stack.pop()
        if x is target:
            return True
        if id(x) not in seen:
            seen.add(id(x))
            stack.extend(x.inputs)
    return False


def emit_row_stores(w: KernelWriter, stores: list[Instruction], tile: Tile, index: Index) -> None:
    """Inside the k loop, after the A tile: the first column block's programs store the
    prologue's values at the chunk's rows and columns (masked by the tile's bounds)."""
    if not stores:
        return
    with w.block("if pid_n == 0:"):
        for ret in stores:
            w.store(ret, tile, index)


class RowStatistics:
    """Emits the statistics loops of the prologue's layernorms and gives their normalized values."""

    def __init__(self, w: KernelWriter, norms: list[Instruction], a_index: Index, k: int) -> None:
        self.w, self.norms, self.a_index, self.k = w, norms, a_index, k
        self.names: dict[int, tuple[str, str]] = {}
        for ln in norms:
            w.anchor_values[id(ln)] = self._normalized(ln)

    def emit(self, m_bound: str) -> None:
        """Before the k loop: mean and 1/std of the tile's rows, for every prologue layernorm;
        one loop over K for the norms of independent inputs, a later one for a norm of
        another's value (it needs that one's statistics to read its input)."""
        w, k = self.w, self.k
        for loop in self._loops():
            tile = Tile({"rm": "rm[:, None]", "rk": "rk[None, :]", "gz": "gz"}, {"rm": m_bound, "rk": f"(rk[None, :] < {k})"})
            for j, _ in loop:
                w.emit(f"ln{j}_mean = tl.zeros([BM], dtype=tl.float32)")
                w.emit(f"ln{j}_m2 = tl.zeros([BM], dtype=tl.float32)")
            with w.block(f"for k1 in range(0, {k}, BK):"):
                w.emit("rk = k1 + tl.arange(0, BK)")
                w.emit(f"ln_in_row = rk[None, :] < {k}")
                w.emit("ln_seen = k1 * 1.0")
                w.emit("ln_count = tl.sum(ln_in_row.to(tl.float32))")
                for j, ln in loop:
                    x = w.value(ln.inputs[0], tile, self.a_index)
                    self._combine(f"ln{j}", x)
            for j, ln in loop:
                rstd = w.let(f"1.0 / tl.sqrt(ln{j}_m2 / {k}.0 + {ln.op.attrs['epsilon']})", f"ln{j}_rstd")
                self.names[id(ln)] = (f"ln{j}_mean", rstd)

    def _loops(self) -> list[list[tuple[int, Instruction]]]:
        """The norms (with their numbers) by statistics loop: a norm goes one loop after the
        latest norm its input reads (the sub-module lists a norm after those it reads)."""
        number = {id(ln): j for j, ln in enumerate(self.norms)}
        level: dict[int, int] = {}
        for ln in self.norms:
            stack, seen, below = [ln.inputs[0]], set(), [-1]
            while stack:
                x = stack.pop()
                if id(x) in seen:
                    continue
                seen.add(id(x))
                if id(x) in number:
                    below.append(level[id(x)])
                stack.extend(x.inputs)
            level[id(ln)] = max(below) + 1
        loops: list[list[tuple[int, Instruction]]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
        for ln in self.norms:
            loops[level[id(ln)]].append((number[id(ln)], ln))
        return loops

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
        """The k loop's value of `ln` at a tile index: its input there, normalized by its row's
        statistics, then scaled and shifted by its gamma and beta there if it has them."""

        def value(tile: Tile, index: Index) -> str:
            mean, rstd = self.names[id(ln)]
            x = self.w.value(ln.inputs[0], tile, index)
            y = self.w.let(f"({x} - {mean}[:, None]) * {rstd}[:, None]")
            if len(ln.inputs) == 3:
                gamma, beta = (self.w.value(p, tile, index) for p in ln.inputs[1:])
                y = self.w.let(f"{y} * {gamma} + {beta}")
            return y

        return value
