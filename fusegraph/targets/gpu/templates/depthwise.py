"""The depthwise-convolution template: a direct convolution over a tile of pixels and channels.

A convolution with one input channel per group (MobileNet's and EfficientNet's 3x3 and 5x5,
ConvNeXt's 7x7) is, as an implicit GEMM, one product per channel whose N is the channel
multiplier (one to a few) and whose K is the window's taps: a tensor-core tile computes mostly
padding and the kernel runs far from the speed its bytes allow. Here a program takes BP output
pixels by BC output channels and, for each tap of the window, adds the input tile under the tap
times the tap's [BC] weights into a float32 accumulator. Channels are the tile's contiguous
dimension: the feature maps a convolution reads are stored channels-last (activation_layout.py)
and depthwise weights [kh, kw, 1, M] (weight_layout.py), so the loads are 16-byte vectors along
channels, and the taps' overlapping input tiles come from the L1 cache.

The input is read through the kernel writer at the tap's index (`o * stride - pad + k *
dilation`, zero outside the image), so views and pointwise prologues work as they do for the
GEMM template, and the accumulator goes through the group's epilogue and stores. A sum over
each sample's pixels in the epilogue (the squeeze of an SE block after a depthwise conv +
SiLU) is added per pixel block and combined as the GEMM template does (`gemm_reduce.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fusegraph.ir.dtypes import DType
from fusegraph.ir.index_expr import Expr
from fusegraph.ir.index_map import delinearize
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import is_load
from fusegraph.passes.reduction_epilogue import WHOLE_ROW_CHANNELS
from fusegraph.targets.gpu.device import current_device
from fusegraph.targets.gpu.kernel_source import Config, KernelSource, signature
from fusegraph.targets.gpu.kernel_writer import CodegenError, Index, KernelInputs, KernelWriter, Tile, var
from fusegraph.targets.gpu.templates.gemm_reduce import (PixelSums, TileNames, emit_pixel_sums, emit_whole_row_stats,
                                                         pixel_sum_returns, row_stat_returns)
from fusegraph.targets.gpu.templates.registry import lowers

MAX_UNROLLED_TAPS = 64  # windows up to 8x8 unroll their taps; larger ones loop
TILE_ELEMENTS = (512, 1024, 2048, 4096)  # outputs per program of the candidates
MIN_PIXELS = 16  # the narrowest pixel block
WHOLE_ROW_MIN_PIXELS = 1  # the narrowest with every channel in the tile (up to 1024 of them)
WHOLE_ROW_SWEEP_PIXELS = 32  # the widest such block the exhaustive tune also tries under each warp count
# ... where each thread holds at most this many outputs: 32 pixels of 256 channels in one warp
# (256 a thread, 49 taps unrolled) did not finish compiling in 5 minutes on a 16-core H100 host
SWEEP_OUTPUTS_PER_THREAD = 64
WIDEST_CHANNELS = 64  # 128 bytes of fp16 channels: a warp's row of coalesced 16-byte copies
DEPTHWISE_TILE = TileNames("rp", "rc", "BP", "BC", "tl.program_id(0)", "tl.program_id(1)", ())


@dataclass
class DepthwiseSpec:
    """The index spaces of one depthwise convolution over pixels `rp` (batch and output
    positions, flattened), output channels `rc` and window taps `tap`."""

    pixels: int
    channels: int
    taps: int
    x_index: Index  # over rp, rc, tap
    w_index: Index  # over rc, tap
    out_index: Index  # over rp, rc
    x_valid: list[tuple[Expr, int, int]]  # zero padding: (expr, lo, hi) conditions on the input index


def depthwise_spec(conv: Instruction) -> DepthwiseSpec:
    """Output channel c reads input channel c // multiplier (weights [M, 1, *kernel])."""
    x, w = conv.inputs
    a = conv.op.attrs
    X, W, O = x.shape.lens, w.shape.lens, conv.shape.lens[2:]
    k_sp = W[2:]
    r = len(k_sp)
    P, KK = math.prod(O), math.prod(k_sp)
    multiplier = W[0] // a["group"]
    rp, rc, tap = var("rp", X[0] * P), var("rc", W[0]), var("tap", KK)
    n = rp // P
    o = delinearize(rp % P, O)
    kk = delinearize(tap, k_sp)
    ci = rc // multiplier if multiplier > 1 else rc
    spatial = [o[j] * a["stride"][j] - a["padding"][j] + kk[j] * a["dilation"][j] for j in range(r)]
    valid = [(spatial[j], 0, X[2 + j]) for j in range(r)]
    return DepthwiseSpec(X[0] * P, W[0], KK, (n, ci, *spatial), (rc, 0, *kk), (n, rc, *o), valid)


