"""The computed side of a GEMM's A operand: which loads stay raw, row statistics, row stores.

A product's A operand may be computed by its prologue (`passes/prologue_rule.py`): pointwise
ops and selects between concat parts are plain kernel-writer values, read in the k loop. A
layernorm in the prologue needs its rows' mean and variance in float32, by Chan's combination
of per-chunk means and squared deviations (exact two-pass sums within a chunk, no
`E[x^2] - E[x]^2` cancellation): taken in the k loop itself with the normalization after the
product, or in a loop over the row's K before it (`RowStatistics` says when which; a
layernorm of another's rows gets a loop after that one's). The k loop then normalizes the A
tile as it loads it, times gamma plus beta when the layernorm still has its affine (read as
the [K] vectors behind their broadcasts, one [1, BK] load per chunk; `fold_norm_affine` has
moved a constant affine into the weights wherever only products read the layernorm).

When other readers need the normalized rows, the group also stores them (a further output
whose value is computed from the inputs, not from the product: `row_stores`). The k loop's
normalized A tile is that value at the A index, so the programs of the first column block
(`pid_n == 0`) store it as they load it: with split-k each program walks its own k chunks
and the splits together cover K, so every element is written exactly once, in the output's
type, with no second pass over the rows.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import is_load, is_select
from fusegraph.targets.gpu.kernel_writer import Index, KernelWriter, Tile


# Chunks of the statistics loop in flight at once: its loads do not depend on each other, and
# the loop is pipelined as a product's k loop is, instead of waiting out each load in turn.
STATS_STAGES = 3


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


def deferrable(module: Module, anchor: Instruction, norms: list[Instruction]) -> bool:
    """Whether the product may normalize after the k loop (`RowStatistics`, deferred): its A is
    the one prologue layernorm itself, without an affine and read by nothing else in the group
    (a stored norm is stored as the k loop normalizes it), and its B a plain load (the
    weights, whose column sums the kernel takes with the same tiles)."""
    if len(norms) != 1 or anchor.inputs[0] is not norms[0] or len(norms[0].inputs) != 1:
        return False
    return is_load(anchor.inputs[1]) and all(u is anchor for u in module.users().get(norms[0], []))


class RowStatistics:
    """Emits the statistics of the prologue's layernorms and gives their normalized values.

    Normalizing the A tile as it loads needs each row's statistics before the first product:
    a loop of their own over the row's K chunks, K/BK dependent loads before the k loop starts
    (`emit`). Deferred, for one layernorm that alone is A, the normalization moves past the
    product instead: with c any per-row shift,
    dot((x - mean) * rstd, W) = rstd * (dot(x - c, W) - (mean - c) * colsum(W)),
    so the k loop multiplies the shifted rows, folds each chunk it loaded into the rows'
    statistics and takes W's column sums with a second, 16-row product of ones
    (`column_sums`); after the loop the accumulator is corrected in float32 (`finish`). One
    pass over A and no loop before the product. The shift is each row's first chunk's mean:
    rows far from zero (a mean of 300, a spread of 1) would otherwise leave a float32
    accumulator to cancel 300 * colsum(W) against itself. Split-k programs see only part of K,
    so with SPLIT > 1 the kernel keeps the statistics loop (a constexpr branch: each config
    builds one of the two). With tf32 the shifted rows would lose bits to its rounding, so it
    is not deferred there.
    """

    def __init__(self, w: KernelWriter, norms: list[Instruction], a_index: Index, k: int, deferred: bool = False) -> None:
        self.w, self.norms, self.a_index, self.k, self.deferred = w, norms, a_index, k, deferred
        self.names: dict[int, tuple[str, str]] = {}
        for ln in norms:
            w.anchor_values[id(ln)] = self._normalized(ln)

    def emit(self, m_bound: str) -> None:
        """Before the k loop: mean and 1/std of the tile's rows, for every prologue layernorm;
        one loop over K for the norms of independent inputs, a later one for a norm of
        another's value (it needs that one's statistics to read its input). Deferred: only
        when SPLIT > 1; the rows' running statistics start empty otherwise."""
        if not self.norms:
            return
        w, k = self.w, self.k
        for j, _ in enumerate(self.norms):
            w.emit(f"ln{j}_mean = tl.zeros([BM], dtype=tl.float32)")
            w.emit(f"ln{j}_m2 = tl.zeros([BM], dtype=tl.float32)")
            w.emit(f"ln{j}_rstd = tl.zeros([BM], dtype=tl.float32)")
        if self.deferred:
            w.emit("ln_wsum = tl.zeros([16, BN], dtype=tl.float32)")
            w.emit("ln0_shift = tl.zeros([BM], dtype=tl.float32)")
        with w.block("if SPLIT > 1:") if self.deferred else nullcontext():
            for loop in self._loops():
                tile = Tile({"rm": "rm[:, None]", "rk": "rk[None, :]", "gz": "gz"}, {"rm": m_bound, "rk": f"(rk[None, :] < {k})"})
                with w.block(f"for k1 in tl.range(0, {k}, BK, num_stages={STATS_STAGES}):"):
                    w.emit("rk = k1 + tl.arange(0, BK)")
                    self._chunk("k1")
                    for j, ln in loop:
                        self._combine(f"ln{j}", w.value(ln.inputs[0], tile, self.a_index))
                self._rstd(loop)
                for j, ln in loop:  # a later loop's norm reads these
                    self.names[id(ln)] = (f"ln{j}_mean", f"ln{j}_rstd")

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

    def column_sums(self, b_tile: str, operand: str, precision: str) -> None:
        """In the k loop of a deferred kernel: add the chunk's B rows into W's column sums."""
        if self.deferred:
            with self.w.block("if SPLIT == 1:"):
                self.w.emit(f"ln_wsum = tl.dot(tl.full([16, BK], 1.0, {operand}), {b_tile}, ln_wsum{precision})")

    def finish(self, acc: str) -> None:
        """After the k loop of a deferred kernel: the accumulator of the raw rows, normalized."""
        if not self.deferred:
            return
        with self.w.block("if SPLIT == 1:"):
            self._rstd([(0, self.norms[0])])
            # every row of the sums of ones is W's column sums: the max picks one, exactly
            offset = "(ln0_mean - ln0_shift)" if self.norms[0].op.center else "(-ln0_shift)"  # an RMS norm's rows keep their mean
            self.w.emit(f"{acc} = ({acc} - {offset}[:, None] * tl.max(ln_wsum, 0)[None, :]) * ln0_rstd[:, None]")

    def _chunk(self, start: str) -> None:
        w = self.w
        w.emit(f"ln_in_row = rk[None, :] < {self.k}")
        w.emit(f"ln_seen = {start} * 1.0")
        w.emit("ln_count = tl.sum(ln_in_row.to(tl.float32))")

    @staticmethod
    def _centered(ln: Instruction, x: str, mean: str) -> str:
        """`x` less its row's mean; as it is for an RMS norm."""
        return f"({x} - {mean}[:, None])" if ln.op.center else f"({x})"

    def _rstd(self, norms: list[tuple[int, Instruction]]) -> None:
        for j, ln in norms:
            # the mean square of an RMS norm's rows: their variance plus their squared mean
            square = "" if ln.op.center else f" + ln{j}_mean * ln{j}_mean"
            self.w.emit(f"ln{j}_rstd = 1.0 / tl.sqrt(ln{j}_m2 / {self.k}.0{square} + {ln.op.attrs['epsilon']})")

    def _combine(self, name: str, x: str) -> str:
        """Fold one chunk of rows `x` into the running mean and squared deviations `name`;
        returns the chunk's mean."""
        w = self.w
        chunk = w.let(f"tl.sum(tl.where(ln_in_row, {x}, 0.0), axis=1) / ln_count", "cm")
        dev = w.let(f"tl.where(ln_in_row, {x} - {chunk}[:, None], 0.0)", "dev")
        delta = w.let(f"{chunk} - {name}_mean", "delta")
        total = w.let("ln_seen + ln_count", "total")
        w.emit(f"{name}_mean = {name}_mean + {delta} * (ln_count / {total})")
        w.emit(f"{name}_m2 = {name}_m2 + tl.sum({dev} * {dev}, axis=1) + {delta} * {delta} * (ln_seen * ln_count / {total})")
        return chunk

    def _normalized(self, ln: Instruction) -> Callable[[Tile, Index], str]:
        """The k loop's value of `ln` at a tile index: its input there, normalized by its row's
        statistics, then scaled and shifted by its gamma and beta there if it has them."""

        def value(tile: Tile, index: Index) -> str:
            mean, rstd = self.names[id(ln)]
            x = self.w.value(ln.inputs[0], tile, index)
            if not self.deferred:
                y = self.w.let(f"{self._centered(ln, x, mean)} * {rstd}[:, None]")
                if len(ln.inputs) == 3:
                    gamma, beta = (self.w.value(p, tile, index) for p in ln.inputs[1:])
                    y = self.w.let(f"{y} * {gamma} + {beta}")
                return y
            name = self.w.fresh("lna")
            with self.w.block("if SPLIT == 1:"):  # the rows less their first chunk's mean, folded into their statistics
                self._chunk("k0")
                chunk_mean = self._combine("ln0", x)
                self.w.emit(f"ln0_shift = tl.where(ln_seen == 0, {chunk_mean}, ln0_shift)")
                self.w.emit(f"{name} = {x} - ln0_shift[:, None]")
            with self.w.block("else:"):
                self.w.emit(f"{name} = {self._centered(ln, x, mean)} * {rstd}[:, None]")
            return name

        return value
