"""The row-reduction template: reductions, arg max/min, softmax and layer norm.

The input's dims split into kept dims (rows, `ro`) and reduced dims (`rr`, the op's
`reduced_axes`); a program takes a block of rows and walks the reduced dims in chunks,
lane-wise first and across lanes at the end. The op's `algorithm` picks the emitter: a plain
fold combines with one pointwise op (spelled by the scalar table), softmax and layer norm make
more passes over the row (max, then sum, then the output), each reading the input through its
prologue again (the row stays in L2), and run their epilogue inside the last pass, at the full
index.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from fusegraph.ir.dtypes import DType
from fusegraph.ir.index_expr import Const, Expr
from fusegraph.ir.index_map import delinearize
from fusegraph.ir.program import Instruction, Module
from fusegraph.targets.gpu.device import current_device
from fusegraph.targets.gpu.kernel_source import KernelSource, signature
from fusegraph.targets.gpu.kernel_writer import CodegenError, Index, KernelInputs, KernelWriter, Tile, var
from fusegraph.targets.gpu.scalar_ops import binary_rhs, fold_across, literal
from fusegraph.targets.gpu.templates.registry import lowers, prologue_movement


class Rows:
    """One reduction kernel being written: its writer, the row space, and the anchor's value
    (`out`) once an emitter has computed it."""

    def __init__(self, kernel: str, module: Module, inputs: KernelInputs, anchor: Instruction, full_output: bool) -> None:
        self.kernel, self.module, self.anchor = kernel, module, anchor
        self.x = anchor.inputs[0]
        lens = self.x.shape.lens
        axes = anchor.op.reduced_axes(len(lens))
        kept = [d for d in range(len(lens)) if d not in axes]
        self.rows = math.prod(lens[d] for d in kept)
        self.length = math.prod(lens[d] for d in axes)
        if self.length == 0 or self.rows == 0:
            raise CodegenError(f"{anchor.op.name} over an empty tensor")
        self.full_index, self.red_index = _indices(lens, kept, axes, self.rows, self.length)
        self.full_output = full_output
        self.out = ""
        self.out_index: Index | None = None  # where `out` is, when an emitter stores several values a row
        self.w = KernelWriter(module, inputs, {id(anchor): self._anchor_value})
        prologue_movement(self.w, module)
        # float64 data, and integers (exact below 2**53), accumulate in float64; the rest in float32
        floats = (DType.float32, DType.float16, DType.bfloat16, DType.bool)
        self.acc_t = "tl.float32" if self.x.shape.dtype in floats else "tl.float64"
        self.row_bound = f"(ro[:, None] < {self.rows})" if self.rows > 1 else None

    def _anchor_value(self, tile: Tile, index: Index) -> str:
        want = self.out_index or (self.full_index if self.full_output else self.red_index)
        if index != want:
            raise CodegenError(f"the epilogue of {self.kernel} reads the {self.anchor.op.name} at another index")
        return self.out

    @contextmanager
    def chunk(self) -> Iterator[tuple[Tile, str]]:
        """A loop over the reduced dims; yields the chunk's tile and its mask."""
        bound = f"(rr[None, :] < {self.length})"
        with self.w.block(f"for r0 in range(0, {self.length}, BR):"):
            self.w.emit("rr = r0 + tl.arange(0, BR)")
            tile = Tile({"ro": "ro[:, None]", "rr": "rr[None, :]"}, {"ro": self.row_bound, "rr": bound})
            yield tile, " & ".join(m for m in (self.row_bound, bound) if m)

    def load_x(self, tile: Tile) -> str:
        return self.w.let(f"{self.w.value(self.x, tile, self.full_index)}.to({self.acc_t})")

    def lanes(self, init: str, update: Callable[[str, str, str], str]) -> str:
        """A per-lane accumulator over one pass of the row: `update(acc, x, mask)` gives its next value."""
        acc = self.w.let(f"tl.full([BO, BR], {init}, {self.acc_t})", "lane")
        with self.chunk() as (tile, mask):
            self.w.emit(f"{acc} = {update(acc, self.load_x(tile), mask)}")
        return acc

    def fold(self, combine: str, identity: str, value: Callable[[str], str] = lambda v: v) -> str:
        """One pass folding `value(x)` with pointwise op `combine`; the code of each row's result."""
        acc = self.lanes(identity, lambda a, v, m: binary_rhs(combine, a, f"tl.where({m}, {value(v)}, {identity})"))
        return fold_across(combine, acc, 1)

    def row_tile(self) -> Tile:
        """The tile of this program's rows alone: where a row's results are stored."""
        return Tile({"ro": "ro"}, {"ro": f"(ro < {self.rows})" if self.rows > 1 else None})

    def store(self, tile: Tile, index: Index) -> None:
        for ret in self.module.returns:  # the group's value, then its further outputs
            self.w.store(ret, tile, index)


