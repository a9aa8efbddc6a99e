"""Which tile configs a GEMM kernel offers the tuner, best guesses first.

The first config is the untuned default and the default tune times the first few, so the order
is the policy. It depends on the device through two facts (`device.py`): how many programs
fill the GPU (its multiprocessor count) and how much shared memory a block's operand pipeline
may take. The orders come from tuning reports (FUSEGRAPH_TUNING_REPORT) that time every
candidate; bench/results keeps the reports and their figures.
"""

from __future__ import annotations

import math

from fusegraph.ir.dtypes import DType
from fusegraph.targets.gpu.device import current_device
from fusegraph.targets.gpu.kernel_source import DEFAULT_TUNE_CONFIGS
from fusegraph.targets.gpu.templates.gemm_spec import GemmSpec

Config = dict[str, int]

# Shared memory a block keeps for the epilogue's layout conversion besides the operand pipeline;
# tests/gpu/test_gpu_sm90.py checks that every candidate left in compiles within the rest.
EPILOGUE_SHARED_BYTES = 27 * 1024

# Split-k aims at this many programs per multiprocessor: one more to switch to while another
# waits on memory.
PROGRAMS_PER_SM = 2

# Problems of at least this many 64x128 tiles (about three waves of a large GPU) try these
# shapes first: on large problems bigger tiles win (an exhaustive tuning report of a large
# batch, bench/results/yolov5s-b32*.md); 128x128x64 with four warps won three of the eight
# transformer GEMMs of an exhaustive tune (bench/results/gemm-exhaustive.md).
MANY_TILES = 400
LARGE_FIRST = [(128, 256, 64, 8, 3), (64, 128, 32, 4, 4), (128, 64, 64, 4, 3), (64, 64, 32, 4, 3), (128, 128, 64, 4, 3)]

# A product of fewer FLOPs than this (an SE block's two 1x1 convs on a pooled vector) takes the
# launch's few microseconds under any tile: its default tune builds and times TINY_TUNE
# candidates instead of six, a fifth of EfficientNet-B1's builds.
TINY_FLOPS = 1 << 21
TINY_TUNE = 2

# Products of at most this many rows offer 16-row tiles. Those over large weights (a
# classifier on a pooled vector or a class token: at least FEW_ROWS_WEIGHTS of them) put narrow
# column blocks unsplit and split in two first (FEW_ROWS_FIRST), then the general list, whose
# first TINY_TUNE candidates the default tune also times; the other 16-row tiles, and all of
# them for small weights (an SE block's FCs, which the launch dominates), are for the
# exhaustive tune. A 64-row tile of one row stores 63 idle rows into the split-k workspace.
# On an H100 EfficientNet-B1's classifier (1 x 1280 -> 1000) picked 16x32 unsplit at 4.6 us,
# and ConvNeXt-T's (1 x 768 -> 1000, a layernorm computed as it loads) 16x32 unsplit at 4.9 us
# once the prologue summed its statistics lane by lane (11-13 us under all 35 candidates before:
# gemm_prologue.py).
FEW_ROWS = 16
FEW_ROWS_WEIGHTS = 1 << 18
FEW_ROWS_FIRST = ((32, 1), (64, 1), (32, 2), (64, 2))  # (BN, SPLIT)
FEW_ROWS_TUNE = len(FEW_ROWS_FIRST) + TINY_TUNE


def few_rows_first(spec: GemmSpec) -> bool:
    """Whether `spec` is a product of few rows over large weights (see FEW_ROWS)."""
    return spec.m <= FEW_ROWS and spec.k * spec.n >= FEW_ROWS_WEIGHTS

