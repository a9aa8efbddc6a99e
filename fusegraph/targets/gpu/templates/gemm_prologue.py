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
whose value is computed from the inputs, not from the product: `row_stores`). Where the k loop
normalizes the A tile as it loads it, that tile is the stored value at the A index, so the
programs of the first column block (`pid_n == 0`) store it as they load it: with split-k each
program walks its own k chunks and the splits together cover K, so every element is written
exactly once, in the output's type. Where the normalization waits until after the product,
the rows are stored after it too, each column block storing its share of the chunks.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

from fusegraph.ir.index_expr import Var, free_vars
from fusegraph.ir.program import Instruction, Module
from fusegraph.ir.zero_sum_columns import columns_sum_to_zero
from fusegraph.ops.base import OpKind, is_load, is_select
from fusegraph.targets.gpu.errors import switch_setting
from fusegraph.targets.gpu.kernel_writer import Index, KernelInputs, KernelWriter, Tile


# Chunks of the statistics loop in flight at once: its loads do not depend on each other, and
# the loop is pipelined as a product's k loop is, instead of waiting out each load in turn.
STATS_STAGES = 3
# Unset or "1" (the default): a deferred prologue's k loop sums each chunk's shifted rows lane
# by lane and reduces once after the loop (`RowStatistics`); "0": two reductions across the tile
# per chunk, kept to measure against (`bench/models.py --modes fusegraph,fusegraph-chunk-stats`).
# On an H100 (fp16, batch 1, bench/results/models-lane-ab-h100.md) the lane sums took
# ConvNeXt-T's 1-row classifier (layernorm over 768 -> 1000) from 12.9 to 4.9 us and ViT-S/16's
# layernorm products from 5.0 to 4.1 us (QKV) and 6.2 to 5.3 us (fc1): ViT-S/16 0.323 -> 0.295 ms.
LANE_STATS_ENV = "FUSEGRAPH_LANE_STATS"


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


def computed_from(ins: Instruction, avoiding: Instruction | None = None) -> set[int]:
    """The ids of `ins` and of every instruction it is computed from, not walking into or
    past `avoiding`."""
    stack, seen = [ins], set()
    while stack:
        x = stack.pop()
        if id(x) not in seen and x is not avoiding:
            seen.add(id(x))
            stack.extend(x.inputs)
    return seen


def _reaches(ins: Instruction, target: Instruction, avoiding: Instruction | None = None) -> bool:
    """Whether `ins` is `target` or computed from it (other than through `avoiding`)."""
    return id(target) in computed_from(ins, avoiding)


def emit_row_stores(w: KernelWriter, stores: list[Instruction], tile: Tile, index: Index, deferred: bool) -> None:
    """Inside the k loop, after the A tile: the first column block's programs store the
    prologue's values at the chunk's rows and columns (masked by the tile's bounds). A deferred
    kernel's tile holds normalized rows only under split-k (`RowStatistics.finish` stores them
    otherwise)."""
    if not stores:
        return
    with w.block("if SPLIT > 1:") if deferred else nullcontext():
        with w.block("if pid_n == 0:"):
            for ret in stores:
                w.store(ret, tile, index)


def deferrable(module: Module, anchor: Instruction, norms: list[Instruction], a_index: Index) -> bool:
    """Whether the product may normalize after the k loop (`RowStatistics`, deferred): its A is
    the one prologue layernorm itself, with an affine that is the same for every row (gamma and
    beta enter the correction as their products with W), its B a plain load (the weights, whose
    weighted column sums the kernel takes with the same tiles), and the layernorm reaches the
    group's other outputs only through the product or as stored rows (an epilogue reading the
    normalized value would need it before the correction)."""
    if len(norms) != 1 or anchor.inputs[0] is not norms[0] or not is_load(anchor.inputs[1]):
        return False
    ln = norms[0]
    stored = row_stores(module, anchor)
    if any(_reaches(r, ln, avoiding=anchor) for r in module.returns if r not in stored):
        return False
    return all(_row_free(p, a_index) for p in ln.inputs[1:])


def _row_free(ins: Instruction, index: Index) -> bool:
    """Whether `ins` at the A index reads only loads whose addresses and domains ignore the row
    (`rm`): a layernorm's gamma or beta broadcast over the rows."""
    if is_load(ins):
        m = ins.op.attrs["map"]
        exprs = list(m.apply(index, check=False)) + [x for x, _, _ in KernelWriter.domain_ranges(ins, index)]
        return not any(v.name == "rm" for e in exprs for v in free_vars(e))
    return ins.op.kind == OpKind.POINTWISE and all(_row_free(x, index) for x in ins.inputs)