def _indices(lens: tuple[int, ...], kept: list[int], axes: tuple[int, ...], rows: int, length: int) -> tuple[Index, Index]:
    """The input's index in terms of `ro` and `rr`, and the reduced output's (reduced dims 0)."""
    outer = delinearize(var("ro", rows), [lens[d] for d in kept]) if kept else ()
    red = delinearize(var("rr", length), [lens[d] for d in axes])
    full: list[Expr] = [Const(0)] * len(lens)
    reduced: list[Expr] = [Const(0)] * len(lens)
    for d, e in zip(kept, outer):
        full[d] = reduced[d] = e
    for d, e in zip(axes, red):
        full[d] = e
    return tuple(full), tuple(reduced)


@dataclass(frozen=True)
class _Algorithm:
    emit: Callable[[Rows], None]
    full_output: bool  # one output per input element, stored by the emitter inside its last pass


ALGORITHMS: dict[str, _Algorithm] = {}


def algorithm(name: str, full_output: bool = False) -> Callable[[Callable[[Rows], None]], Callable[[Rows], None]]:
    """Decorator registering the emitter of reductions whose `op.algorithm` is `name`."""

    def deco(fn: Callable[[Rows], None]) -> Callable[[Rows], None]:
        ALGORITHMS[name] = _Algorithm(fn, full_output)
        return fn

    return deco


@algorithm("fold")
def _fold(r: Rows) -> None:
    red = r.anchor.op.reduction
    total = r.w.let(r.fold(red.combine, literal(red.identity)))
    r.out = r.w.let(binary_rhs(red.finalize, total, f"{r.length}.0")) if red.finalize else total


@algorithm("arg")
def _arg(r: Rows) -> None:
    a, w = r.anchor.op.attrs, r.w
    big = "float('-inf')" if a["largest"] else "float('inf')"
    better = ">" if a["largest"] else "<"
    if a["select_last_index"]:
        better += "="
    best = w.let(f"tl.full([BO, BR], {big}, {r.acc_t})", "lane")
    where = w.let(f"tl.full([BO, BR], {r.length}, tl.int64)", "lane")
    with r.chunk() as (tile, mask):
        v = r.load_x(tile)
        take = w.let(f"({v} {better} {best}) & {mask}")
        w.emit(f"{best} = tl.where({take}, {v}, {best})")
        w.emit(f"{where} = tl.where({take}, rr[None, :].to(tl.int64) + 0 * {where}, {where})")
    top = w.let(f"tl.{'max' if a['largest'] else 'min'}({best}, 1)")
    pick = "max" if a["select_last_index"] else "min"
    fill = "-1" if a["select_last_index"] else str(r.length)
    r.out = w.let(f"tl.{pick}(tl.where({best} == {top}[:, None], {where}, {fill}), 1)")


@algorithm("softmax", full_output=True)
def _softmax(r: Rows) -> None:
    w = r.w
    m = w.let(r.fold("max", "float('-inf')"))
    w.emit(f"{m} = tl.where({m} == float('-inf'), 0.0, {m})")
    s = w.let(r.fold("add", "0.0", lambda v: f"tl.exp({v} - {m}[:, None])"))
    with r.chunk() as (tile, _):
        v = r.load_x(tile)
        if r.anchor.op.attrs["log"]:
            r.out = w.let(f"{v} - {m}[:, None] - tl.log({s})[:, None]")
        else:
            r.out = w.let(f"tl.exp({v} - {m}[:, None]) / {s}[:, None]")
        r.store(tile, r.full_index)


def _mean(r: Rows) -> str:
    return r.w.let(binary_rhs("div", r.fold("add", "0.0"), f"{r.length}.0"))


def _statistics(r: Rows) -> tuple[str, str]:
    """Each row's mean (zero without `center`) and 1 / sqrt(var + eps): two passes, the second
    over the deviations from the first's mean, so no `E[x^2] - E[x]^2` cancellation."""
    w = r.w
    mean = _mean(r) if r.anchor.op.center else w.let(f"tl.zeros([BO], dtype={r.acc_t})")
    squares = r.fold("add", "0.0", lambda v: f"({v} - {mean}[:, None]) * ({v} - {mean}[:, None])")
    return mean, w.let(f"1.0 / tl.sqrt({squares} / {r.length}.0 + {r.anchor.op.attrs['epsilon']})")


