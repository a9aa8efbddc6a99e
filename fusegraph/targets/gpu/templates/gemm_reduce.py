"""Reductions inside a GEMM epilogue: across a tile's columns (`segment_softmax`,
`segment_reduce`, `segment_layernorm`), over each
sample's pixels of a convolution or of a product over rows of pixels (`epilogue_sum`, the
squeeze of an SE block, a global mean after a last linear layer), and a row's statistics
over all its column tiles (`epilogue_row_stat`, for the deferred layernorm of the next product).

The pass (`passes/reduction_epilogue.py`) lets a softmax join a product's epilogue when each
of its runs is an aligned run of L output channels; the template then makes the N tile one run
(L padded to a power of two, as for a channel period: `split_by_period`), so a row of the
accumulator tile is one whole run. The max and the sum are taken along the tile's columns in
the accumulator's type (fp32 for half inputs), with the padding lanes left out.

A pixel sum spans many row tiles. Each program adds its tile's rows per sample (a tile of BM
rows meets at most SLOTS = (BM - 1) // P + 2 samples of P pixels) and stores the parts into
its own slots of a float32 scratch `part` [row tile, slot, channel]; a counter per column
block (`pcnt`) finds the last program, which loads the parts of each sample past L1,
PART_ROWS row tiles at a time into a [PART_ROWS, BN] sum, adds that across its rows once,
stores the sum or mean and clears the counter. Under split-k only the program that finishes a
tile (`owner`) adds its rows, once their sums are whole. As with split-k's partial sums
(`gemm_emit.split_k_fixup`), no float atomics: the order of the sum never depends on which
program ran first, so two runs give the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fusegraph.ir.index_expr import substitute
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import is_store
from fusegraph.targets.gpu.errors import CodegenError
from fusegraph.targets.gpu.kernel_source import KernelSource, cdiv
from fusegraph.targets.gpu.kernel_writer import TRITON_TYPES, Index, KernelWriter, Tile, var
from fusegraph.targets.gpu.scalar_ops import compute_type, fold_across


def run_length(module: Module) -> int:
    """The run length of the group's reductions across the tile (0: none)."""
    lengths = {ins.op.attrs["length"] for ins in module if ins.op.algorithm in SEGMENT_EMITTERS}
    if len(lengths) > 1:
        raise CodegenError(f"reductions over runs of {sorted(lengths)} channels in one epilogue; one tile width fits one")
    return lengths.pop() if lengths else 0


def emit_segment_softmax(w: KernelWriter, ins: Instruction, tile: Tile, index: Index, mask: tuple[str, ...],
                         width: str) -> str:
    """The softmax of `ins`'s input over each row of the [BM, width] tile, whose valid columns
    are one run: padding columns (past the run) count as -inf, so they add nothing."""
    x = w.let(f"tl.broadcast_to({w.value(ins.inputs[0], tile, index, mask)}, [BM, {width}])")
    cols = tile.bounds.get("rn")
    masked = w.let(f"tl.where({cols}, {x}, float('-inf'))") if cols else x
    top = w.let(f"tl.max({masked}, 1)[:, None]")
    w.emit(f"{top} = tl.where({top} == float('-inf'), 0.0, {top})")  # a row of -inf: as the reference
    e = w.let(f"tl.exp({masked} - {top})")
    total = w.let(f"tl.sum({e}, 1)[:, None]")
    if ins.op.attrs["log"]:
        return w.let(f"{x} - {top} - tl.log({total})")
    return w.let(f"{e} / {total}")


def emit_segment_reduce(w: KernelWriter, ins: Instruction, tile: Tile, index: Index, mask: tuple[str, ...],
                        width: str) -> str:
    """The fold of `ins`'s input over each row of the [BM, width] tile (one run), padding
    columns at the fold's identity."""
    a = ins.op.attrs
    x = w.let(f"tl.broadcast_to({w.value(ins.inputs[0], tile, index, mask)}, [BM, {width}])")
    cols = tile.bounds.get("rn")
    identity = {"add": "0.0", "max": "float('-inf')", "min": "float('inf')"}[a["combine"]]
    masked = w.let(f"tl.where({cols}, {x}, {identity})") if cols else x
    total = w.let(f"{fold_across(a['combine'], masked, 1)}[:, None]")
    return w.let(f"{total} / {a['length']}.0") if a["finalize"] == "div" else total


