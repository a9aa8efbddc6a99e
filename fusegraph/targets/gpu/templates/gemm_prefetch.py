"""A product's weights pulled into L2 before its kernel waits for the one before it.

Under programmatic dependent launch (`kernel_source.with_dependent_launch`) a kernel's
programs start while its predecessor still runs and wait (`gdc_wait`) before touching any
value another kernel writes. A weight is no such value: nothing writes it after the upload.
At batch 1 a product's time is mostly the latency of its weight reads (BERT-base's fc1 reads
4.7 MB in 10 us, a fifth of the memory's bandwidth), so each program asks for its own slice of
the weight, every chunk of its k range, as L2 prefetches (`prefetch.global.L2`), while it would
otherwise sit idle; its k loop then reads the weight from L2. Only the first row tile's
programs ask (the others read the same slice): with 32 row tiles, every program asking would
double the L2 requests for the weight.

A prefetch moves no data into registers and changes no value: it is correct for any address,
and one per 128-byte line suffices, so the tile is sampled a line apart along the axis that
is contiguous in memory. Lanes past the operand's bounds fetch its first element instead.
"""

from __future__ import annotations

from fusegraph.ir.index_expr import evaluate, free_vars
from fusegraph.ir.program import Instruction
from fusegraph.ops.base import is_load, is_param
from fusegraph.targets.gpu.kernel_writer import KernelWriter, Tile
from fusegraph.targets.gpu.templates.gemm_spec import GemmSpec

LINE_BYTES = 128  # an L2 line (and a prefetch's reach)
# one L2 prefetch of the lane's address; the asm's result is a dummy Triton requires
PREFETCH = 'tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [{ptr}], ' \
           'dtype=tl.int32, is_pure=False, pack=1)'


def weight_bound(spec: GemmSpec) -> bool:
    """Whether the weight is the larger operand (n >= m: k x n weights against m x k rows), the
    products whose time its reads decide. On an H100, under dependent launch with every weight
    prefetched, BERT-base ran 17% faster than plain kernels at batch 1 (128 rows) but 11% slower
    at batch 32 (4096 rows; ViT-S/16 there 2% faster): bench/results/models-b1-prefetch.md,
    models-transformers-b32-pdl.md. Which of the two did that at batch 32 is not yet measured;
    this rule keeps the prefetch where it was made for."""
    return spec.n >= spec.m


def is_weight(w: KernelWriter, b: Instruction) -> bool:
    """Whether product operand `b` is read straight from a literal input (a weight)."""
    return is_load(b) and is_param(b.inputs[0]) and w.params.index(b.inputs[0]) in w.inputs.literals


def weight_prefetch(w: KernelWriter, spec: GemmSpec, b: Instruction, period: int) -> list[str]:
    """The kernel lines that prefetch this program's slice of weight operand `b` into L2
    (none when `b` is no weight, or not the larger operand). Written with `w` apart from the
    body, with names of their own (`pf_...`): they go before the wait, ahead of the body, and a
    body variable of another shape would clash with them in the k loop."""
    if not (is_weight(w, b) and weight_bound(spec)):
        return []
    step_k, step_n = line_steps(w, spec, b)
    with w.apart() as lines:
        w.emit("pf_gz = tl.program_id(2) // SPLIT")
        base = "0" if period else "tl.program_id(1) * BN"
        w.emit(f"pf_rn = {base} + {sampled('BN', step_n)}")
        n_bound = f"(pf_rn[None, :] < {period or spec.n})"
        w.emit("pf_first = tl.program_id(0) == 0")
        w.emit(f"pf_end = tl.where(pf_first, {spec.k}, 0)")
        with w.block("for pf_k0 in range((tl.program_id(2) % SPLIT) * BK, pf_end, BK * SPLIT):"):
            if spec.taps:
                channels = spec.k // spec.taps
                w.emit(f"pf_tap = pf_k0 // {channels}")
                w.emit(f"pf_rk = pf_k0 % {channels} + {sampled('BK', step_k)}")
                k_bound = None  # chunks never straddle taps
            else:
                w.emit(f"pf_rk = pf_k0 + {sampled('BK', step_k)}")
                k_bound = f"(pf_rk[:, None] < {spec.k})"
            tile = Tile({"rk": "pf_rk[:, None]", "rn": "pf_rn[None, :]", "gz": "pf_gz", "tap": "pf_tap",
                         "nq": "tl.program_id(1)"}, {"rk": k_bound, "rn": n_bound})
            ptr, conds = w.pointer(b, tile, spec.b_index)
            if conds:
                arg = w.buffer(b.inputs[0])[0]
                ptr = f"tl.where({tile.conjunction(conds)}, {ptr}, {arg})"
            w.emit(PREFETCH.format(ptr=ptr))
    return lines


def line_steps(w: KernelWriter, spec: GemmSpec, b: Instruction) -> tuple[int, int]:
    """Elements a line apart along k and along n: a line's worth along the axis whose next
    element is the next address, 1 along the other (or both, when neither is)."""
    addr = w.address(b, spec.b_index)
    names = {v.name for v in free_vars(addr)}
    at = {n: 0 for n in names}
    origin = evaluate(addr, at)
    line = max(1, LINE_BYTES // b.shape.dtype.itemsize)

    def step(axis: str) -> int:
        return line if axis in names and evaluate(addr, {**at, axis: 1}) - origin == 1 else 1

    return step("rk"), step("rn")


def sampled(block: str, step: int) -> str:
    """A tile axis of extent `block` (a constexpr) sampled every `step` elements."""
    if step == 1:
        return f"tl.arange(0, {block})"
    return f"tl.arange(0, ({block} + {step - 1}) // {step}) * {step}"
