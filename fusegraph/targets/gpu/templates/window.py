"""Per-element window loops for the flat template: pooling and local response normalization.

Each output element loops over its window; the input is read through its prologue at
`o * stride - pad + k * dilation`, and positions in the padding neither load nor count.
"""

from __future__ import annotations

import math

from fusegraph.ir.index_expr import Expr
from fusegraph.ir.index_map import delinearize
from fusegraph.ir.program import Instruction
from fusegraph.ops.anchors import Pooling
from fusegraph.ops.movement import LRN
from fusegraph.targets.gpu.kernel_writer import Index, KernelWriter, Tile, var
from fusegraph.targets.gpu.templates.registry import emits


def _range_conds(tile: Tile, checks: list[tuple[Expr, int, int]]) -> list[str]:
    return [c for e, lo, hi in checks for c in tile.range_conds(e, lo, hi)]


def _window_tile(outer: Tile, loop_var: str) -> Tile:
    names = dict(outer.names)
    names[loop_var] = loop_var
    return Tile(names, dict(outer.bounds))


@emits(Pooling)
def emit_pooling(w: KernelWriter, pool: Instruction, tile: Tile, index: Index) -> str:
    a = pool.op.attrs
    (x,) = pool.inputs
    X = x.shape.lens
    lens = a["lengths"]
    r = len(lens)
    total = math.prod(lens)
    kw = var(w.fresh("kw"), total)
    kk = delinearize(kw, lens)
    spatial = [index[2 + j] * a["stride"][j] - a["padding"][j] + kk[j] * a["dilation"][j] for j in range(r)]
    inner = _window_tile(tile, kw.name)
    valid = _range_conds(inner, [(spatial[j], 0, X[2 + j]) for j in range(r)])
    is_max = a["mode"] == "max"
    acc = w.fresh("pacc")
    shape = "[XBLOCK]"
    w.emit(f"{acc} = tl.full({shape}, float('-inf'), tl.float32)" if is_max else f"{acc} = tl.zeros({shape}, tl.float32)")
    cnt = None
    if not is_max:
        cnt = w.fresh("pcnt")
        w.emit(f"{cnt} = tl.zeros({shape}, tl.float32)")
    with w.block(f"for {kw.name} in range({total}):"):
        v = w.value(x, inner, (index[0], index[1], *spatial), tuple(valid))
        ok = " & ".join(valid) if valid else None
        if is_max:
            w.emit(f"{acc} = tl.maximum({acc}, tl.where({ok}, {v}, float('-inf')))" if ok else f"{acc} = tl.maximum({acc}, {v})")
        else:
            w.emit(f"{acc} += tl.where({ok}, {v}, 0.0)" if ok else f"{acc} += {v}")
            if a["count_include_pad"]:
                # the padding counts, the ceil-mode overhang past it does not
                pad_end = [X[2 + j] + a["padding"][r + j] for j in range(r)]
                inc = _range_conds(inner, [(spatial[j], -a["padding"][j], pad_end[j]) for j in range(r)])
            else:
                inc = valid
            w.emit(f"{cnt} += tl.where({' & '.join(inc)}, 1.0, 0.0)" if inc else f"{cnt} += 1.0")
    return acc if is_max else w.let(f"{acc} / {cnt}")


@emits(LRN)
def emit_lrn(w: KernelWriter, lrn: Instruction, tile: Tile, index: Index) -> str:
    a = lrn.op.attrs
    (x,) = lrn.inputs
    C = x.shape.lens[1]
    lo = (a["size"] - 1) // 2
    kw = var(w.fresh("kw"), a["size"])
    inner = _window_tile(tile, kw.name)
    c = index[1] - lo + kw
    valid = _range_conds(inner, [(c, 0, C)])
    center = w.value(x, tile, index)
    acc = w.fresh("sq")
    w.emit(f"{acc} = tl.zeros([XBLOCK], tl.float32)")
    with w.block(f"for {kw.name} in range({a['size']}):"):
        v = w.value(x, inner, (index[0], c, *index[2:]), tuple(valid))
        w.emit(f"{acc} += tl.where({' & '.join(valid)}, {v} * {v}, 0.0)" if valid else f"{acc} += {v} * {v}")
    return w.let(f"{center} / libdevice.pow({a['bias']} + {a['alpha'] / a['size']} * {acc}, {a['beta']})")