def emit_segment_layernorm(w: KernelWriter, ins: Instruction, tile: Tile, index: Index, mask: tuple[str, ...],
                           width: str) -> str:
    """The layernorm (or RMS norm) of `ins`'s input over each row of the [BM, width] tile (one
    run): mean and variance (the mean square) in float32 over the valid columns, two passes
    over the row held in registers (no `E[x^2] - E[x]^2` cancellation), then the affine when
    scale and bias are inputs."""
    a = ins.op.attrs
    x = w.let(f"tl.broadcast_to({w.value(ins.inputs[0], tile, index, mask)}, [BM, {width}]).to(tl.float32)")
    cols = tile.bounds.get("rn")
    valid = w.let(f"tl.where({cols}, {x}, 0.0)") if cols else x
    if a["center"]:
        mean = w.let(f"(tl.sum({valid}, 1) / {a['length']}.0)[:, None]")
        dev = w.let(f"tl.where({cols}, {x} - {mean}, 0.0)" if cols else f"{x} - {mean}")
    else:  # an RMS norm: the rows as they are
        dev = valid
    rstd = w.let(f"(1.0 / tl.sqrt(tl.sum({dev} * {dev}, 1) / {a['length']}.0 + {a['epsilon']}))[:, None]")
    y = w.let(f"{dev} * {rstd}")
    if len(ins.inputs) == 3:
        scale, bias = (w.value(p, tile, index, mask) for p in ins.inputs[1:])
        y = w.let(f"{y} * {scale} + {bias}")
    return y


# how each reduction across the tile's columns is written, by its op's algorithm
SEGMENT_EMITTERS = {"segment_softmax": emit_segment_softmax, "segment_reduce": emit_segment_reduce,
                    "segment_layernorm": emit_segment_layernorm}


@dataclass(frozen=True)
class TileNames:
    """How a template names a tile's row and column variables, their block sizes, the row
    block's program index, the column block's index over the whole grid and the other
    variables its output index may name."""

    row: str
    col: str
    row_block: str
    col_block: str
    row_program: str
    column: str
    fixed: tuple[tuple[str, str], ...]


GEMM_TILE = TileNames("rm", "rn", "BM", "BN", "pid_m", "gz * tl.num_programs(1) + pid_n", (("gz", "gz"), ("nq", "pid_n")))