# (BM, BN, BK, warps, stages) in the order the batch-1 timings ranked them
SHAPES = [(64, 128, 64, 4, 3), (32, 64, 64, 4, 4), (64, 64, 64, 4, 2), (64, 32, 64, 4, 4), (64, 64, 64, 4, 4),
          (128, 128, 32, 8, 3), (32, 32, 64, 2, 4), (128, 64, 64, 4, 3), (64, 128, 32, 4, 4),
          (128, 256, 64, 8, 3), (128, 32, 64, 4, 4), (128, 64, 32, 4, 4), (64, 64, 32, 4, 3),
          (256, 64, 32, 8, 3), (256, 128, 32, 8, 3), (32, 64, 64, 2, 3),
          # Hopper's large-problem tiles (two warpgroups, deeper pipelines), for the exhaustive tune
          (128, 128, 64, 8, 4), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3), (128, 128, 64, 4, 3)]


def pipeline_budget() -> int:
    """Shared memory a config's operand pipeline may take on the current device."""
    return current_device().shared_bytes_per_block - EPILOGUE_SHARED_BYTES


def pipeline_bytes(config: Config, itemsize: int, a_bytes: int = 0) -> int:
    """Shared memory of the operand tiles Triton keeps in flight, counted as num_stages copies
    of the A and B tiles: Triton 3.6 takes 196608 bytes for BM 64, BN 128, BK 128 and 4 stages
    in fp16 (four copies) and 147456 for 128x256x64 with 3 stages (three), on sm_90 with the
    launcher's 16-byte aligned pointers. `a_bytes`: the bytes an element of A's tile loads, when
    A is computed from several loaded tensors (each a [BM, BK] tile in flight: a convolution
    normalizing its input as it loads it took 274432 bytes at 64x16x64, 4 stages, in float32)."""
    return config["num_stages"] * (config["BM"] * config["BK"] * (a_bytes or itemsize) + config["BK"] * config["BN"] * itemsize)


def gemm_configs(spec: GemmSpec, dtype: DType, tile: int, pieces: bool, a_bytes: int = 0) -> tuple[list[Config], int]:
    """The candidate configs of a product and how many of them the default tune times (0: the
    usual DEFAULT_TUNE_CONFIGS). `tile` is the period tile's width (0 without a period);
    `pieces`: the kernel can also compute a period tile as two narrower products; `a_bytes`:
    what an element of a computed A loads (`pipeline_bytes`)."""
    configs = _configs(spec)
    if dtype == DType.float64:  # small tiles for the summed products; the split-k workspace is float32
        configs = [{"BM": 16, "BN": 16, "BK": 16, "SPLIT": 1, "num_warps": 4, "num_stages": 1}]
    if tile:
        configs = _period_configs(spec, tile) + [{**c, "BN": tile} for c in configs]
        configs = [c for k, c in enumerate(configs) if c not in configs[:k]]
    configs = _fitting(configs, dtype.itemsize, a_bytes)
    # a head times one candidate more than other kernels: its four period candidates come ahead
    # of the general list, of which it then still times three
    default_tune = (DEFAULT_TUNE_CONFIGS + 1 if tile else FEW_ROWS_TUNE if few_rows_first(spec)
                    else TINY_TUNE if spec.flops < TINY_FLOPS else 0)
    if pieces:  # each default candidate without split-k is also tried in pieces, right after itself
        first = [t for c in configs[:default_tune]
                 for t in [{**c, "PIECES": 0}] + ([{**c, "PIECES": 1}] if c["SPLIT"] == 1 else [])]
        configs, default_tune = first + [{**c, "PIECES": 0} for c in configs[default_tune:]], len(first)
    return configs, default_tune


def _fitting(configs: list[Config], itemsize: int, a_bytes: int = 0) -> list[Config]:
    """The configs whose pipeline fits in shared memory (the smallest one if none does): the
    candidate lists are written for 2-byte operands, and a float32 product doubles the bytes."""
    budget = pipeline_budget()
    fits = [c for c in configs if pipeline_bytes(c, itemsize, a_bytes) <= budget]
    return fits or [min(configs, key=lambda c: pipeline_bytes(c, itemsize, a_bytes))]