@algorithm("row_stat")
def _row_stat(r: Rows) -> None:
    r.out = _mean(r) if r.anchor.op.stat == "mean" else _statistics(r)[1]


@algorithm("row_moments", full_output=True)
def _row_moments(r: Rows) -> None:
    """Each row's mean and 1 / sqrt(var + eps), stored at 0 and 1 along the first reduced axis
    (`RowMoments`): two stores of the row's result, so the emitter makes them itself."""
    first = r.anchor.op.attrs["axis"]
    for k, value in enumerate(_statistics(r)):
        r.out, r.out_index = value, tuple(Const(k) if d == first else e for d, e in enumerate(r.red_index))
        r.store(r.row_tile(), r.out_index)


@algorithm("layernorm", full_output=True)
def _layernorm(r: Rows) -> None:
    w = r.w
    mean, rstd = _statistics(r)
    with r.chunk() as (tile, _):
        v = r.load_x(tile)
        affine = ""
        if len(r.anchor.inputs) == 3:  # unless folded into the weights of its readers (`fold_norm_affine`)
            scale = w.value(r.anchor.inputs[1], tile, r.full_index)
            bias = w.value(r.anchor.inputs[2], tile, r.full_index)
            affine = f" * {scale} + {bias}"
        r.out = w.let(f"({v} - {mean}[:, None]) * {rstd}[:, None]{affine}")
        r.store(tile, r.full_index)


@lowers("reduction")
def reduction_kernel(name: str, kernel: str, module: Module, inputs: KernelInputs, anchor: Instruction,
                     allow_tf32: bool = False, interpret: bool = False) -> KernelSource:
    """The reduction kernel of `anchor`'s group (the product options do not apply)."""
    alg = ALGORITHMS.get(anchor.op.algorithm)
    if alg is None:
        raise CodegenError(f"no reduction template for {anchor.op.name} (algorithm {anchor.op.algorithm!r})")
    r = Rows(kernel, module, inputs, anchor, alg.full_output)
    r.w.emit("ro = tl.program_id(0) * BO + tl.arange(0, BO)")
    alg.emit(r)
    if not alg.full_output:
        r.store(r.row_tile(), r.red_index)
    args = r.w.arg_list()
    body = signature(name, args, ["BO", "BR"]) + "\n" + "\n".join(r.w.lines) + "\n"
    return KernelSource(name, kernel, "reduction", body, args, _configs(r.rows, r.length), [(r.rows, "BO", None)])


# Below this many elements a reduction takes its launch's time however its rows are spread,
# so it builds no candidate for spreading them (an SE block's pooled vectors).
SPREAD_MIN_ELEMENTS = 1 << 16


# Rows at least this long (a GroupNorm's group: 10240 to 40960 elements in a diffusion UNet)
# also try chunks of half of it under 8 warps: each program walks its row in 1024-element trips
# otherwise, one load in flight at a time, twice over for the two statistics.
LONG_ROW = 8192


def _configs(rows: int, length: int) -> list[dict[str, int]]:
    """Row blocks of about 4096 elements, then half-width chunks of twice the rows; and, where
    those blocks leave multiprocessors idle, the most rows a program that still give each one
    a program (one row at worst): BERT-base's layernorms at batch 1 are 128 rows of 768, which
    blocks of four rows spread over 32 programs; long rows, wider chunks. The tune picks."""
    br = max(16, min(1024, 1 << (length - 1).bit_length()))
    bo = max(1, min(1 << (rows - 1).bit_length() if rows > 1 else 1, 4096 // br))
    configs = [{"BO": bo, "BR": br, "num_warps": 4, "num_stages": 1}]
    if br > 128:
        configs.append({"BO": max(1, min(bo * 2, 8192 // (br // 2))), "BR": br // 2, "num_warps": 4, "num_stages": 1})
    spread = _spread_rows(rows, bo)
    if spread < bo and rows * length >= SPREAD_MIN_ELEMENTS:
        configs.append({"BO": spread, "BR": br, "num_warps": 4, "num_stages": 1})
    if length >= LONG_ROW:  # four times the chunk, twice the warps: a quarter of the trips
        configs.append({"BO": min(spread, 2), "BR": LONG_ROW // 2, "num_warps": 8, "num_stages": 1})
    return configs


def _spread_rows(rows: int, bo: int) -> int:
    """The largest power of two up to `bo` rows a program that still gives every multiprocessor
    a program, or 1."""
    sms = current_device().sm_count
    while bo > 1 and -(-rows // bo) < sms:
        bo //= 2
    return bo