class DepthwiseEmitter:
    """Writes one depthwise kernel's body into a KernelWriter (`lines`)."""

    def __init__(self, module: Module, inputs: KernelInputs, anchor: Instruction, spec: DepthwiseSpec, kernel: str) -> None:
        dtype = anchor.inputs[0].shape.dtype
        if not dtype.is_float:
            raise CodegenError(f"{anchor.op.name} on {dtype} has no GPU template (floating point only)")
        self.module, self.anchor, self.spec, self.kernel = module, anchor, spec, kernel
        self.acc_t = "tl.float64" if dtype == DType.float64 else "tl.float32"
        self.w = KernelWriter(module, inputs, {id(anchor): self._acc_value})
        self.x_in, self.w_in = anchor.inputs
        self.bounds = {"rp": f"(rp[:, None] < {spec.pixels})", "rc": f"(rc[None, :] < {spec.channels})"}
        self.sums = pixel_sum_returns(module)  # an SE block's squeeze: sums over each sample's pixels
        self.pixel_sums = (PixelSums(spec.pixels, math.prod(anchor.shape.lens[2:]), spec.channels, DEPTHWISE_TILE)
                           if self.sums else None)
        self.sum_codes: dict[int, str] = {}
        self.w.tile_reduction = self._pixel_sum
        # a layernorm's statistics over the channels (`reduction_epilogue.whole_rows`): the
        # tile then takes every channel (`depthwise_configs`)
        self.row_stats = row_stat_returns(module)

    def _acc_value(self, tile: Tile, index: Index) -> str:
        if index != self.spec.out_index:
            raise CodegenError(f"the epilogue of {self.kernel} reads the {self.anchor.op.name} at another index")
        return "acc"

    def _pixel_sum(self, ins: Instruction, tile: Tile, index: Index, mask: tuple[str, ...]) -> str:
        if id(tile) not in self.sum_codes:
            raise CodegenError(f"the epilogue of {self.kernel} reads a sum over its pixels, which it only stores")
        return self.sum_codes[id(tile)]

    def body(self) -> list[str]:
        w, spec = self.w, self.spec
        w.emit("rp = tl.program_id(0) * BP + tl.arange(0, BP)")
        w.emit("rc = tl.program_id(1) * BC + tl.arange(0, BC)")
        w.emit(f"acc = tl.zeros([BP, BC], dtype={self.acc_t})")
        loop = "tl.static_range" if spec.taps <= MAX_UNROLLED_TAPS else "range"
        with w.block(f"for tap in {loop}({spec.taps}):"):
            w.emit(f"acc += {self._input_tile()} * {self._weights()}")
        te = Tile({"rp": "rp[:, None]", "rc": "rc[None, :]"}, dict(self.bounds))
        if self.row_stats:
            def rows() -> Tile:
                return Tile({"rp": "rp"}, {"rp": f"(rp < {spec.pixels})"})

            emit_whole_row_stats(w, self.row_stats, te, spec.out_index, rows, "[BP, BC]", spec.channels, self.sum_codes)
        for ret in self.module.returns:  # the group's value, then its further outputs
            if ret not in self.sums and ret not in self.row_stats:
                w.store(ret, te, spec.out_index)
        for ret in self.sums:
            emit_pixel_sums(w, ret, te, spec.out_index, self.pixel_sums, self.sum_codes)
        return w.lines

    def _input_tile(self) -> str:
        """The input under the tap, zero in the padding: a load's mask gives the zeros, a
        computed prologue is selected to zero there."""
        tile = Tile({"rp": "rp[:, None]", "rc": "rc[None, :]", "tap": "tap"}, dict(self.bounds))
        conds = [c for e, lo, hi in self.spec.x_valid for c in tile.range_conds(e, lo, hi)]
        value = self.w.value(self.x_in, tile, self.spec.x_index, tuple(conds))
        if conds and not is_load(self.x_in):
            value = self.w.let(f"tl.where({tile.conjunction(conds)}, {value}, 0.0)")
        return value

    def _weights(self) -> str:
        tile = Tile({"rc": "rc[None, :]", "tap": "tap"}, {"rc": self.bounds["rc"]})
        return self.w.value(self.w_in, tile, self.spec.w_index)


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def channel_widths(channels: int) -> list[int]:
    """Power-of-two channel blocks, the best guess first: the one with the most useful channels
    per contiguous run, `width * busy fraction` (96 -> 64: two blocks, one of them half busy,
    beat three full ones of 32, since the L1 cache serves a warp's load in 128-byte lines and
    a narrow block touches as many lines for less data); then the widest that divides the
    channels (no idle lane), half and twice the best."""
    if channels < 8:
        return [_pow2(channels)]
    fits = [b for b in (8, 16, 32, WIDEST_CHANNELS) if b <= _pow2(channels)]
    best = max(fits, key=lambda b: (b * channels / (math.ceil(channels / b) * b), -b))
    exact = next((b for b in reversed(fits) if channels % b == 0), best)
    out = [best]
    for b in (exact, best // 2, best * 2):
        if 8 <= b <= min(_pow2(channels), 2 * WIDEST_CHANNELS) and b not in out:
            out.append(b)
    return out


def depthwise_configs(pixels: int, channels: int, whole_rows: bool = False) -> list[Config]:
    """(BP, BC, num_warps) candidates, the best guess first.

    BC comes from `channel_widths`, or is every channel when the epilogue takes statistics of
    whole rows (`whole_rows`). The first candidate's BP is the largest that, at 2048 outputs a
    program, still gives every multiprocessor two programs (a batch-1 map is small: 96x56x56
    is 3136 pixels); then come 512 to 4096 outputs a program at each width.
    """
    widths = [_pow2(channels)] if whole_rows else channel_widths(channels)
    fewest = WHOLE_ROW_MIN_PIXELS if whole_rows else MIN_PIXELS
    most_pixels = max(fewest, _pow2(pixels))
    programs = 2 * current_device().sm_count

    def config(elements: int, width: int) -> Config:
        bp = min(most_pixels, max(fewest, elements // width))
        return {"BP": bp, "BC": width, "num_warps": 8 if bp * width >= 4096 else 4, "num_stages": 1}

    bc = widths[0]
    first = config(2048, bc)
    while first["BP"] > fewest and math.ceil(pixels / first["BP"]) * math.ceil(channels / bc) < programs:
        first = config(first["BP"] * bc // 2, bc)
    out = [first]
    for width in widths:
        for elements in TILE_ELEMENTS:
            c = config(elements, width)
            if c not in out:
                out.append(c)
    if whole_rows:  # for --exhaustive-tune: the narrow pixel blocks under every warp count
        bp = fewest
        while bp <= min(most_pixels, WHOLE_ROW_SWEEP_PIXELS):
            out += [c for c in ({"BP": bp, "BC": bc, "num_warps": nw, "num_stages": 1} for nw in (1, 2, 4, 8)
                                if bp * bc <= SWEEP_OUTPUTS_PER_THREAD * 32 * nw) if c not in out]
            bp *= 2
    return out


@lowers("depthwise")
def depthwise_kernel(name: str, kernel: str, module: Module, inputs: KernelInputs, anchor: Instruction,
                     allow_tf32: bool = False, interpret: bool = False) -> KernelSource:
    """The kernel of fused group `module` around depthwise convolution `anchor`."""
    spec = depthwise_spec(anchor)
    emitter = DepthwiseEmitter(module, inputs, anchor, spec, kernel)
    lines = emitter.body()
    args = emitter.w.arg_list() + (["part", "pcnt"] if emitter.pixel_sums else [])
    body = signature(name, args, ["BP", "BC"]) + "\n" + "\n".join(lines) + "\n"
    if emitter.row_stats and spec.channels > WHOLE_ROW_CHANNELS:
        raise CodegenError(f"{kernel}: statistics over {spec.channels} channels; a tile holds at most {WHOLE_ROW_CHANNELS}")
    configs = depthwise_configs(spec.pixels, spec.channels, bool(emitter.row_stats))
    return KernelSource(name, kernel, "depthwise", body, args, configs,
                        [(spec.pixels, "BP", None), (spec.channels, "BC", None)],
                        flops=2 * spec.pixels * spec.channels * spec.taps, parts=emitter.pixel_sums)
