"""A chained product in a GEMM kernel: the first product's epilogue value multiplied by the
second product's weights, summed over the programs that share a block of rows.

A program of the first product holds a BM x BN block of its value: BM rows times BN of the
K columns of the second product (`passes/chain_products.py` merged the two groups). It
multiplies the block by those BN rows of the second product's weights, one BN2-column chunk at
a time, and stores each part in a float32 slot of its own; the programs of one block of rows
(the grid's second axis, SLOTS of them) count their arrivals per chunk, and the last to arrive
adds the SLOTS slots in slot order, resets the counter and runs the second product's epilogue
on the sum. Chunks are visited in an order rotated by the program's column block, so the last
arrivals, which do the sums, spread over the programs. One kernel for an MLP at batch 1; the
order of every sum is fixed, so two runs give the same bits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusegraph.ir.index_expr import substitute
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import OpKind
from fusegraph.targets.gpu.kernel_source import KernelSource, cdiv
from fusegraph.targets.gpu.kernel_writer import CodegenError, Tile, var
from fusegraph.targets.gpu.templates.gemm_spec import GemmSpec, gemm_spec

if TYPE_CHECKING:
    from fusegraph.targets.gpu.templates.gemm_emit import GemmEmitter

# (BM, BN, BN2, warps) best guesses first, for a few hundred rows: BN hidden columns per
# program, BN2 output columns per part
CHAIN_CONFIGS = [(32, 128, 128, 4), (64, 128, 128, 4), (16, 128, 128, 4), (32, 256, 128, 8), (64, 256, 128, 8),
                 (32, 128, 64, 4), (16, 256, 128, 4)]


def chained_product(module: Module, anchor: Instruction) -> Instruction | None:
    """The group's second product, which reads a value computed from `anchor`, if any."""
    products = [i for i in module if i.op.kind == OpKind.ANCHOR]
    rest = [p for p in products if p is not anchor]
    if not rest:
        return None
    if len(rest) > 1:
        raise CodegenError(f"fused module {module.name} holds {len(products)} products; two at most (a chain)")
    return rest[0]


def chain_spec(first: GemmSpec, second: Instruction) -> GemmSpec:
    """The second product's spec, checked to read the first one's output tile as its A tile:
    its A index with `rk` renamed `rn` is the first product's output index."""
    spec = gemm_spec(second)
    renamed = tuple(substitute(e, {"rk": var("rn", first.n)}, check=False) for e in spec.a_index)
    if spec.batch != 1 or first.batch != 1 or spec.m != first.m or spec.k != first.n or renamed != first.out_index:
        raise CodegenError(f"the chained {second.op.name} does not read the first product's output tile as its A operand")
    return spec


def chain_configs(spec: GemmSpec, n2: int) -> list[dict[str, int]]:
    """Candidates: each tile no larger than the first product's rows, k and columns (the hidden
    units) and the second's columns (`n2`) need; the split over k is the columns' own."""
    out: list[dict[str, int]] = []
    for bm, bn, bn2, warps in CHAIN_CONFIGS:
        c = {"BM": min(bm, _pow2(spec.m)), "BN": min(bn, _pow2(spec.n)), "BK": min(64, _pow2(spec.k)), "SPLIT": 1,
             "BN2": min(bn2, _pow2(n2)), "num_warps": warps, "num_stages": 3}
        if c not in out:
            out.append(c)
    return out


def _pow2(x: int) -> int:
    """The power of two at least `x`, and at least 16 (the narrowest dot)."""
    return max(16, 1 << (x - 1).bit_length())


def chain_workspace(src: KernelSource, config: dict[str, int]) -> tuple[int, int]:
    """Float32 slots and counters of a chained kernel under `config`: per row block and output
    chunk one counter and one BM x BN2 slot per column block of the first product."""
    (m, _, _), (n, _, _), _ = src.grid_dims
    tiles = cdiv(m, config["BM"]) * cdiv(src.chain_columns, config["BN2"])
    return tiles * cdiv(n, config["BN"]) * config["BM"] * config["BN2"], tiles


def emit_chain(e: "GemmEmitter", te: Tile) -> None:
    """The second product and its epilogue, after the first product's tile `te` (its value is
    the accumulator the emitter registered for `te`)."""
    w, spec, second, spec2 = e.w, e.spec, e.chain, e.chain_spec
    slots, chunks = f"(({spec.n} + BN - 1) // BN)", f"(({spec2.n} + BN2 - 1) // BN2)"
    h = w.value(second.inputs[0], te, spec.out_index)
    # hidden columns past the first product's width add nothing (their weights' rows are masked too)
    hv = w.let(f"tl.where(rn[None, :] < {spec.n}, {h}, 0.0).to({e.operand})", "h")
    w.emit("wc = tl.arange(0, BM)[:, None] * BN2 + tl.arange(0, BN2)[None, :]")
    with w.block(f"for t in tl.static_range({chunks}):"):
        w.emit(f"n2 = (pid_n + t) % {chunks}")
        w.emit("rc = n2 * BN2 + tl.arange(0, BN2)")
        c_bound = f"(rc[None, :] < {spec2.n})"
        tb = Tile({"rk": "rn[:, None]", "rn": "rc[None, :]", "gz": "gz"}, {"rk": f"(rn[:, None] < {spec.n})", "rn": c_bound})
        wv = w.value(second.inputs[1], tb, spec2.b_index)
        w.emit(f"part = tl.dot({hv}, tl.broadcast_to({wv}, [BN, BN2]).to({e.operand}){e.precision})")
        w.emit(f"ctile = pid_m * {chunks} + n2")
        w.emit(f"tl.store(ws + (ctile * {slots} + pid_n) * (BM * BN2) + wc, part)")
        w.emit("tl.debug_barrier()")  # every thread's part of the slot is written before the release
        w.emit('seen = tl.atomic_add(cnt + ctile, 1, sem="acq_rel")')
        with w.block(f"if seen == {slots} - 1:"):
            w.emit("acc2 = tl.zeros([BM, BN2], dtype=tl.float32)")
            with w.block(f"for s in tl.static_range({slots}):"):  # unrolled: every slot's load in flight at once
                w.emit(f'acc2 += tl.load(ws + (ctile * {slots} + s) * (BM * BN2) + wc, cache_modifier=".cg")')
            w.emit("tl.atomic_xchg(cnt + ctile, 0)")
            t2 = Tile({"rm": "rm[:, None]", "rn": "rc[None, :]", "gz": "gz", "nq": "pid_n"}, {"rm": e.m_bound, "rn": c_bound})
            for ret in e.module.returns:
                w.store(ret, t2, spec2.out_index)