def columns_vanish(module: Module, inputs: KernelInputs, norms: list[Instruction], b: Instruction, b_index: Index) -> bool:
    """Whether a deferred product may skip the column sums of W: its layernorm has no affine
    (the shift's correction is then `(mean - shift) * sum(W)`) and W is a literal read as
    [..., K, N] (k and n on its last two axes, as they are) whose every column sums to zero
    within rounding (`fold_norm_affine` stores a centered norm's weights so), where that term
    is zero."""
    if len(norms[0].inputs) != 1:
        return False
    position = next(k for k, p in enumerate(module.params.values()) if p is b.inputs[0])
    value = inputs.literals.get(position)
    if value is None:
        return False
    *lead, k, n = b.op.attrs["map"].apply(b_index, check=False)
    if not (isinstance(k, Var) and k.name == "rk" and isinstance(n, Var) and n.name == "rn"):
        return False
    if any(v.name in ("rk", "rn") for e in lead for v in free_vars(e)):
        return False
    return columns_sum_to_zero(value)


class RowStatistics:
    """Emits the statistics of the prologue's layernorms and gives their normalized values.

    Normalizing the A tile as it loads needs each row's statistics before the first product:
    a loop of their own over the row's K chunks, K/BK dependent loads before the k loop starts
    (`emit`). Deferred, for one layernorm that alone is A, the normalization moves past the
    product instead: with c any per-row shift and gamma, beta the affine,
    dot((x - mean) * rstd * gamma + beta, W)
        = rstd * (dot((x - c) * gamma, W) - (mean - c) * sum(gamma * W)) + sum(beta * W),
    so the k loop multiplies the shifted, scaled rows, folds each chunk it loaded into the
    rows' statistics and takes the weighted column sums of W with a second, 16-row product
    whose first row is gamma and second beta (ones and zeros without an affine:
    `column_sums`); after the loop the accumulator is corrected in float32 (`finish`). One pass
    over A and no loop before the product; rows the group stores are written after the
    correction, from the final statistics. The shift is each row's first chunk's mean: rows
    far from zero (a mean of 300, a spread of 1) would otherwise leave a float32 accumulator to
    cancel 300 * colsum(W) against itself. The loop folds no chunk into the statistics (unless
    `LANE_STATS_ENV`=0, which reduces each chunk across the tile as it comes): it adds the
    shifted values and their squares lane by lane into two [BM, BK] float32 sums, reduced once
    after the loop into the mean and the squared deviations (the shift, taken before the loop
    from the first chunk, keeps the squares from cancelling 300^2 against 1). Split-k programs
    see only part of K, so with SPLIT > 1 the kernel keeps the statistics loop (a constexpr
    branch: each config builds one of the two). With tf32 the shifted rows would lose bits to
    its rounding, so it is not deferred there.
    """

    def __init__(self, w: KernelWriter, norms: list[Instruction], a_index: Index, k: int, deferred: bool = False,
                 sums_vanish: bool = False) -> None:
        self.w, self.norms, self.a_index, self.k, self.deferred = w, norms, a_index, k, deferred
        self.sums = deferred and not sums_vanish  # the k loop takes W's weighted column sums
        self.lanes = deferred and switch_setting(LANE_STATS_ENV, "statistics summed lane by lane, the default",
                                                 "reduced chunk by chunk") != "0"
        self.final = False  # true while the rows are stored after a deferred product
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
            w.emit("ln0_shift = tl.zeros([BM], dtype=tl.float32)")
        if self.sums:
            w.emit("ln_wsum = tl.zeros([16, BN], dtype=tl.float32)")
            w.emit("ln_r16 = tl.arange(0, 16)")

        def chunk_tile() -> Tile:  # a fresh one per loop: loads are not shared across loops
            return Tile({"rm": "rm[:, None]", "rk": "rk[None, :]", "gz": "gz"}, {"rm": m_bound, "rk": f"(rk[None, :] < {k})"})

        with w.block("if SPLIT > 1:") if self.deferred else nullcontext():
            for loop in self._loops():
                tile = chunk_tile()
                with w.block(f"for k1 in tl.range(0, {k}, BK, num_stages={STATS_STAGES}):"):
                    w.emit("rk = k1 + tl.arange(0, BK)")
                    self._chunk("k1")
                    for j, ln in loop:
                        self._combine(f"ln{j}", w.value(ln.inputs[0], tile, self.a_index))
                self._rstd(loop)
                for j, ln in loop:  # a later loop's norm reads these
                    self.names[id(ln)] = (f"ln{j}_mean", f"ln{j}_rstd")
        if self.lanes:
            with w.block("else:"):  # the shift: the first chunk's mean (pid_k is 0); the sums start empty
                w.emit("rk = tl.arange(0, BK)")
                w.emit(f"ln_in_row = rk[None, :] < {k}")
                x = w.value(self.norms[0].inputs[0], chunk_tile(), self.a_index)
                w.emit(f"ln0_shift += tl.sum(tl.where(ln_in_row, {x}, 0.0), axis=1) / tl.sum(ln_in_row.to(tl.float32))")
                w.emit("ln0_s1 = tl.zeros([BM, BK], dtype=tl.float32)")
                w.emit("ln0_s2 = tl.zeros([BM, BK], dtype=tl.float32)")

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
        """In the k loop of a deferred kernel: add gamma * W and beta * W of the chunk's B rows
        into the weighted column sums (rows 0 and 1 of `ln_wsum`)."""
        if self.sums:
            with self.w.block("if SPLIT == 1:"):
                self.w.emit(f"ln_wsum = tl.dot(tl.broadcast_to(ln_s, [16, BK]).to({operand}), {b_tile}, ln_wsum{precision})")

    def finish(self, acc: str, m_bound: str, stores: list[Instruction]) -> None:
        """After the k loop of a deferred kernel: the accumulator of the raw rows, normalized;
        then the rows the group stores, from the final statistics: the column blocks share the
        row's chunks (one each in turn), so the extra pass over A is spread over the programs."""
        if not self.deferred:
            return
        w, ln = self.w, self.norms[0]
        with w.block("if SPLIT == 1:"):
            if self.lanes:
                w.emit("ln_t1 = tl.sum(ln0_s1, axis=1)")
                w.emit(f"ln0_mean = ln0_shift + ln_t1 / {self.k}.0")
                w.emit(f"ln0_m2 = tl.maximum(tl.sum(ln0_s2, axis=1) - ln_t1 * ln_t1 / {self.k}.0, 0.0)")
            self._rstd([(0, ln)])
            if self.sums:
                offset = "(ln0_mean - ln0_shift)" if ln.op.center else "(-ln0_shift)"  # an RMS norm's rows keep their mean
                w.emit("ln_gw = tl.sum(tl.where(ln_r16[:, None] == 0, ln_wsum, 0.0), 0)")
                beta = " + tl.sum(tl.where(ln_r16[:, None] == 1, ln_wsum, 0.0), 0)[None, :]" if len(ln.inputs) == 3 else ""
                w.emit(f"{acc} = ({acc} - {offset}[:, None] * ln_gw[None, :]) * ln0_rstd[:, None]{beta}")
            else:  # the columns of W sum to zero: so does the shift's correction
                w.emit(f"{acc} = {acc} * ln0_rstd[:, None]")
            if stores:
                self.final = True
                with w.block(f"for k1 in range(pid_n * BK, {self.k}, BK * tl.num_programs(1)):"):
                    w.emit("rk = k1 + tl.arange(0, BK)")
                    tile = Tile({"rm": "rm[:, None]", "rk": "rk[None, :]", "gz": "gz"}, {"rm": m_bound, "rk": f"(rk[None, :] < {self.k})"})
                    for ret in stores:
                        w.store(ret, tile, self.a_index)
                self.final = False

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
        statistics, then scaled and shifted by its gamma and beta there if it has them.
        Deferred (and not yet `final`), the rows less their shift, times gamma."""

        def value(tile: Tile, index: Index) -> str:
            mean, rstd = self.names[id(ln)]
            x = self.w.value(ln.inputs[0], tile, index)
            affine = [self.w.value(p, tile, index) for p in ln.inputs[1:]]  # read before the branches: both use them
            normalized = f"{self._centered(ln, x, mean)} * {rstd}[:, None]"
            if affine:
                normalized = f"{normalized} * {affine[0]} + {affine[1]}"
            if not self.deferred or self.final:
                return self.w.let(normalized)
            name = self.w.fresh("lna")
            with self.w.block("if SPLIT == 1:"):  # the rows less their first chunk's mean, folded into their statistics
                if self.lanes:
                    shifted = self.w.let(f"tl.where(rk[None, :] < {self.k}, {x} - ln0_shift[:, None], 0.0)", "sh")
                    self.w.emit(f"ln0_s1 += {shifted}")
                    self.w.emit(f"ln0_s2 += {shifted} * {shifted}")
                else:
                    self._chunk("k0")
                    chunk_mean = self._combine("ln0", x)
                    self.w.emit(f"ln0_shift = tl.where(ln_seen == 0, {chunk_mean}, ln0_shift)")
                    shifted = f"{x} - ln0_shift[:, None]"
                gamma, beta = affine or ("1.0", "0.0")
                self.w.emit(f"{name} = ({shifted}) * {gamma}" if affine else f"{name} = {shifted}")
                if self.sums:
                    # the 16 rows whose product with the B tile adds gamma * W and beta * W (gamma and beta
                    # ignore the row: `deferrable`), zero past K as their loads are
                    self.w.emit(f"ln_s = tl.where(ln_r16[:, None] == 0, {gamma}, tl.where(ln_r16[:, None] == 1, {beta}, 0.0))")
            with self.w.block("else:"):
                self.w.emit(f"{name} = {normalized}")
            return name

        return value
