"""The row-reduction template: reduce_*, arg max/min, softmax and layer norm.

The input's dims split into kept dims (rows, `ro`) and reduced dims (`rr`); a program takes
a block of rows and walks the reduced dims in chunks, lane-wise first and across lanes at
the end. Softmax and layer norm make more passes over the row (max, then sum, then the
output), each reading the input through its prologue again (the row stays in L2), and run
their epilogue inside the last pass, at the full index.
"""

from __future__ import annotations

import math
from typing import Callable

from fusegraph.ir.dtypes import DType
from fusegraph.ir.index_expr import Const, Expr
from fusegraph.ir.index_map import delinearize
from fusegraph.ir.program import Instruction, Module
from fusegraph.targets.gpu.kernel_source import KernelSource, signature
from fusegraph.targets.gpu.kernel_writer import CodegenError, Index, KernelInputs, KernelWriter, Tile, var
from fusegraph.targets.gpu.templates.registry import lowers


def _axes(op: Instruction) -> tuple[int, ...]:
    a = op.op.attrs
    rank = op.inputs[0].shape.ndim
    if op.op.name == "layernorm":
        return tuple(range(a["axis"], rank))
    if op.op.name in ("softmax", "arg_reduce"):
        return (a["axis"],)
    return tuple(a["axes"])


