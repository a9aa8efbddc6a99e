"""How each product anchor reads its operands: the index spaces of the GEMM template.

A program of the template computes an (m, n) tile of a product, looping over k. What makes a
convolution or a batched matrix product of that loop is only where A, B and the output are
read and written for (m, k), (k, n) and (m, n): for a convolution the A index is the input
pixel under the window (`oh * stride - pad + kh * dilation`, zero outside the image), so the
NCHW input is read directly with no im2col buffer; a transposed convolution gathers the input
pixel each output pixel's tap comes from, masked where the stride does not divide the offset.
Each anchor class of the `gemm` family
registers its spec builder here with `@spec_of`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from fusegraph.ir.index_expr import Expr, FloorDiv, Mod, free_vars, subexpressions, substitute
from fusegraph.ir.index_map import delinearize
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.anchors import Convolution, ConvTranspose, Dot
from fusegraph.ops.base import Op, is_load, is_store
from fusegraph.targets.gpu.kernel_writer import CodegenError, Index, var


@dataclass
class GemmSpec:
    """The index spaces of one product: sizes, the operand indices and the output index."""

    m: int
    n: int
    k: int
    batch: int
    a_index: Index  # over rm, rk, bz
    b_index: Index  # over rk, rn, bz
    out_index: Index  # over rm, rn, bz
    a_valid: list[tuple[Expr, int, int]]  # zero padding: (expr, lo, hi) conditions on the A index
    taps: int = 0  # > 0: the k loop walks (tap, channel chunk) with channels `rk` of extent k // taps
    channel_groups: int = 1  # > 1: the batch index `gz` picks a group of output channels

    @property
    def flops(self) -> int:
        """Multiply-adds of the product, counted twice: the cost its config policy and the
        benchmarks' floors weigh."""
        return 2 * self.m * self.n * self.k * self.batch


SpecBuilder = Callable[[Instruction], GemmSpec]
SPECS: dict[type[Op], SpecBuilder] = {}


def spec_of(*op_types: type[Op]) -> Callable[[SpecBuilder], SpecBuilder]:
    """Decorator registering how anchors of `op_types` read their operands."""

    def deco(fn: SpecBuilder) -> SpecBuilder:
        for t in op_types:
            SPECS[t] = fn
        return fn

    return deco


def gemm_spec(anchor: Instruction) -> GemmSpec:
    """The spec of `anchor`, a product anchor (family `gemm`)."""
    try:
        return SPECS[type(anchor.op)](anchor)
    except KeyError:
        raise CodegenError(f"the GEMM template has no spec for op {anchor.op.name}") from None


