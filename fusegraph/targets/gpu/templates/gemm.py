"""The GEMM template: convolution (implicit GEMM) and batched matrix products.

A program computes an (m, n) tile of the product, looping over k in chunks. Both operands
are read through their prologues at indices built from (m, k) and (k, n): for a convolution
the A index is the input pixel under the window (`oh * stride - pad + kh * dilation`, zero
outside the image), so the NCHW input is read directly with no im2col buffer and no layout
kernel. The epilogue runs on the accumulator tile at the output index of (m, n) and stores
through the group's maps: into a transposed layout, a slice of a concat, or the detection
head's [1, 25200, 85] rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fusegraph.ir.dtypes import DType
from fusegraph.ir.index_expr import Expr, FloorDiv, Mod, Var, free_vars, subexpressions, substitute
from fusegraph.ir.index_map import delinearize
from fusegraph.ir.program import Instruction, Module
from fusegraph.targets.gpu.kernel_source import DEFAULT_TUNE_CONFIGS, KernelSource, signature
from fusegraph.targets.gpu.kernel_writer import TRITON_TYPES, CodegenError, Index, KernelInputs, KernelWriter, Tile, var


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


def tap_major(conv: Instruction) -> bool:
    """Whether the k loop can walk the window taps outermost: every channel chunk then lies in one
    tap, so the tap's offsets and padding checks are per-iteration scalars, not per element."""
    x, w = conv.inputs
    return (x.shape.lens[1] // conv.op.attrs["group"]) % 16 == 0


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
                    (n_idx, gz * ng + rn, *o), valid, KK if taps else 0)


def dot_spec(dot: Instruction) -> GemmSpec:
    a, b = dot.inputs
    *batch, M, K = a.shape.lens
    N = b.shape.lens[-1]
    nb = math.prod(batch)
    rm, rn, rk, bz = var("rm", M), var("rn", N), var("rk", K), var("gz", nb)
    bi = delinearize(bz, batch) if batch else ()
    return GemmSpec(M, N, K, nb, (*bi, rm, rk), (*bi, rk, rn), (*bi, rm, rn), [])


def channel_period(module: Module, anchor: Instruction, spec: GemmSpec) -> int:
    """The period P when the epilogue addresses output channels only as (n // P, n % P).

    The detection head's stores split its 255 channels into 3 anchors of 85 (`n // 85` picks
    the rows, `n % 85` the column): with one N tile per period, padded to a power of two, the
    store address is affine along the tile and the writes coalesce; a plain 128-wide tile
    straddles periods and stores element by element. 0 when there is no such period.
    """
    if spec.batch != 1 and anchor.op.name == "convolution":
        return 0
    axis = 1 if anchor.op.name == "convolution" else anchor.shape.ndim - 1
    periods: set[int] = set()
    for ins in module:
        if ins.op.name not in ("load", "store") or ins.op.attrs["map"].out_lens != anchor.shape.lens:
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


def stored_width(module: Module, out_index: Index, tile: int) -> int:
    """How many of a period tile's first columns the epilogue stores: the detection head's
    anchors are padded to 128 channels (`pad_channel_groups`) of which its stores keep 85."""
    (ins,) = module.returns
    widths = []
    while ins.op.name == "store":  # a chain of stores: the pieces of a concat
        width = tile
        for x, _, hi in KernelWriter.domain_ranges(ins, out_index):
            if isinstance(x, Var) and x.name == "rn":
                width = min(width, hi)
        widths.append(width)
        ins = ins.inputs[0]
    return max(widths, default=tile)