@lowers("reduction")
def reduction_kernel(name: str, kernel: str, module: Module, inputs: KernelInputs, anchor: Instruction,
                     allow_tf32: bool = False, interpret: bool = False) -> KernelSource:
    opname = anchor.op.name
    x = anchor.inputs[0]
    X = x.shape.lens
    axes = _axes(anchor)
    kept = [d for d in range(len(X)) if d not in axes]
    O = math.prod(X[d] for d in kept)
    R = math.prod(X[d] for d in axes)
    if R == 0 or O == 0:
        raise CodegenError(f"{opname} over an empty tensor")
    ro, rr = var("ro", O), var("rr", R)
    outer = delinearize(ro, [X[d] for d in kept]) if kept else ()
    red = delinearize(rr, [X[d] for d in axes])
    full: list[Expr] = [None] * len(X)  # type: ignore[list-item]
    reduced: list[Expr] = [None] * len(X)  # type: ignore[list-item]
    for d, e in zip(kept, outer):
        full[d] = reduced[d] = e
    for d, e in zip(axes, red):
        full[d] = e
        reduced[d] = Const(0)
    full_index, red_index = tuple(full), tuple(reduced)
    is_full_out = opname in ("softmax", "layernorm")
    results: dict[str, str] = {}

    def acc_value(tile: Tile, index: Index) -> str:
        want = full_index if is_full_out else red_index
        if index != want:
            raise CodegenError(f"the epilogue of {kernel} reads the {opname} at another index")
        return results["out"]

    w = KernelWriter(module, inputs, {id(anchor): acc_value})
    # float64 data, and integers (exact below 2**53), accumulate in float64; the rest in float32
    acc_t = "tl.float32" if x.shape.dtype in (DType.float32, DType.float16, DType.bfloat16, DType.bool) else "tl.float64"
    w.emit("ro = tl.program_id(0) * BO + tl.arange(0, BO)")
    row_bound = f"(ro[:, None] < {O})" if O > 1 else None

    def chunk() -> tuple[Tile, str]:
        """Open a loop over the reduced dims; returns the chunk's tile and its mask."""
        w.emit(f"for r0 in range(0, {R}, BR):")
        w.indent += 1
        w.emit("rr = r0 + tl.arange(0, BR)")
        tile = Tile({"ro": "ro[:, None]", "rr": "rr[None, :]"}, {"ro": row_bound, "rr": f"(rr[None, :] < {R})"})
        mask = " & ".join(m for m in (row_bound, f"(rr[None, :] < {R})") if m)
        return tile, mask

    def load_x(tile: Tile) -> str:
        return w.let(f"{w.value(x, tile, full_index)}.to({acc_t})")

    def lanes(init: str, update: Callable[[str, str, str], str]) -> str:
        """A per-lane accumulator over one pass of the row: `update(acc, x, mask)` gives its next value."""
        acc = w.let(f"tl.full([BO, BR], {init}, {acc_t})", "lane")
        tile, mask = chunk()
        w.emit(f"{acc} = {update(acc, load_x(tile), mask)}")
        w.indent -= 1
        return acc

    if opname in ("reduce_sum", "reduce_mean"):
        acc = lanes("0.0", lambda a, v, m: f"{a} + tl.where({m}, {v}, 0.0)")
        total = w.let(f"tl.sum({acc}, 1)")
        results["out"] = w.let(f"{total} / {R}.0") if opname == "reduce_mean" else total
    elif opname in ("reduce_max", "reduce_min"):
        big = "float('-inf')" if opname == "reduce_max" else "float('inf')"
        fn = "maximum" if opname == "reduce_max" else "minimum"
        acc = lanes(big, lambda a, v, m: f"tl.{fn}({a}, tl.where({m}, {v}, {big}))")
        results["out"] = w.let(f"tl.{fn[:3]}({acc}, 1)")
    elif opname == "reduce_prod":
        acc = lanes("1.0", lambda a, v, m: f"{a} * tl.where({m}, {v}, 1.0)")
        results["out"] = w.let(f"tl.reduce({acc}, 1, _prod_combine)")
    elif opname == "arg_reduce":
        a = anchor.op.attrs
        big = "float('-inf')" if a["largest"] else "float('inf')"
        better = ">" if a["largest"] else "<"
        if a["select_last_index"]:
            better += "="
        best = w.let(f"tl.full([BO, BR], {big}, {acc_t})", "lane")
        where = w.let(f"tl.full([BO, BR], {R}, tl.int64)", "lane")
        tile, mask = chunk()
        v = load_x(tile)
        take = w.let(f"({v} {better} {best}) & {mask}")
        w.emit(f"{best} = tl.where({take}, {v}, {best})")
        w.emit(f"{where} = tl.where({take}, rr[None, :].to(tl.int64) + 0 * {where}, {where})")
        w.indent -= 1
        top = w.let(f"tl.{'max' if a['largest'] else 'min'}({best}, 1)")
        pick = "max" if a["select_last_index"] else "min"
        fill = "-1" if a["select_last_index"] else str(R)
        results["out"] = w.let(f"tl.{pick}(tl.where({best} == {top}[:, None], {where}, {fill}), 1)")
    elif opname == "softmax":
        mx = lanes("float('-inf')", lambda a, v, m: f"tl.maximum({a}, tl.where({m}, {v}, float('-inf')))")
        m = w.let(f"tl.max({mx}, 1)")
        w.emit(f"{m} = tl.where({m} == float('-inf'), 0.0, {m})")
        sm = lanes("0.0", lambda a, v, k: f"{a} + tl.where({k}, tl.exp({v} - {m}[:, None]), 0.0)")
        s = w.let(f"tl.sum({sm}, 1)")
        tile, mask = chunk()
        v = load_x(tile)
        if anchor.op.attrs["log"]:
            results["out"] = w.let(f"{v} - {m}[:, None] - tl.log({s})[:, None]")
        else:
            results["out"] = w.let(f"tl.exp({v} - {m}[:, None]) / {s}[:, None]")
        _store_full(w, module, tile, full_index)
        w.indent -= 1
    elif opname == "layernorm":
        sm = lanes("0.0", lambda a, v, m: f"{a} + tl.where({m}, {v}, 0.0)")
        mean = w.let(f"tl.sum({sm}, 1) / {R}.0")
        sq = lanes("0.0", lambda a, v, m: f"{a} + tl.where({m}, ({v} - {mean}[:, None]) * ({v} - {mean}[:, None]), 0.0)")
        rstd = w.let(f"1.0 / tl.sqrt(tl.sum({sq}, 1) / {R}.0 + {anchor.op.attrs['epsilon']})")
        tile, mask = chunk()
        v = load_x(tile)
        scale = w.value(anchor.inputs[1], tile, full_index)
        bias = w.value(anchor.inputs[2], tile, full_index)
        results["out"] = w.let(f"({v} - {mean}[:, None]) * {rstd}[:, None] * {scale} + {bias}")
        _store_full(w, module, tile, full_index)
        w.indent -= 1
    else:
        raise CodegenError(f"no reduction template for {opname}")
    if not is_full_out:
        tile = Tile({"ro": "ro"}, {"ro": f"(ro < {O})" if O > 1 else None})
        (ret,) = module.returns
        w.store(ret, tile, red_index)
    args = w.arg_list()
    body = signature(name, args, ["BO", "BR"]) + "\n" + "\n".join(w.lines) + "\n"
    br = max(16, min(1024, 1 << (R - 1).bit_length()))
    bo = max(1, min(1 << (O - 1).bit_length() if O > 1 else 1, 4096 // br))
    configs = [{"BO": bo, "BR": br, "num_warps": 4, "num_stages": 1}]
    if br > 128:
        configs.append({"BO": max(1, min(bo * 2, 8192 // (br // 2))), "BR": br // 2, "num_warps": 4, "num_stages": 1})
    return KernelSource(name, kernel, "reduction", body, args, configs, [(O, "BO", None)])


def _store_full(w: KernelWriter, module: Module, tile: Tile, index: Index) -> None:
    (ret,) = module.returns
    w.store(ret, tile, index)