def _period_configs(spec: GemmSpec, tile: int) -> list[Config]:
    """First candidates of a period-aligned product (the detection head): eight warps share the
    [BM, tile] epilogue, which costs as much as the product; long k chunks where the channels
    allow; then the 64x32 four-warp tile, the fastest of the head sweep in
    `bench/results/head-configs.md`.
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


def _pow2(x: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, 1 << (max(1, x) - 1).bit_length()))


class _Tiling:
    """The tile counts and the clamped configs of one problem."""

    def __init__(self, spec: GemmSpec) -> None:
        self.spec = spec
        kmax = 64
        if spec.taps:
            channels = spec.k // spec.taps
            kmax = max(b for b in (16, 32, 64) if channels % b == 0)
        self.bk = min(_pow2(spec.k, 16, 64), kmax)
        self.nmax = _pow2(spec.n, 16, 256)

    def tiles(self, bm: int, bn: int) -> int:
        return -(-self.spec.m // bm) * -(-self.spec.n // min(bn, self.nmax)) * self.spec.batch

    def config(self, bm: int, bn: int, bk: int, warps: int, stages: int, split: int = 1) -> Config:
        return {"BM": bm, "BN": min(bn, self.nmax), "BK": min(bk, self.bk), "SPLIT": split,
                "num_warps": warps, "num_stages": stages}

    def split_factor(self, bm: int, bn: int, chunks: int) -> int:
        """Enough k slices for PROGRAMS_PER_SM programs per multiprocessor, each slice at least
        two chunks long, at most 8."""
        want = 1 << max(1, math.ceil(math.log2(PROGRAMS_PER_SM * current_device().sm_count / self.tiles(bm, bn))))
        return min(8, want, 1 << (chunks // 2).bit_length() - 1)


def _configs(spec: GemmSpec) -> list[Config]:
    """Tile shapes for the problem's size, best guesses first (the first is the untuned default).

    Small problems (batch-1 feature maps of 20x20 or 40x40) need small tiles and split-k to give
    every multiprocessor enough programs; large ones want large tiles for reuse. The default
    tune times the first DEFAULT_TUNE_CONFIGS (kernel_source.py).
    """
    t = _Tiling(spec)
    sms = current_device().sm_count
    shapes = list(SHAPES)
    if t.tiles(64, 128) >= MANY_TILES:  # batch 32: large tiles first
        shapes = LARGE_FIRST + [s for s in shapes if s not in LARGE_FIRST]
    if t.tiles(64, 128) < sms:
        # too few programs to fill the GPU: the largest tiles that still fill it, then the most programs
        shapes.sort(key=lambda s: (0, -s[0] * s[1]) if t.tiles(s[0], s[1]) >= sms else (1, -t.tiles(s[0], s[1])))
    out = [t.config(*s) for s in shapes]
    # split k where even small tiles leave most multiprocessors idle and the k loop is long
    chunks = -(-spec.k // 64)
    if t.tiles(32, 64) < sms and chunks >= 8:
        f64, f32 = t.split_factor(64, 64, chunks), t.split_factor(32, 64, chunks)
        out = [t.config(64, 64, 64, 4, 4, f64), t.config(32, 64, 64, 4, 4, f32),
               t.config(64, 64, 64, 4, 4, max(2, f64 // 2))] + out
    # the other split factors, for --exhaustive-tune; not where the tiles alone fill the GPU many
    # times over (batch 32), where each factor's slots would cost hundreds of MiB of workspace
    for f in (2, 4, 8):
        if chunks >= 8 and f <= chunks // 2 and t.tiles(64, 128) < MANY_TILES:
            out += [t.config(bm, bn, 64, 4, 4, f) for bm, bn in ((64, 64), (32, 64), (32, 32))]
    if spec.m <= FEW_ROWS:  # a product of a row or a few: 16-row tiles (see FEW_ROWS)
        splits = [f for f in (1, 2, 4, 8) if f == 1 or f <= chunks // 2]
        first = [t.config(16, bn, 64, 4, 4, f) for bn, f in FEW_ROWS_FIRST if f in splits]
        out = (first if few_rows_first(spec) else []) + out + [
            t.config(16, bn, 64, 4, 4, f) for bn in (32, 64, 128) for f in splits]
    return [c for k, c in enumerate(out) if c not in out[:k]]