def tap_major(conv: Instruction) -> bool:
    """Whether the k loop can walk the window taps outermost: every channel chunk then lies in one
    tap, so the tap's offsets and padding checks are per-iteration scalars, not per element."""
    x, w = conv.inputs
    return (x.shape.lens[1] // conv.op.attrs["group"]) % 16 == 0


@spec_of(Convolution)
def conv_spec(conv: Instruction) -> GemmSpec:
    x, w = conv.inputs
    a = conv.op.attrs
    X, W, O = x.shape.lens, w.shape.lens, conv.shape.lens[2:]
    g = a["group"]
    k_sp = W[2:]
    r = len(k_sp)
    P, KK = math.prod(O), math.prod(k_sp)
    cg, ng = X[1] // g, W[0] // g
    M, N, K = X[0] * P, ng, cg * KK
    rm, rn, gz = var("rm", M), var("rn", N), var("gz", g)
    n_idx = rm // P
    o = delinearize(rm % P, O) if O else ()
    taps = tap_major(conv)
    if taps:  # k = tap * cg + channel; `rk` is the channel, `tap` a loop scalar
        ci, tap = var("rk", cg), var("tap", KK)
        kk = delinearize(tap, k_sp) if k_sp else ()
    else:
        rk = var("rk", K)
        ci = rk // KK
        kk = delinearize(rk % KK, k_sp) if k_sp else ()
    spatial = [o[j] * a["stride"][j] - a["padding"][j] + kk[j] * a["dilation"][j] for j in range(r)]
    valid = [(spatial[j], 0, X[2 + j]) for j in range(r)]
    return GemmSpec(M, N, K, g, (n_idx, gz * cg + ci, *spatial), (gz * ng + rn, ci, *kk),
                    (n_idx, gz * ng + rn, *o), valid, KK if taps else 0, g)


@spec_of(ConvTranspose)
def conv_transpose_spec(conv: Instruction) -> GemmSpec:
    """Output pixel o takes tap t from input pixel i = (o + pad - t * dilation) / stride where
    that divides exactly and lands inside the input: the A index gathers i, and `a_valid` keeps
    the remainder at 0 and i in range. Weights are [C, M/group, *kernel]: B is (c, m, t)."""
    x, w = conv.inputs
    op = conv.op
    X, W, O = x.shape.lens, w.shape.lens, conv.shape.lens[2:]
    g, k_sp = op.attrs["group"], W[2:]
    r = len(k_sp)
    pads = op.padding_for(X[2:], k_sp)
    P, KK = math.prod(O), math.prod(k_sp)
    cg, ng = X[1] // g, W[1]
    M, N, K = X[0] * P, ng, cg * KK
    rm, rn, gz = var("rm", M), var("rn", N), var("gz", g)
    n_idx = rm // P
    o = delinearize(rm % P, O)
    taps = tap_major(conv)
    if taps:  # as for a convolution: `rk` the channel, `tap` a loop scalar
        ci, tap = var("rk", cg), var("tap", KK)
        kk = delinearize(tap, k_sp)
    else:
        rk = var("rk", K)
        ci = rk // KK
        kk = delinearize(rk % KK, k_sp)
    offsets = [o[j] + pads[j] - kk[j] * op.attrs["dilations"][j] for j in range(r)]
    strides = op.attrs["strides"]
    spatial = [offsets[j] // strides[j] for j in range(r)]
    valid = [(spatial[j], 0, X[2 + j]) for j in range(r)]
    valid += [(offsets[j] % strides[j], 0, 1) for j in range(r) if strides[j] > 1]
    return GemmSpec(M, N, K, g, (n_idx, gz * cg + ci, *spatial), (gz * cg + ci, rn, *kk),
                    (n_idx, gz * ng + rn, *o), valid, KK if taps else 0, g)


@spec_of(Dot)
def dot_spec(dot: Instruction) -> GemmSpec:
    """A batched product's batch index is the grid's `gz`, unless every batch reads the same B
    (a linear layer over [N, H, W, C] or [windows, tokens, C] rows, its weights broadcast):
    then the batches are rows of one product, M = batches x rows. Per batch, a 7x7 feature
    map's product would be 7 rows in tiles of 16 to 128, and each batch would read all of the
    weights again."""
    a, b = dot.inputs
    *batch, M, K = a.shape.lens
    N = b.shape.lens[-1]
    nb = math.prod(batch)
    rn, rk = var("rn", N), var("rk", K)
    if nb > 1 and _same_for_every_batch(b, len(batch)):
        rows = delinearize(var("rm", nb * M), [*batch, M])
        return GemmSpec(nb * M, N, K, 1, (*rows, rk), (*rows[:-1], rk, rn), (*rows, rn), [])
    rm, bz = var("rm", M), var("gz", nb)
    bi = delinearize(bz, batch) if batch else ()
    return GemmSpec(M, N, K, nb, (*bi, rm, rk), (*bi, rk, rn), (*bi, rm, rn), [])


def _same_for_every_batch(b: Instruction, batch_axes: int) -> bool:
    """Whether operand `b` (a load) reads the same element at every index of its first
    `batch_axes` axes: a broadcast of weights over the batch."""
    if not is_load(b):
        return False
    m = b.op.attrs["map"]
    batch_vars = set(m.out_vars[:batch_axes])
    return not any(batch_vars & free_vars(e) for e in m.exprs) and not any(
        batch_vars & free_vars(e) for e, _, _ in b.op.attrs["domain"])


def channel_period(module: Module, anchor: Instruction, spec: GemmSpec) -> int:
    """The period P when the epilogue addresses output channels only as (n // P, n % P).

    The detection head's stores split its 255 channels into 3 anchors of 85 (`n // 85` picks
    the rows, `n % 85` the column): with one N tile per period, padded to a power of two, the
    store address is affine along the tile and the writes coalesce; a plain 128-wide tile
    straddles periods and stores element by element. 0 when there is no such period.
    """
    if spec.channel_groups != 1:
        return 0
    axis = anchor.op.channel_axis(anchor.shape.ndim)
    periods: set[int] = set()
    for ins in module:
        if not (is_load(ins) or is_store(ins)) or ins.op.attrs["map"].out_lens != anchor.shape.lens:
            continue
        m = ins.op.attrs["map"]
        v = m.out_vars[axis]
        exprs = list(m.exprs) + [e for e, _, _ in ins.op.attrs["domain"]]
        for e in exprs:
            for x in subexpressions(e):
                if isinstance(x, (FloorDiv, Mod)) and x.arg == v:
                    periods.add(x.divisor)
    fits = [p for p in periods if spec.n % p == 0 and 16 < p <= 256 and spec.n > p]
    return fits[0] if len(fits) == 1 and len(periods) == 1 else 0


def split_by_period(spec: GemmSpec, period: int) -> None:
    """Rewrite `spec` so that n = nq * period + rn: the tile is one period, `nq` the program's
    scalar (its column block)."""
    n_expr = var("nq", spec.n // period) * period + var("rn", period)
    spec.b_index = tuple(substitute(e, {"rn": n_expr}, check=False) for e in spec.b_index)
    spec.out_index = tuple(substitute(e, {"rn": n_expr}, check=False) for e in spec.out_index)
