"""Reductions across a GEMM tile's columns, inside the epilogue (`segment_softmax`).

The pass (`passes/reduction_epilogue.py`) lets a softmax join a product's epilogue when each
of its runs is an aligned run of L output channels; the template then makes the N tile one run
(L padded to a power of two, as for a channel period: `split_by_period`), so a row of the
accumulator tile is one whole run. The max and the sum are taken along the tile's columns in
the accumulator's type (fp32 for half inputs), with the padding lanes left out.
"""

from __future__ import annotations

from fusegraph.ir.program import Instruction, Module
from fusegraph.targets.gpu.errors import CodegenError
from fusegraph.targets.gpu.kernel_writer import Index, KernelWriter, Tile


def run_length(module: Module) -> int:
    """The run length of the group's reductions across the tile (0: none)."""
    lengths = {ins.op.attrs["length"] for ins in module if ins.op.algorithm == "segment_softmax"}
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
