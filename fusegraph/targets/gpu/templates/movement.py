"""Per-element data movement for the flat template: concat, pad and the gathers.

Each output element finds where it comes from: which concat input (a domain per input),
which padded position (a range check, or a clamped/reflected index), which gathered row
(an index read from the indices tensor at run time, then used as an index variable; GatherND
reads one such variable per indexed axis).
"""

from __future__ import annotations

from fusegraph.ir.index_expr import Const, Expr
from fusegraph.ir.program import Instruction
from fusegraph.ops.gather import GatherElements, GatherND
from fusegraph.ops.movement import Concat, Gather, Pad
from fusegraph.targets.gpu.errors import CodegenError
from fusegraph.targets.gpu.kernel_writer import Index, KernelWriter, Tile, var
from fusegraph.targets.gpu.scalar_ops import literal
from fusegraph.targets.gpu.templates.registry import emits


@emits(Concat)
def emit_concat(w: KernelWriter, ins: Instruction, tile: Tile, index: Index) -> str:
    axis = ins.op.attrs["axis"]
    result = None
    offset = 0
    for x in ins.inputs:
        n = x.shape.lens[axis]
        if n == 0:
            continue
        e = index[axis] - offset
        conds = tuple(tile.range_conds(e, 0, n))
        v = w.value(x, tile, (*index[:axis], e, *index[axis + 1:]), conds)
        result = v if result is None else w.let(f"tl.where({' & '.join(conds)}, {v}, {result})")
        offset += n
    if result is None:
        raise CodegenError("concat of empty inputs")
    return result


def _dynamic(w: KernelWriter, tile: Tile, code: str, extent: int) -> tuple[Tile, Expr]:
    """An index variable whose value is computed at run time (`code`), in range [0, extent)."""
    name = w.let(code, "ix")
    v = var(name, extent)
    names = dict(tile.names)
    names[name] = name
    return Tile(names, dict(tile.bounds)), v


@emits(Pad)
def emit_pad(w: KernelWriter, ins: Instruction, tile: Tile, index: Index) -> str:
    a = ins.op.attrs
    (x,) = ins.inputs
    X = x.shape.lens
    r = len(X)
    pads = a["pads"]
    src = [index[d] - pads[d] for d in range(r)]
    if a["mode"] == "constant":
        conds: list[str] = []
        for d in range(r):
            conds += tile.range_conds(src[d], 0, X[d])
        v = w.value(x, tile, tuple(src), tuple(conds))
        return w.let(f"tl.where({' & '.join(conds)}, {v}, {literal(a['value'])})") if conds else v
    if any(p < 0 for p in pads):
        raise CodegenError(f"pad mode {a['mode']} with negative pads has no GPU template")
    cur = tile
    idx: list[Expr] = []
    for d in range(r):
        if not tile.range_conds(src[d], 0, X[d]):
            idx.append(src[d])
            continue
        c, n = tile.code(src[d]), X[d]
        if a["mode"] == "edge":
            code = f"tl.minimum(tl.maximum({c}, 0), {n - 1})"
        elif a["mode"] == "reflect":
            code = f"{n - 1} - tl.abs({n - 1} - tl.abs({c}))" if n > 1 else f"0 * {c}"
        else:  # wrap
            code = f"(({c} % {n}) + {n}) % {n}"
        cur, v = _dynamic(w, cur, code, n)
        idx.append(v)
    return w.value(x, cur, tuple(idx))


@emits(Gather)
def emit_gather(w: KernelWriter, ins: Instruction, tile: Tile, index: Index) -> str:
    axis = ins.op.attrs["axis"]
    data, indices = ins.inputs
    q = indices.shape.ndim
    n = data.shape.lens[axis]
    g = w.value(indices, tile, tuple(index[axis:axis + q]))
    cur, v = _dynamic(w, tile, f"tl.where({g} < 0, {g} + {n}, {g}).to(tl.int32)", n)
    return w.value(data, cur, (*index[:axis], v, *index[axis + q:]))


def _read_index(w: KernelWriter, tile: Tile, indices: Instruction, at: Index, n: int) -> tuple[Tile, Expr]:
    """The index stored in `indices` at `at`, negatives counted from the end of an axis of `n`."""
    g = w.value(indices, tile, at)
    return _dynamic(w, tile, f"tl.where({g} < 0, {g} + {n}, {g}).to(tl.int32)", n)


@emits(GatherElements)
def emit_gather_elements(w: KernelWriter, ins: Instruction, tile: Tile, index: Index) -> str:
    axis = ins.op.attrs["axis"]
    data, indices = ins.inputs
    cur, v = _read_index(w, tile, indices, index, data.shape.lens[axis])
    return w.value(data, cur, (*index[:axis], v, *index[axis + 1:]))


@emits(GatherND)
def emit_gather_nd(w: KernelWriter, ins: Instruction, tile: Tile, index: Index) -> str:
    b = ins.op.attrs["batch_dims"]
    data, indices = ins.inputs
    k = indices.shape.lens[-1]
    q = indices.shape.ndim - 1
    cur, picked = tile, []
    for j in range(k):
        cur, v = _read_index(w, cur, indices, (*index[:q], Const(j)), data.shape.lens[b + j])
        picked.append(v)
    return w.value(data, cur, (*index[:b], *picked, *index[q:]))