def column_pieces(width: int, tile: int) -> list[tuple[int, int]]:
    """(start, width) of two power-of-two column blocks covering the `width` stored columns of a
    tile that leaves much of its width unused: 85 of 128 columns as 64 + 32. The epilogue then
    runs on 96 columns instead of 128; its sigmoid alone, two special-function operations per
    element, took 0.9 of the 5.8 us of the 80x80 detection head on an H200
    (`bench/results/head-ablate.md`). [] when one block fits or two do not cover the width
    (16-column granularity, the narrowest dot)."""
    cover = -(-width // 16) * 16
    big = 1 << (cover.bit_length() - 1)
    rest = cover - big
    if cover > tile or rest == 0 or rest & (rest - 1):
        return []
    return [(0, big), (big, rest)]


@dataclass
class Columns:
    """One accumulator of a product: its name, its column variable, width (code) and bound."""

    acc: str
    rn: str
    width: str
    bound: str | None


def gemm_kernel(name: str, kernel: str, module: Module, inputs: KernelInputs, anchor: Instruction,
                allow_tf32: bool = False, interpret: bool = False) -> KernelSource:
    spec = conv_spec(anchor) if anchor.op.name == "convolution" else dot_spec(anchor)
    period = channel_period(module, anchor, spec)
    if period:  # n = nq * period + rn: the tile is one period, nq the program's scalar
        n_expr = var("nq", spec.n // period) * period + var("rn", period)
        spec.b_index = tuple(substitute(e, {"rn": n_expr}, check=False) for e in spec.b_index)
        spec.out_index = tuple(substitute(e, {"rn": n_expr}, check=False) for e in spec.out_index)
    dtype = anchor.inputs[0].shape.dtype
    if not dtype.is_float:
        raise CodegenError(f"{anchor.op.name} on {dtype} has no GPU template (floating point only)")
    out_index = spec.out_index

    acc_of: dict[int, str] = {}  # epilogue tile -> the accumulator it reads

    def acc_value(tile: Tile, index: Index) -> str:
        if index != out_index:
            raise CodegenError(f"the epilogue of {kernel} reads the {anchor.op.name} at another index")
        return acc_of[id(tile)]

    w = KernelWriter(module, inputs, {id(anchor): acc_value})
    a_in, b_in = anchor.inputs
    w.raw_loads = {id(x) for x in anchor.inputs if x.op.name == "load"}
    a_masked = a_in.op.name == "load" and any(v.name == "rk" for x in spec.a_index for v in free_vars(x))
    m_bound = f"(rm[:, None] < {spec.m})"
    acc_t = "tl.float64" if dtype == DType.float64 else "tl.float32"
    operand = TRITON_TYPES[dtype]
    if interpret and dtype == DType.bfloat16:
        operand = "tl.float32"  # the interpreter's bf16 dot is wrong
    precision = "" if dtype != DType.float32 else (
        ', input_precision="tf32"' if allow_tf32 else ', input_precision="ieee"')

    def emit_product(blocks: list[Columns], split: bool) -> None:
        """The k loop and epilogue for `blocks`; a kernel may hold two of them, each in its own
        constexpr branch, over the same tile."""
        for b in blocks:
            w.emit(f"{b.acc} = tl.zeros([BM, {b.width}], dtype={acc_t})")
        w.emit(f"for k0 in range(pid_k * BK, {spec.k}, BK * SPLIT):")
        w.indent += 1
        if spec.taps:  # chunks never straddle taps: BK divides the channels
            channels = spec.k // spec.taps
            w.emit(f"tap = k0 // {channels}")
            # the chunk's start is a multiple of BK: said outright, since Triton 3.6 loses that through
            # `%` and then loads the A tile element by element instead of in 16-byte copies
            w.emit(f"rk = tl.multiple_of(k0 % {channels}, BK) + tl.arange(0, BK)")
            k_bounds: tuple[str | None, str | None] = (None, None)
        else:
            w.emit("rk = tl.multiple_of(k0, BK) + tl.arange(0, BK)")
            k_bounds = (f"(rk[None, :] < {spec.k})", f"(rk[:, None] < {spec.k})")
        ta = Tile({"rm": "rm[:, None]", "rk": "rk[None, :]", "gz": "gz", "tap": "tap"}, {"rm": m_bound, "rk": k_bounds[0]})
        conds = [c for e, lo, hi in spec.a_valid for c in ta.range_conds(e, lo, hi)]
        av = w.value(a_in, ta, spec.a_index, tuple(conds))
        if conds and a_in.op.name != "load":  # a computed prologue is zero in the padding too
            av = w.let(f"tl.where({' & '.join(conds)}, {av}, 0.0)")
        if not spec.taps and not a_masked:  # lanes past k must add nothing, also where A's index ignores k
            av = w.let(f"tl.where(rk[None, :] < {spec.k}, {av}, 0)")
        # an operand whose index ignores a tile dim (a size-1 dim) is broadcast to the full tile
        a_tile = f"tl.broadcast_to({av}, [BM, BK]).to({operand})"
        for b in blocks:
            tb = Tile({"rk": "rk[:, None]", "rn": f"{b.rn}[None, :]", "gz": "gz", "tap": "tap", "nq": "pid_n"},
                      {"rk": k_bounds[1], "rn": b.bound})
            b_tile = f"tl.broadcast_to({w.value(b_in, tb, spec.b_index)}, [BK, {b.width}]).to({operand})"
            if dtype == DType.float64:  # no float64 tensor-core dot on every GPU Triton targets: exact products, summed
                w.emit(f"{b.acc} += tl.sum({a_tile}[:, :, None] * {b_tile}[None, :, :], axis=1)")
            else:
                w.emit(f"{b.acc} = tl.dot({a_tile}, {b_tile}, {b.acc}{precision})")
        w.indent -= 1
        if split:
            _split_k_fixup(w)
        else:
            w.emit("last = tl.full([1, 1], 1, tl.int1)")
        (ret,) = module.returns
        for b in blocks:
            te = Tile({"rm": "rm[:, None]", "rn": f"{b.rn}[None, :]", "gz": "gz", "nq": "pid_n"}, {"rm": m_bound, "rn": b.bound})
            acc_of[id(te)] = b.acc
            w.store(ret, te, spec.out_index, ("last",))

    w.emit("pid_m = tl.program_id(0)")
    w.emit("pid_n = tl.program_id(1)")
    w.emit("gz = tl.program_id(2) // SPLIT")
    w.emit("pid_k = tl.program_id(2) % SPLIT")
    w.emit("rm = pid_m * BM + tl.arange(0, BM)")
    w.emit("rn = tl.arange(0, BN)" if period else "rn = pid_n * BN + tl.arange(0, BN)")
    tile = max(16, 1 << (period - 1).bit_length()) if period else 0
    # a period of a power of two fills its tile exactly: no bound, so Triton sees whole rows
    n_bound = None if period and tile == period else f"(rn[None, :] < {period or spec.n})"
    whole = [Columns("acc", "rn", "BN", n_bound)]
    pieces = column_pieces(stored_width(module, out_index, tile), tile) if period and dtype != DType.float64 else []
    if pieces:  # PIECES (a tuning choice): the period's columns as two narrower products
        w.emit("if PIECES:")
        w.indent += 1
        blocks = []
        for j, (start, size) in enumerate(pieces):
            w.emit(f"rn{j} = {start} + tl.arange(0, {size})" if start else f"rn{j} = tl.arange(0, {size})")
            bound = f"(rn{j}[None, :] < {period})" if start + size > period < tile else None
            blocks.append(Columns(f"acc{j}", f"rn{j}", str(size), bound))
        emit_product(blocks, split=False)
        w.indent -= 1
        w.emit("else:")
        w.indent += 1
        emit_product(whole, split=True)
        w.indent -= 1
    else:
        emit_product(whole, split=True)
    args = w.arg_list() + ["ws", "cnt"]
    body = signature(name, args, ["BM", "BN", "BK", "SPLIT"] + (["PIECES"] if pieces else [])) + "\n" + "\n".join(w.lines) + "\n"
    configs = _configs(spec)
    if dtype == DType.float64:  # small tiles for the summed products; the split-k workspace is float32
        configs = [{"BM": 16, "BN": 16, "BK": 16, "SPLIT": 1, "num_warps": 4, "num_stages": 1}]
    m, n, batch = spec.m, spec.n, spec.batch
    n_grid: tuple[int, str | None, str | None] = (n, "BN", None)
    if period:
        configs = _period_configs(spec, tile) + [{**c, "BN": tile} for c in configs]
        configs = [c for k, c in enumerate(configs) if c not in configs[:k]]
        n_grid = (n // period, None, None)
    configs = _fitting(configs, dtype.itemsize)
    # a head times one candidate more than other kernels: its four period candidates come ahead
    # of the general list, of which it then still times three
    default_tune = DEFAULT_TUNE_CONFIGS + 1 if period else 0
    if pieces:  # each default candidate without split-k is also tried in pieces, right after itself
        first = [t for c in configs[:default_tune]
                 for t in [{**c, "PIECES": 0}] + ([{**c, "PIECES": 1}] if c["SPLIT"] == 1 else [])]
        configs, default_tune = first + [{**c, "PIECES": 0} for c in configs[default_tune:]], len(first)
    return KernelSource(name, kernel, "gemm", body, args, configs,
                        [(m, "BM", None), n_grid, (batch, None, "SPLIT")],
                        flops=2 * spec.m * spec.n * spec.k * spec.batch, default_tune=default_tune)


# Shared memory a config's operand pipeline may take: the H200 gives a block 227 KiB, and the
# epilogue's layout conversion needs room besides.
PIPELINE_BYTES = 200 * 1024


def pipeline_bytes(config: dict[str, int], itemsize: int) -> int:
    """Shared memory of the operand tiles Triton keeps in flight, counted as num_stages copies
    of the A and B tiles: Triton 3.6 takes 196608 bytes for BM 64, BN 128, BK 128 and 4 stages
    in fp16 (four copies) and 147456 for 128x256x64 with 3 stages (three), on sm_90 with the
    launcher's 16-byte aligned pointers."""
    tiles = config["BM"] * config["BK"] + config["BK"] * config["BN"]
    return config["num_stages"] * tiles * itemsize


def _fitting(configs: list[dict[str, int]], itemsize: int) -> list[dict[str, int]]:
    """The configs whose pipeline fits in shared memory (the smallest one if none does): the
    candidate lists are written for 2-byte operands, and a float32 product doubles the bytes."""
    fits = [c for c in configs if pipeline_bytes(c, itemsize) <= PIPELINE_BYTES]
    return fits or [min(configs, key=lambda c: pipeline_bytes(c, itemsize))]


def _split_k_fixup(w: KernelWriter) -> None:
    """With SPLIT > 1 programs share a tile's k range: each adds its partial sum into a float32
    workspace, and the last to arrive (a counter per tile) takes the sum, resets the workspace
    and counter to zero for the next run, and alone runs the epilogue. One kernel still, and
    small batch-1 layers get enough programs to fill the GPU."""
    # `last` is a [1, 1] tile: a scalar condition in a mask trips Triton's interpreter, and
    # a full one would cost an operation per element in every mask it joins
    w.emit("last = tl.full([1, 1], 1, tl.int1) & (pid_k == 0)")
    w.emit("if SPLIT > 1:")
    w.indent += 1
    w.emit("tile = (gz * tl.num_programs(1) + pid_n) * tl.num_programs(0) + pid_m")
    w.emit("wp = ws + tile * (BM * BN) + tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]")
    w.emit('tl.atomic_add(wp, acc, sem="relaxed")')
    w.emit('seen = tl.atomic_add(cnt + tile, 1, sem="acq_rel")')
    w.emit("is_last = seen == SPLIT - 1")
    w.emit("last = tl.full([1, 1], 1, tl.int1) & is_last")
    # read the sum through the atomic unit (an add of zero), then clear it for the next run
    w.emit('acc = tl.atomic_add(wp, tl.zeros([BM, BN], dtype=tl.float32), mask=last, sem="relaxed")')
    w.emit("tl.store(wp, tl.zeros([BM, BN], dtype=tl.float32), mask=last)")
    w.emit("tl.atomic_xchg(cnt + tile, 0, mask=is_last)")
    w.indent -= 1


def workspace_elements(src: KernelSource, config: dict[str, int]) -> tuple[int, int]:
    """Float32 workspace elements and tile counters a GEMM kernel needs under `config`."""
    if src.template != "gemm" or config.get("SPLIT", 1) == 1:
        return 0, 0
    tiles = 1
    for extent, block, _ in src.grid_dims:
        tiles *= -(-extent // config[block]) if block else extent
    return tiles * config["BM"] * config["BN"], tiles


def _period_configs(spec: GemmSpec, tile: int) -> list[dict[str, int]]:
    """First candidates of a period-aligned product (the detection head): eight warps share the
    [BM, tile] epilogue, which costs as much as the product; long k chunks where the channels
    allow; then the 64x32 four-warp tile that `bench/results/head-configs.md` found fastest for
    the 80x80 head on an H200 (6.3 us with L2 cold, in pieces; the other tiles run in 6.4 to 27).
    The general list follows, so the default tune also times the other 64-row four-warp tiles."""
    channels = spec.k // spec.taps if spec.taps else spec.k
    if spec.taps:  # a chunk must not straddle two taps (the k loop has no bound then)
        bk = max(b for b in (16, 32, 64, 128) if channels % b == 0)
    else:
        bk = 128 if channels % 128 == 0 else 64 if channels % 64 == 0 else 32
    out = [{"BM": 64, "BN": tile, "BK": bk, "SPLIT": 1, "num_warps": 8, "num_stages": 4},
           {"BM": 64, "BN": tile, "BK": min(bk, 64), "SPLIT": 1, "num_warps": 8, "num_stages": 4},
           {"BM": 32, "BN": tile, "BK": bk, "SPLIT": 1, "num_warps": 4, "num_stages": 4},
           {"BM": 64, "BN": tile, "BK": min(bk, 32), "SPLIT": 1, "num_warps": 4, "num_stages": 3}]
    return [c for c in out if spec.taps or c["BK"] <= max(16, spec.k)]


# Problems of at least this many 64x128 tiles (three waves on 132 multiprocessors: YOLOv5s at
# batch 32) try these shapes first. From an exhaustive tuning report of YOLOv5s at batch 32 on
# the H200, replayed on the candidates: the first six of the batch-1 order sum to 4144 us, these
# first to 4039 us, every candidate's best to 4019 us.
MANY_TILES = 400
LARGE_FIRST = [(128, 256, 64, 8, 3), (64, 128, 32, 4, 4), (128, 64, 64, 4, 3), (64, 64, 32, 4, 3)]


def _pow2(x: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, 1 << (max(1, x) - 1).bit_length()))


def _configs(spec: GemmSpec) -> list[dict[str, int]]:
    """Tile shapes for the problem's size, best guesses first (the first is the untuned default).

    Small problems (batch-1 feature maps of 20x20 or 40x40) need small tiles and split-k to give
    the 132 multiprocessors enough programs; large ones want large tiles for reuse. The order
    comes from timing every candidate of YOLOv5s's kernels on an H200 (FUSEGRAPH_TUNING_REPORT):
    the default tune times the first DEFAULT_TUNE_CONFIGS (kernel_source.py).
    """
    kmax = 64
    if spec.taps:
        channels = spec.k // spec.taps
        kmax = max(b for b in (16, 32, 64) if channels % b == 0)
    bk = min(_pow2(spec.k, 16, 64), kmax)
    nmax = _pow2(spec.n, 16, 256)

    def tiles(bm: int, bn: int) -> int:
        return -(-spec.m // bm) * -(-spec.n // min(bn, nmax)) * spec.batch

    def config(bm: int, bn: int, bk2: int, warps: int, stages: int, split: int = 1) -> dict[str, int]:
        return {"BM": bm, "BN": min(bn, nmax), "BK": min(bk2, bk), "SPLIT": split, "num_warps": warps, "num_stages": stages}

    shapes = [(64, 128, 64, 4, 3), (32, 64, 64, 4, 4), (64, 64, 64, 4, 2), (64, 32, 64, 4, 4), (64, 64, 64, 4, 4),
              (128, 128, 32, 8, 3), (32, 32, 64, 2, 4), (128, 64, 64, 4, 3), (64, 128, 32, 4, 4),
              (128, 256, 64, 8, 3), (128, 32, 64, 4, 4), (128, 64, 32, 4, 4), (64, 64, 32, 4, 3),
              (256, 64, 32, 8, 3), (256, 128, 32, 8, 3), (32, 64, 64, 2, 3)]
    if tiles(64, 128) >= MANY_TILES:  # batch 32: large tiles first
        shapes = LARGE_FIRST + [t for t in shapes if t not in LARGE_FIRST]
    if tiles(64, 128) < 132:
        # too few programs to fill the GPU: the largest tiles that still fill it, then the most programs
        shapes.sort(key=lambda t: (0, -t[0] * t[1]) if tiles(t[0], t[1]) >= 132 else (1, -tiles(t[0], t[1])))
    out = [config(*t) for t in shapes]
    # split k where even small tiles leave most multiprocessors idle and the k loop is long:
    # enough slices for two programs per multiprocessor, each slice at least two chunks long
    chunks = -(-spec.k // 64)
    if tiles(32, 64) < 132 and chunks >= 8:
        def factor(bm: int, bn: int) -> int:
            want = 1 << max(1, math.ceil(math.log2(264 / tiles(bm, bn))))
            return min(8, want, 1 << (chunks // 2).bit_length() - 1)

        f64, f32 = factor(64, 64), factor(32, 64)
        out = [config(64, 64, 64, 4, 4, f64), config(32, 64, 64, 4, 4, f32),
               config(64, 64, 64, 4, 4, max(2, f64 // 2))] + out
    for f in (2, 4, 8):  # the other split factors, for --exhaustive-tune
        if chunks >= 8 and f <= chunks // 2:
            out += [config(bm, bn, 64, 4, 4, f) for bm, bn in ((64, 64), (32, 64), (32, 32))]
    return [c for k, c in enumerate(out) if c not in out[:k]]
