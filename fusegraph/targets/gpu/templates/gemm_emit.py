"""The Triton text of a GEMM kernel: the k loop over operand tiles, split-k, the epilogue.

Both operands are read through their prologues at the spec's indices (`gemm_spec.py`); the
epilogue runs on the accumulator tile at the output index and stores through the group's maps:
into a transposed layout, a slice of a concat, or the detection head's [1, 25200, 85] rows;
a softmax over runs of output channels reduces across the tile there (`gemm_reduce.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fusegraph.ir.dtypes import DType
from fusegraph.ir.index_expr import Var, bounds, free_vars
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import is_load, is_store
from fusegraph.targets.gpu.kernel_source import KernelSource
from fusegraph.targets.gpu.kernel_writer import TRITON_TYPES, CodegenError, Index, KernelInputs, KernelWriter, Tile
from fusegraph.targets.gpu.templates.gemm_prologue import (RowStatistics, columns_vanish, computed_from, deferrable, emit_row_stores,
                                                             prologue_norms, row_stores, selected_loads)
from fusegraph.targets.gpu.templates.gemm_reduce import (SEGMENT_EMITTERS, PixelSums, RowParts, emit_pixel_sums, emit_row_stats,
                                                         pixel_sum_returns, row_stat_returns)
from fusegraph.targets.gpu.templates.gemm_spec import GemmSpec
from fusegraph.targets.gpu.templates.gemm_tma import TmaOperand, tma_operand, tma_wanted


@dataclass
class Columns:
    """One accumulator of a product: its name, its column variable, width (code) and bound."""

    acc: str
    rn: str
    width: str
    bound: str | None


def stored_width(module: Module, out_index: Index, tile: int) -> int:
    """How many of a period tile's first columns the epilogue stores: the detection head's
    anchors are padded to 128 channels (`pad_channel_groups`) of which its stores keep 85."""
    widths = []
    for ins in module.returns:
        while is_store(ins):  # a chain of stores: the pieces of a concat
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
    runs on 96 columns instead of 128, and a sigmoid costs two special-function operations
    per element (`bench/results/head-ablate.md`). [] when one block fits or two do not cover the width
    (16-column granularity, the narrowest dot)."""
    cover = -(-width // 16) * 16
    big = 1 << (cover.bit_length() - 1)
    rest = cover - big
    if cover > tile or rest == 0 or rest & (rest - 1):
        return []
    return [(0, big), (big, rest)]


def pixel_sums_of(anchor: Instruction, spec: GemmSpec, sums: list[Instruction]) -> PixelSums:
    """The pixel sums of a product kernel: over a convolution's spatial axes, or over the
    middle axes of a product whose rows are every sample's pixels (its batches folded into M)."""
    (axes,) = {r.inputs[1].op.attrs["axes"] for r in sums}
    lens = anchor.shape.lens
    channel = anchor.op.channel_axis(len(lens))
    if not anchor.op.spatial_window and (spec.batch != 1 or spec.m != math.prod(lens) // lens[channel]):
        raise CodegenError(f"{anchor.op.name}'s kernel does not hold each sample's pixels as rows: no pixel sums")
    return PixelSums(spec.m, math.prod(lens[a] for a in axes), lens[channel], channel_axis=channel)


class GemmEmitter:
    """Writes one product kernel's body into a KernelWriter (`lines`)."""

    def __init__(self, module: Module, inputs: KernelInputs, anchor: Instruction, spec: GemmSpec, kernel: str,
                 allow_tf32: bool, interpret: bool) -> None:
        dtype = anchor.inputs[0].shape.dtype
        if not dtype.is_float:
            raise CodegenError(f"{anchor.op.name} on {dtype} has no GPU template (floating point only)")
        self.module, self.anchor, self.spec, self.kernel, self.dtype = module, anchor, spec, kernel, dtype
        self.acc_of: dict[int, str] = {}  # epilogue tile -> the accumulator it reads
        self.width_of: dict[int, str] = {}  # epilogue tile -> its width (code)
        self.w = KernelWriter(module, inputs, {id(anchor): self._acc_value})
        self.w.tile_reduction = self._epilogue_reduction
        self.sum_codes: dict[int, str] = {}  # the tile a pixel sum is stored on -> its code
        self.sums = pixel_sum_returns(module)
        self.pixel_sums = pixel_sums_of(anchor, spec, self.sums) if self.sums else None
        self.row_stats = row_stat_returns(module)
        self.row_parts = RowParts(spec.n) if self.row_stats else None
        self.a_in, self.b_in = anchor.inputs
        a_loads = selected_loads(self.a_in)
        self.a_plain = a_loads is not None  # A computes nothing: its loads are zero wherever masked
        self.w.raw_loads = {id(x) for x in [*(a_loads or []), self.b_in] if is_load(x)}
        self.a_masked = self.a_plain and any(v.name == "rk" for x in spec.a_index for v in free_vars(x))
        self.norms = prologue_norms(module, anchor)
        # normalizing after the product: not for float64's summed products nor tf32's rounded rows
        self.defer_norm = deferrable(module, anchor, self.norms, spec.a_index) and not allow_tf32 and dtype != DType.float64
        self.row_stores = row_stores(module, anchor)  # at the A index: in the k loop, or after a deferred product
        self.m_bound = f"(rm[:, None] < {spec.m})"
        self.acc_t = "tl.float64" if dtype == DType.float64 else "tl.float32"
        self.operand = TRITON_TYPES[dtype]
        if interpret and dtype == DType.bfloat16:
            self.operand = "tl.float32"  # the interpreter's bf16 dot is wrong
        self.precision = "" if dtype != DType.float32 else (
            ', input_precision="tf32"' if allow_tf32 else ', input_precision="ieee"')
        self.use_tma = dtype != DType.float64 and tma_wanted(interpret)
        self.tma: dict[str, TmaOperand] = {}  # "a", "b": the operands read through tensor descriptors

    @property
    def lines(self) -> list[str]:
        return self.w.lines

    def arg_list(self) -> list[str]:
        return self.w.arg_list()

    def _epilogue_reduction(self, ins: Instruction, tile: Tile, index: Index, mask: tuple[str, ...]) -> str:
        emit = SEGMENT_EMITTERS.get(ins.op.algorithm)
        if emit is not None:
            return emit(self.w, ins, tile, index, mask, self.width_of[id(tile)])
        if id(tile) not in self.sum_codes:
            raise CodegenError(f"the epilogue of {self.kernel} reads a reduction across its programs, which it only stores")
        return self.sum_codes[id(tile)]

    def _acc_value(self, tile: Tile, index: Index) -> str:
        if index != self.spec.out_index:
            raise CodegenError(f"the epilogue of {self.kernel} reads the {self.anchor.op.name} at another index")
        return self.acc_of[id(tile)]

    def a_bytes(self) -> int:
        """What an element of A's tile loads when A is computed from loaded tensors without a
        norm of its own (a scale, a normalization from stored statistics): every such load is
        a tile in flight. 0 for a plain A or a prologue layernorm, whose tiles the usual count
        covers."""
        if self.a_plain or self.norms:
            return 0
        inside = computed_from(self.a_in)
        return sum(x.shape.dtype.itemsize for x in self.module if is_load(x) and id(x) in inside)

    def body(self, period: int, tile: int) -> bool:
        """The whole kernel body; with a channel period the N tile is one period of width `tile`.
        Returns whether the kernel has the PIECES choice (the period's columns as two narrower
        products, one constexpr branch each)."""
        w, spec = self.w, self.spec
        w.emit("pid_m = tl.program_id(0)")
        w.emit("pid_n = tl.program_id(1)")
        w.emit("gz = tl.program_id(2) // SPLIT")
        w.emit("pid_k = tl.program_id(2) % SPLIT")
        w.emit("rm = pid_m * BM + tl.arange(0, BM)")
        w.emit("rn = tl.arange(0, BN)" if period else "rn = pid_n * BN + tl.arange(0, BN)")
        if self.use_tma and not period:
            self._descriptors()
        # two narrower products would each need W's column sums: a period tile normalizes first
        deferred = self.defer_norm and not period
        vanish = deferred and columns_vanish(self.module, self.w.inputs, self.norms, self.b_in, spec.b_index)
        self.stats = RowStatistics(w, self.norms, spec.a_index, spec.k, deferred, vanish)
        self.stats.emit(self.m_bound)
        # a period of a power of two fills its tile exactly: no bound, so Triton sees whole rows
        n_bound = None if period and tile == period else f"(rn[None, :] < {period or spec.n})"
        whole = [Columns("acc", "rn", "BN", n_bound)]
        pieces = []
        if period and self.dtype != DType.float64 and not any(i.op.in_epilogue for i in self.module):  # reductions need the whole tile
            pieces = column_pieces(stored_width(self.module, spec.out_index, tile), tile)
        if not pieces:
            self.product(whole, split=True)
            return False
        with w.block("if PIECES:"):
            blocks = []
            for j, (start, size) in enumerate(pieces):
                w.emit(f"rn{j} = {start} + tl.arange(0, {size})" if start else f"rn{j} = tl.arange(0, {size})")
                bound = f"(rn{j}[None, :] < {period})" if start + size > period < tile else None
                blocks.append(Columns(f"acc{j}", f"rn{j}", str(size), bound))
            self.product(blocks, split=False)
        with w.block("else:"):
            self.product(whole, split=True)
        return True

    def product(self, blocks: list[Columns], split: bool) -> None:
        """The k loop and epilogue for `blocks`; a kernel may hold two of them, each in its own
        constexpr branch, over the same tile."""
        w, spec = self.w, self.spec
        for b in blocks:
            w.emit(f"{b.acc} = tl.zeros([BM, {b.width}], dtype={self.acc_t})")
        ahead = self._prefetch_loads()
        with w.block(f"for k0 in range(pid_k * BK, {spec.k}, BK * SPLIT):"):
            k_bounds = self._k_chunk()
            following = self._load_ahead(ahead, "rk + BK * SPLIT")
            a_tile = self._a_tile(k_bounds[0], ahead)
            for b in blocks:
                b_tile = self._b_tile(b, k_bounds[1])
                if self.dtype == DType.float64:  # no float64 tensor-core dot on every GPU Triton targets: exact products, summed
                    w.emit(f"{b.acc} += tl.sum({a_tile}[:, :, None] * {b_tile}[None, :, :], axis=1)")
                else:
                    w.emit(f"{b.acc} = tl.dot({a_tile}, {b_tile}, {b.acc}{self.precision})")
                    self.stats.column_sums(b_tile, self.operand, self.precision)
            for name, nxt in zip(ahead.values(), following):
                w.emit(f"{name} = {nxt}")
        self.stats.finish(blocks[0].acc, self.m_bound, self.row_stores)
        if split:
            split_k_fixup(w)
        else:
            w.emit("last = tl.full([1, 1], 1, tl.int1)")
            w.emit("owner = pid_k == 0")
        self._epilogue(blocks)

    def _descriptors(self) -> None:
        """Tensor descriptors for the operands the TMA can read (`gemm_tma.py`): a raw load, read
        with no domain, padding or prologue rows stored."""
        spec, w = self.spec, self.w
        if spec.taps > 1:  # a tap's window offsets are not a 2-d tensor's rows
            return
        plain_a = is_load(self.a_in) and self.a_plain and not self.row_stores and all(
            lo <= bounds(e)[0] and bounds(e)[1] < hi for e, lo, hi in spec.a_valid)
        for key, load, index, tile_vars in (("a", self.a_in, spec.a_index, ("rm", "rk")),
                                            ("b", self.b_in, spec.b_index, ("rk", "rn"))):
            if not is_load(load) or (key == "a" and not plain_a) or KernelWriter.domain_ranges(load, index):
                continue
            operand = tma_operand(w.address(load, index), tile_vars, load.shape.dtype.itemsize)
            if operand is None:
                continue
            self.tma[key] = operand
            block = {"rm": "BM", "rk": "BK", "rn": "BN"}
            w.emit(operand.descriptor(f"{key}_desc", w.buffer(load.inputs[0])[0], (block[operand.outer], block[operand.inner])))

    def _tma_tile(self, key: str) -> str:
        """The chunk of operand `key` read through its descriptor, as a [rows, cols] tile of the product."""
        operand = self.tma[key]
        start = {"rm": "pid_m * BM", "rk": "k0", "rn": "pid_n * BN"}
        value = self.w.let(f"{key}_desc.load([{start[operand.outer]}, {start[operand.inner]}])", "ld")
        return value if operand.outer == ("rm" if key == "a" else "rk") else f"{value}.T"

    def _k_chunk(self) -> tuple[str | None, str | None]:
        """Emit the chunk's `rk` (and `tap`); returns the k bounds of the A and the B tile."""
        w, spec = self.w, self.spec
        if not spec.taps:
            if len(self.tma) < 2 or self.norms:  # else no load of the chunk needs its lanes' k
                w.emit("rk = tl.multiple_of(k0, BK) + tl.arange(0, BK)")
            return f"(rk[None, :] < {spec.k})", f"(rk[:, None] < {spec.k})"
        channels = spec.k // spec.taps  # chunks never straddle taps: BK divides the channels
        w.emit(f"tap = k0 // {channels}")
        # the chunk's start is a multiple of BK: said outright, since Triton 3.6 loses that through
        # `%` and then loads the A tile element by element instead of in 16-byte copies
        w.emit(f"rk = tl.multiple_of(k0 % {channels}, BK) + tl.arange(0, BK)")
        return None, None

    def _prefetch_loads(self) -> dict[int, str]:
        """A computed A operand's loads (the rows a prologue scales or normalizes), read one chunk
        ahead: before the k loop the first chunk's, in each iteration the next chunk's, so their
        latency overlaps the current chunk's arithmetic and product. Triton pipelines a raw
        operand's loads itself, but not loads whose values pass through arithmetic on their way
        to the product; without this a batch-1 layernorm prologue waited out a load from memory
        in every iteration. Returns the variable holding each load's chunk, by instruction (none
        for a raw A, a convolution's taps or padding, or float64)."""
        spec = self.spec
        if self.a_plain or spec.taps or spec.a_valid or self.dtype == DType.float64:
            return {}
        seen = computed_from(self.a_in, avoiding=self.anchor)
        loads = [x for x in self.module if id(x) in seen and is_load(x) and id(x) not in self.w.raw_loads]
        ahead = {id(ld): self.w.fresh("pf") for ld in loads}
        for name, value in zip(ahead.values(), self._load_ahead(ahead, "pid_k * BK + tl.arange(0, BK)")):
            self.w.emit(f"{name} = {value}")
        return ahead

    def _load_ahead(self, ahead: dict[int, str], start: str) -> list[str]:
        """The prefetched loads of the chunk whose columns are `start`, in `ahead`'s order."""
        if not ahead:
            return []
        w, k = self.w, self.spec.k
        w.emit(f"rk_ahead = {start}")
        tile = Tile({"rm": "rm[:, None]", "rk": "rk_ahead[None, :]", "gz": "gz"},
                    {"rm": self.m_bound, "rk": f"(rk_ahead[None, :] < {k})"})
        by_id = {id(x): x for x in self.module}
        return [w.value(by_id[i], tile, self.spec.a_index) for i in ahead]

    def _a_tile(self, k_bound: str | None, ahead: dict[int, str]) -> str:
        w, spec = self.w, self.spec
        ta = Tile({"rm": "rm[:, None]", "rk": "rk[None, :]", "gz": "gz", "tap": "tap"}, {"rm": self.m_bound, "rk": k_bound})
        for i, name in ahead.items():  # read a chunk ahead (no padding conditions: the key's mask is empty)
            ta.memo[(i, spec.a_index, ())] = name
        conds = [c for e, lo, hi in spec.a_valid for c in ta.range_conds(e, lo, hi)]
        av = self._tma_tile("a") if "a" in self.tma else w.value(self.a_in, ta, spec.a_index, tuple(conds))
        emit_row_stores(w, self.row_stores, ta, spec.a_index, self.stats.deferred)
        if self.row_stores:
            # Triton 3.6 on Hopper miscompiles a kernel that stores prologue rows (in this loop or
            # after it) at some large tiles: with 128x256 tiles and 8 warps, products at batch 32
            # of BERT-base came out NaN in a few hundred rows per run, varying from run to run.
            # All threads meeting here before the chunk enters the product gave right results in
            # each of the six configs tried (`tests/gpu/test_gpu_prologue_layernorm_store.py`).
            w.emit("tl.debug_barrier()")
        if conds and not self.a_plain:  # a computed prologue is zero in the padding too
            av = w.let(f"tl.where({' & '.join(conds)}, {av}, 0.0)")
        if not spec.taps and not self.a_masked:  # lanes past k must add nothing, also where A's index ignores k
            av = w.let(f"tl.where(rk[None, :] < {spec.k}, {av}, 0)")
        # an operand whose index ignores a tile dim (a size-1 dim) is broadcast to the full tile
        return f"tl.broadcast_to({av}, [BM, BK]).to({self.operand})"

    def _b_tile(self, b: Columns, k_bound: str | None) -> str:
        tb = Tile({"rk": "rk[:, None]", "rn": f"{b.rn}[None, :]", "gz": "gz", "tap": "tap", "nq": "pid_n"},
                  {"rk": k_bound, "rn": b.bound})
        bv = self._tma_tile("b") if "b" in self.tma else self.w.value(self.b_in, tb, self.spec.b_index)
        return f"tl.broadcast_to({bv}, [BK, {b.width}]).to({self.operand})"

    def _epilogue(self, blocks: list[Columns]) -> None:
        for b in blocks:
            te = Tile({"rm": "rm[:, None]", "rn": f"{b.rn}[None, :]", "gz": "gz", "nq": "pid_n"},
                      {"rm": self.m_bound, "rn": b.bound})
            self.acc_of[id(te)] = b.acc
            self.width_of[id(te)] = b.width
            if self.row_stats:  # before the tile's stores: the rendezvous' release then waits for
                # the parts alone, not for the whole tile to reach memory
                emit_row_stats(self.w, self.row_stats, te, self.spec.out_index, self.spec.m, self.spec.n, self.sum_codes)
            for ret in self.module.returns:  # the group's value, then its further outputs
                if ret not in self.sums and ret not in self.row_stores and ret not in self.row_stats:
                    self.w.store(ret, te, self.spec.out_index, ("last",))
            if self.sums:
                with self.w.block("if owner:"):  # under split-k, the program holding the tile's whole sums
                    for ret in self.sums:
                        emit_pixel_sums(self.w, ret, te, self.spec.out_index, self.pixel_sums, self.sum_codes)


def split_k_fixup(w: KernelWriter) -> None:
    """With SPLIT > 1 programs share a tile's k range: each stores its partial sum in its own
    float32 slot of a workspace, and the last to arrive (a counter per tile) adds the SPLIT
    slots in slot order, resets the counter for the next run, and alone runs the epilogue. One
    kernel still, small batch-1 layers get enough programs to fill the GPU, and the sum's order
    never depends on which program ran first, so two runs give the same bits (float atomics
    into one slot would not)."""
    # `last` is a [1, 1] tile: a scalar condition in a mask trips Triton's interpreter, and
    # a full one would cost an operation per element in every mask it joins
    w.emit("last = tl.full([1, 1], 1, tl.int1) & (pid_k == 0)")
    w.emit("owner = pid_k == 0")  # the program that runs the epilogue, as a scalar (`emit_row_stats`)
    with w.block("if SPLIT > 1:"):
        w.emit("tile = (gz * tl.num_programs(1) + pid_n) * tl.num_programs(0) + pid_m")
        w.emit("wt = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]")
        w.emit("tl.store(ws + (tile * SPLIT + pid_k) * (BM * BN) + wt, acc)")
        w.emit("tl.debug_barrier()")  # every thread's part of the slot is written before the release
        w.emit('seen = tl.atomic_add(cnt + tile, 1, sem="acq_rel")')
        w.emit("is_last = seen == SPLIT - 1")
        w.emit("last = tl.full([1, 1], 1, tl.int1) & is_last")
        w.emit("owner = is_last")
        with w.block("if is_last:"):
            w.emit("acc = tl.zeros([BM, BN], dtype=tl.float32)")
            # unrolled, so every slot's load is in flight at once: a rolled loop waits out an
            # L2 round trip per slot (SPLIT of them) before the epilogue can start
            with w.block("for s in tl.static_range(SPLIT):"):
                # past L1: the slots were written by other programs, maybe on other SMs
                w.emit('acc += tl.load(ws + (tile * SPLIT + s) * (BM * BN) + wt, cache_modifier=".cg")')
            w.emit("tl.atomic_xchg(cnt + tile, 0)")


def workspace_elements(src: KernelSource, config: dict[str, int]) -> tuple[int, int]:
    """Float32 workspace elements and tile counters a GEMM kernel needs under `config`: SPLIT
    BM x BN float32 slots and one counter per output tile (`split_k_fixup`)."""
    if src.template != "gemm" or config.get("SPLIT", 1) == 1:
        return 0, 0
    tiles = 1
    for extent, block, _ in src.grid_dims:
        tiles *= -(-extent // config[block]) if block else extent
    return tiles * config["SPLIT"] * config["BM"] * config["BN"], tiles