@dataclass(frozen=True)
class PixelSums:
    """The shape of a kernel's pixel sums: its rows (samples x pixels), the pixels per sample
    and the output channels, the anchor's channel axis (1 for a convolution's N, C, pixels...;
    the last for a product's N, pixels..., C) and the names of the template's tile."""

    rows: int
    pixels: int
    channels: int
    names: TileNames = GEMM_TILE
    channel_axis: int = 1

    def slots(self, bm: str | int) -> str:
        return f"(({bm} - 1) // {self.pixels} + 2)"

    def workspace(self, src: KernelSource, config: dict[str, int]) -> tuple[int, int]:
        """The parts (float32 elements) and counters the sums need under `config`."""
        columns = 1
        for extent, block, _ in src.grid_dims[1:]:
            columns *= cdiv(extent, config[block]) if block else extent
        bm = config[self.names.row_block]
        return cdiv(self.rows, bm) * ((bm - 1) // self.pixels + 2) * self.channels, columns


def pixel_sum_returns(module: Module) -> list[Instruction]:
    """The group's stored values that are sums over the pixels (stored by `emit_pixel_sums`)."""
    return [r for r in module.returns if is_store(r) and r.inputs[1].op.algorithm == "epilogue_sum"]


def emit_pixel_sums(w: KernelWriter, ret: Instruction, te: Tile, out_index: Index, sums: PixelSums,
                    codes: dict[int, str]) -> None:
    """Add the tile's rows per sample into `part`; the last row tile of the column block adds
    the parts in order and stores the result through `ret`'s map (see the module docstring).
    `codes` receives the result's code for the tile the store reads it on."""
    t = sums.names
    bm, p = t.row_block, sums.pixels
    x = w.value(ret.inputs[1].inputs[0], te, out_index)
    valid = te.conjunction(te.mask_for(te.dims))
    v = w.let(f"tl.where({valid}, tl.broadcast_to({x}, [{bm}, {t.col_block}]), 0.0)")
    chan, cols, n, slots = te.code(out_index[sums.channel_axis]), te.bounds[t.col], sums.channels, sums.slots(bm)
    keep = f", mask={cols}" if cols else ""
    samples = sums.rows // p

    def store_sums(total: str) -> None:  # each sample's sum, `total` its code, through ret's map
        tm = Tile({t.col: te.names[t.col], **dict(t.fixed), "sn": "sn"}, {t.col: cols})
        codes[id(tm)] = f"({total} / {p}.0)" if ret.inputs[1].op.attrs["mean"] else total
        w.store(ret, tm, tuple(substitute(e, {t.row: var("sn", samples) * p}, check=False) for e in out_index))

    with w.block(f"if {bm} >= {sums.rows}:"):  # one row tile holds every sample whole: no parts, no rendezvous
        with w.block(f"for sn in range({samples}):"):
            w.emit(f"tot = tl.sum(tl.where(({t.row}[:, None] // {p}) == sn, {v}, 0.0), 0)[None, :]")
            store_sums("tot")
    with w.block("else:"):
        _pixel_sum_parts(w, t, v, p, chan, cols, keep, n, slots, samples, store_sums)


# Tiles whose parts the last program loads per trip: row tiles of a pixel sum (`_pixel_sum_parts`,
# a [PART_ROWS, BN] float32 block, 32 registers a thread at 256 columns and four warps) and
# column blocks of a row's statistics (`_rendezvous`, [PART_ROWS, BM]).
PART_ROWS = 16


def _pixel_sum_parts(w: KernelWriter, t: TileNames, v: str, p: int, chan: str, cols: str | None, keep: str, n: int,
                     slots: str, samples: int, store_sums: Callable[[str], None]) -> None:
    """Each program's parts per sample into `part`; the last row tile of the column block adds
    them, PART_ROWS tiles a load, and stores the sums (`store_sums`), then clears the counter."""
    bm = t.row_block
    w.emit(f"s0 = {t.row_program} * {bm} // {p}")
    with w.block(f"for j in tl.static_range({slots}):"):
        w.emit(f"pj = tl.sum(tl.where(({t.row}[:, None] // {p}) == s0 + j, {v}, 0.0), 0)[None, :]")
        w.emit(f"tl.store(part + ({t.row_program} * {slots} + j) * {n} + {chan}, pj{keep})")
    w.emit("tl.debug_barrier()")  # every thread's parts are out before the count says so
    w.emit(f"col = {t.column}")
    w.emit('seen = tl.atomic_add(pcnt + col, 1, sem="acq_rel")')
    with w.block("if seen == tl.num_programs(0) - 1:"):
        with w.block(f"for sn in range({samples}):"):
            w.emit(f"acc_parts = tl.zeros([{PART_ROWS}, {t.col_block}], dtype=tl.float32)")
            w.emit(f"t_end = ((sn + 1) * {p} - 1) // {bm} + 1")
            # PART_ROWS row tiles' parts a trip, in one load: a trip per tile would wait out an L2
            # round trip each (hundreds of tiles on a large map); summed across once, after the loop
            with w.block(f"for t0 in range(sn * {p} // {bm}, t_end, {PART_ROWS}):"):
                w.emit(f"t = t0 + tl.arange(0, {PART_ROWS})[:, None]")
                ptr = f"part + (t * {slots} + sn - t * {bm} // {p}) * {n} + {chan}"
                mask = f"(t < t_end) & {cols}" if cols else "(t < t_end)"
                # past L1: the parts were stored by other programs, maybe on other SMs
                w.emit(f'acc_parts += tl.load({ptr}, mask={mask}, other=0.0, cache_modifier=".cg")')
            w.emit("tot = tl.sum(acc_parts, 0)[None, :]")
            store_sums("tot")
        w.emit("tl.atomic_xchg(pcnt + col, 0)")


@dataclass(frozen=True)
class RowParts:
    """The shape of a product kernel's row statistics (`epilogue_row_stat`): `n` output
    channels, the whole of each row, in column tiles of BN over a grid of (row blocks, column
    blocks, batch)."""

    n: int

    def workspace(self, src: KernelSource, config: dict[str, int]) -> tuple[int, int]:
        """Each program's mean and squared deviations per row (2 x BM float32), one counter
        per row block."""
        (m, _, _), (n, _, _), (batch, _, _) = src.grid_dims
        row_blocks = cdiv(m, config["BM"]) * batch
        return row_blocks * cdiv(n, config["BN"]) * 2 * config["BM"], row_blocks


def row_stat_returns(module: Module) -> list[Instruction]:
    """The group's stored values that are its rows' statistics (stored by `emit_row_stats`)."""
    return [r for r in module.returns if is_store(r) and r.inputs[1].op.algorithm == "epilogue_row_stat"]


def _row_values(w: KernelWriter, rets: list[Instruction], te: Tile, out_index: Index, shape: str) -> tuple[str, str]:
    """The tile of the one value whose rows `rets` take statistics of, as its readers read it
    (rounded to its stored type), zero off the tile's valid lanes, and that mask."""
    values = {id(r.inputs[1].inputs[0]): r.inputs[1].inputs[0] for r in rets}
    if len(values) != 1:
        raise CodegenError("row statistics of two values in one epilogue; one epilogue takes those of one value")
    value = next(iter(values.values()))
    x = w.value(value, te, out_index)
    stored = value.shape.dtype
    if compute_type(stored) != stored:  # the rows as stored, which is what the norm's readers read
        x = f"{x}.to({TRITON_TYPES[stored]}).to({TRITON_TYPES[compute_type(stored)]})"
    valid = te.conjunction(te.mask_for(te.dims))
    return w.let(f"tl.where({valid}, tl.broadcast_to({x}, {shape}), 0.0)"), valid


def _store_row_stats(w: KernelWriter, rets: list[Instruction], rows: Callable[[], Tile], mean: str, m2: str, n: int,
                     out_index: Index, codes: dict[int, str]) -> None:
    """Each of `rets` from a row's mean and squared deviations over its `n` columns: the mean,
    or 1 / sqrt(var + eps) (an RMS norm's mean square for a norm that does not center), stored
    through its map on a fresh tile of rows (`rows`)."""
    for ret in rets:
        a = ret.inputs[1].op.attrs
        tile = rows()
        if a["stat"] == "mean":
            codes[id(tile)] = mean
        else:
            square = "" if a["center"] else f" + {mean} * {mean}"
            codes[id(tile)] = w.let(f"1.0 / tl.sqrt({m2} / {n}.0{square} + {a['epsilon']})")
        w.store(ret, tile, out_index)


def emit_whole_row_stats(w: KernelWriter, rets: list[Instruction], te: Tile, out_index: Index, rows: Callable[[], Tile],
                         shape: str, n: int, codes: dict[int, str]) -> None:
    """Row statistics of a tile `shape` that holds all `n` columns of its rows (a depthwise
    convolution's tile of every channel, `reduction_epilogue.whole_rows`): the mean, then the
    squared deviations from it, both across the tile in float32; no parts, no rendezvous."""
    v, valid = _row_values(w, rets, te, out_index, shape)
    mean = w.let(f"tl.sum({v}, 1) / {n}.0")
    dev = w.let(f"tl.where({valid}, {v} - {mean}[:, None], 0.0)")
    _store_row_stats(w, rets, rows, mean, w.let(f"tl.sum({dev} * {dev}, 1)"), n, out_index, codes)


def emit_row_stats(w: KernelWriter, rets: list[Instruction], te: Tile, out_index: Index, m: int, n: int,
                   codes: dict[int, str]) -> None:
    """Each program stores its tile's per-row mean and squared deviations (an exact two-pass
    over the tile's columns) into its own slots of `part`; the last column block of a row block
    to arrive (a counter per row block, `pcnt`) combines the parts (the count-weighted mean of
    the means, then the squared deviations plus each block's count times its mean's squared
    distance from the row's: Chan's rule, all blocks at once), stores each statistic (the
    mean, 1 / sqrt(var + eps)) through its return's map and clears the counter. Under split-k
    only the program that runs a tile's epilogue takes part. As with the pixel sums, no float
    atomics: the same bits every run.
    `codes` receives each result's code for the tile its store reads it on."""
    v, valid = _row_values(w, rets, te, out_index, "[BM, BN]")
    with w.block("if owner:"):  # under split-k, the tile's last program: the one holding the sums
        _rendezvous(w, rets, v, valid, out_index, m, n, codes)


def _rendezvous(w: KernelWriter, rets: list[Instruction], v: str, valid: str, out_index: Index, m: int, n: int,
                codes: dict[int, str]) -> None:
    w.emit(f"rs_count = tl.minimum({n} - pid_n * BN, BN) * 1.0")
    mean = w.let(f"tl.sum({v}, 1) / rs_count")
    dev = w.let(f"tl.where({valid}, {v} - {mean}[:, None], 0.0)")
    w.emit("rs_block = gz * tl.num_programs(0) + pid_m")
    w.emit("rs_slot = (rs_block * tl.num_programs(1) + pid_n) * (2 * BM) + tl.arange(0, BM)")
    w.emit(f"tl.store(part + rs_slot, {mean})")
    w.emit(f"tl.store(part + rs_slot + BM, tl.sum({dev} * {dev}, 1))")
    w.emit("tl.debug_barrier()")  # every thread's parts are out before the count says so
    w.emit('rs_seen = tl.atomic_add(pcnt + rs_block, 1, sem="acq_rel")')
    with w.block("if rs_seen == tl.num_programs(1) - 1:"):
        # two passes over the column blocks' parts, PART_ROWS blocks a load: the weighted sum of
        # their means, then each block's squared deviations plus its count times its mean's
        # squared distance from the row's; a merge block by block would wait out an L2 round
        # trip per column block (12 of them over 768 columns in 64-wide tiles)
        def parts_by_block(total: str, term: str, lines: tuple[str, ...] = ()) -> None:
            """`total`: the sum over the column blocks of `term`, from their means (`rs_pm`), counts
            (`rs_n`) and what `lines` compute."""
            w.emit(f"{total} = tl.zeros([{PART_ROWS}, BM], dtype=tl.float32)")
            with w.block(f"for rs_t0 in range(0, tl.num_programs(1), {PART_ROWS}):"):
                w.emit(f"rs_t = rs_t0 + tl.arange(0, {PART_ROWS})[:, None]")
                w.emit("rs_ok = rs_t < tl.num_programs(1)")
                w.emit(f"rs_n = tl.minimum({n} - rs_t * BN, BN) * 1.0")
                w.emit("rs_at = (rs_block * tl.num_programs(1) + rs_t) * (2 * BM) + tl.arange(0, BM)[None, :]")
                # past L1: the parts were stored by other programs, maybe on other SMs
                w.emit('rs_pm = tl.load(part + rs_at, mask=rs_ok, other=0.0, cache_modifier=".cg")')
                for line in lines:
                    w.emit(line)
                w.emit(f"{total} += tl.where(rs_ok, {term}, 0.0)")

        parts_by_block("rs_sums", "rs_pm * rs_n")
        w.emit(f"rs_mean = tl.sum(rs_sums, 0) / {n}.0")
        parts_by_block("rs_devs", "rs_pq + rs_n * rs_delta * rs_delta",
                       ('rs_pq = tl.load(part + rs_at + BM, mask=rs_ok, other=0.0, cache_modifier=".cg")',
                        "rs_delta = rs_pm - rs_mean[None, :]"))
        w.emit("rs_m2 = tl.sum(rs_devs, 0)")

        def rows() -> Tile:
            return Tile({"rm": "rm", "gz": "gz", "nq": "pid_n"}, {"rm": f"(rm < {m})"})

        _store_row_stats(w, rets, rows, "rs_mean", "rs_m2", n, out_index, codes)
        w.emit("tl.atomic_xchg(pcnt + rs_block, 0)")
