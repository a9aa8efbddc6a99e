"""The attention template: flash attention over the index maps of Q, K, V and the mask.

A program takes BM query rows of one (batch, head) and walks the keys in tiles of BN, keeping
a running row maximum and sum in float32 (online softmax) and the output tile in a float32
accumulator, so the scores never leave the chip. The scale and log2(e) fold into one factor
of the exponent (`exp2`). Q, K, V and the mask are read by the kernel writer at indices over
the template's variables, so they come straight from the layout their producers wrote (the
QKV projection's head split), and the output tile is stored through the group's epilogue (the
head merge). Key tiles that every row of the block sees in full run in a loop without
masks; the tiles crossing the causal diagonal or the end of the keys follow in a second loop
with the test, and a causal program stops at the last key its last row sees.
"""

from __future__ import annotations

import math

from fusegraph.ir.dtypes import DType
from fusegraph.ir.index_map import delinearize
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import is_load
from fusegraph.targets.gpu.device import current_device
from fusegraph.targets.gpu.kernel_source import Config, KernelSource, signature
from fusegraph.targets.gpu.kernel_writer import TRITON_TYPES, CodegenError, Index, KernelInputs, KernelWriter, Tile, var
from fusegraph.targets.gpu.templates.registry import lowers

LOG2E = 1.4426950408889634

# (BM, BN, warps, stages) best first for the H200 by head size; the first fits d = 64 at
# sequence 197 to 512 (FlashAttention-2's forward tile), the small ones short sequences
CONFIGS = {
    32: [(128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 3), (64, 32, 4, 2), (128, 128, 8, 3), (32, 32, 2, 2)],
    64: [(128, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3), (128, 128, 8, 2), (64, 32, 4, 2),
         (32, 32, 2, 2)],
    128: [(128, 64, 8, 2), (128, 32, 4, 3), (64, 64, 4, 2), (128, 64, 4, 2), (64, 32, 4, 2), (128, 128, 8, 1),
          (32, 32, 2, 2)],
}


def _pow2(x: int, lo: int = 16) -> int:
    return max(lo, 1 << (max(1, x) - 1).bit_length())


class AttentionEmitter:
    """Writes one attention kernel's body; `q`, `k`, `v`, `mask` are the anchor's inputs."""

    def __init__(self, module: Module, inputs: KernelInputs, anchor: Instruction, allow_tf32: bool, interpret: bool) -> None:
        self.anchor, self.module = anchor, module
        self.q, self.k, self.v = anchor.inputs[:3]
        self.mask = anchor.inputs[3] if len(anchor.inputs) == 4 else None
        dtype = self.q.shape.dtype
        if not dtype.is_float:
            raise CodegenError(f"attention on {dtype} has no GPU template (floating point only)")
        *batch, self.sq, self.d = self.q.shape.lens
        self.sk, self.dv = self.k.shape.lens[-2], self.v.shape.lens[-1]
        self.nb = math.prod(batch)
        self.bd, self.be = _pow2(self.d), _pow2(self.dv)
        self.bi = delinearize(var("gz", self.nb), batch) if batch else ()
        rm, rn, rd, re = var("rm", self.sq), var("rn", self.sk), var("rd", self.d), var("re", self.dv)
        self.q_index: Index = (*self.bi, rm, rd)
        self.k_index: Index = (*self.bi, rn, rd)
        self.v_index: Index = (*self.bi, rn, re)
        self.mask_index: Index = (*self.bi, rm, rn)
        self.out_index: Index = (*self.bi, rm, re)
        self.w = KernelWriter(module, inputs, {id(anchor): self._out_value})
        self.w.raw_loads = {id(x) for x in anchor.inputs[:3] if is_load(x)}
        self.op_t = TRITON_TYPES[dtype]
        if interpret and dtype == DType.bfloat16:
            self.op_t = "tl.float32"  # the interpreter's bf16 dot is wrong
        self.acc_t = "tl.float64" if dtype == DType.float64 else "tl.float32"
        self.precision = "" if dtype != DType.float32 else (
            ', input_precision="tf32"' if allow_tf32 else ', input_precision="ieee"')
        self.out = ""
        self.edge = True  # whether the key tile being written may reach past sk

    def _out_value(self, tile: Tile, index: Index) -> str:
        if index != self.out_index:
            raise CodegenError("the epilogue of an attention kernel reads it at another index")
        return self.out

    def tile(self, axes: dict[str, str]) -> Tile:
        """A tile over the template variables `axes` (each with its broadcast suffix, `[:, None]`),
        masked where a block overruns its extent; `gz` is the program's batch index."""
        extent = {"rm": self.sq, "rn": self.sk, "rd": self.d, "re": self.dv}
        # 0: a constexpr block, always masked; key tiles inside [0, sk) need no key bound
        block = {"rm": 0, "rn": 0 if self.edge else self.sk, "rd": self.bd, "re": self.be}
        names = {v: f"{v}{suffix}" for v, suffix in axes.items()}
        bounds = {v: None if block[v] == extent[v] else f"({v}{suffix} < {extent[v]})" for v, suffix in axes.items()}
        return Tile({**names, "gz": "gz"}, bounds)

    def operand(self, x: Instruction, axes: dict[str, str], index: Index, shape: str) -> str:
        """A Q, K or V tile in the dot's operand type (broadcast where its index ignores an axis)."""
        code = self.w.value(x, self.tile(axes), index)
        return self.w.let(f"tl.broadcast_to({code}, {shape}).to({self.op_t})", "t")

    def dot(self, a: str, b: str, acc: str | None = None) -> str:
        if self.acc_t == "tl.float64":  # no float64 tensor-core dot on every GPU: exact products, summed
            prod = f"tl.sum({a}[:, :, None] * {b}[None, :, :], axis=1)"
            return f"{acc} + {prod}" if acc else prod
        return f"tl.dot({a}, {b}{', ' + acc if acc else ''}{self.precision})"

    def body(self, causal: bool, scale: float) -> None:
        w = self.w
        w.emit("pid_m = tl.program_id(0)")
        w.emit("gz = tl.program_id(1)")
        w.emit("rm = pid_m * BM + tl.arange(0, BM)")
        w.emit(f"rd = tl.arange(0, {self.bd})")
        w.emit(f"re = tl.arange(0, {self.be})")
        q = self.operand(self.q, {"rm": "[:, None]", "rd": "[None, :]"}, self.q_index, f"[BM, {self.bd}]")
        w.emit(f'm_i = tl.full([BM], float("-inf"), {self.acc_t})')
        w.emit(f"l_i = tl.zeros([BM], dtype={self.acc_t})")
        w.emit(f"acc = tl.zeros([BM, {self.be}], dtype={self.acc_t})")
        for start, end, edge in self._key_ranges(causal):
            with w.block(f"for n0 in range({start}, {end}, BN):"):
                self._key_tile(q, causal, scale, edge)
        w.emit("l_i = tl.where(l_i == 0.0, 1.0, l_i)")  # a row that sees no key: zeros, as the reference
        self.out = w.let("acc / l_i[:, None]", "o")
        tile = self.tile({"rm": "[:, None]", "re": "[None, :]"})
        for ret in self.module.returns:  # the group's value, then its further outputs
            w.store(ret, tile, self.out_index)

    def _key_ranges(self, causal: bool) -> list[tuple[str, str, bool]]:
        """The key loops: (start, end, whether its tiles need the causal or tail test). Causal:
        the tiles every row of the block sees in full, then those crossing its diagonal up to
        the last key its last row sees (j <= i + sk - sq); otherwise the whole tiles, then a
        tail tile where BN does not divide sk (a constexpr range, empty when it does)."""
        off = self.sk - self.sq
        if causal:
            self.w.emit(f"lo = (pid_m * BM + {off + 1}) // BN * BN")
            self.w.emit(f"hi = tl.minimum((pid_m + 1) * BM + {off}, {self.sk})")
            return [("0", "lo", False), ("lo", "hi", True)]
        if self.sk % 128 == 0:  # every BN divides it
            return [("0", str(self.sk), False)]
        whole = f"{self.sk} // BN * BN"
        return [("0", whole, False), (whole, str(self.sk), True)]

    def _key_tile(self, q: str, causal: bool, scale: float, edge: bool) -> None:
        """One key tile (`edge`: one that crosses the diagonal or the key tail): scores, the
        online softmax update and the product with V. Without a
        mask the running max is in log2 units and scale * log2(e) multiplies the raw scores
        inside the exponent's subtraction (one fused multiply-add per score); with one the
        scores stay in natural units, so that a finite fill (finfo.min) stays finite."""
        w = self.w
        self.edge = edge
        w.emit("rn = n0 + tl.arange(0, BN)")
        kt = self.operand(self.k, {"rd": "[:, None]", "rn": "[None, :]"}, self.k_index, f"[{self.bd}, BN]")
        factor = scale * LOG2E
        if self.mask is not None:
            mask = w.value(self.mask, self.tile({"rm": "[:, None]", "rn": "[None, :]"}), self.mask_index)
            w.emit(f"s = {self.dot(q, kt)} * {scale!r} + {mask}")
        elif factor > 0:  # max(s) * factor is the max of the scaled scores
            w.emit(f"s = {self.dot(q, kt)}")
        else:
            w.emit(f"s = {self.dot(q, kt)} * {factor!r}")
        if edge and causal:  # keeps every stored row's keys below sk too
            w.emit(f's = tl.where(rn[None, :] <= rm[:, None] + {self.sk - self.sq}, s, float("-inf"))')
        elif edge:
            w.emit(f's = tl.where(rn[None, :] < {self.sk}, s, float("-inf"))')
        if self.mask is not None:
            w.emit("m_new = tl.maximum(m_i, tl.max(s, 1))")
            w.emit('m_use = tl.where(m_new == float("-inf"), 0.0, m_new)')  # a row with no key seen yet
            w.emit(f"alpha = tl.exp2((m_i - m_use) * {LOG2E!r})")
            w.emit(f"p = tl.exp2((s - m_use[:, None]) * {LOG2E!r})")
        else:
            scaled = f" * {factor!r}" if factor > 0 else ""
            w.emit(f"m_new = tl.maximum(m_i, tl.max(s, 1){scaled})")
            w.emit('m_use = tl.where(m_new == float("-inf"), 0.0, m_new)')
            w.emit("alpha = tl.exp2(m_i - m_use)")
            w.emit(f"p = tl.exp2(s{scaled} - m_use[:, None])")
        w.emit("l_i = l_i * alpha + tl.sum(p, 1)")
        v = self.operand(self.v, {"rn": "[:, None]", "re": "[None, :]"}, self.v_index, f"[BN, {self.be}]")
        w.emit(f"acc = {self.dot(f'p.to({self.op_t})', v, 'acc * alpha[:, None]')}")
        w.emit("m_i = m_new")
        self.edge = True


def attention_configs(sq: int, sk: int, d: int, itemsize: int, heads: int) -> list[Config]:
    """Candidates best first: the head size's list, tiles no larger than the sequence needs,
    K and V pipelines that fit in shared memory. When 128-row blocks over all `heads` (batch
    times heads) leave multiprocessors idle (ViT-S at batch 1: 2 x 6 programs), the largest
    blocks that still fill the GPU come first, then those giving the most programs."""
    shapes = CONFIGS[min(CONFIGS, key=lambda h: abs(h - d))]
    device = current_device()
    budget = device.shared_bytes_per_block - 16 * 1024
    out = []
    for bm, bn, warps, stages in shapes:
        bm, bn = min(bm, _pow2(sq)), min(bn, _pow2(sk))
        c = {"BM": bm, "BN": bn, "num_warps": min(warps, max(1, bm // 16)), "num_stages": stages}
        if (bm * d + stages * bn * 2 * d) * itemsize <= budget and c not in out:
            out.append(c)

    def fills(c: Config) -> bool:
        return -(-sq // c["BM"]) * heads >= device.sm_count

    if out and not fills(out[0]):
        out.sort(key=lambda c: (0, -c["BM"]) if fills(c) else (1, c["BM"]))
    return out or [{"BM": 16, "BN": 16, "num_warps": 1, "num_stages": 1}]


@lowers("attention")
def attention_kernel(name: str, kernel: str, module: Module, inputs: KernelInputs, anchor: Instruction,
                     allow_tf32: bool = False, interpret: bool = False) -> KernelSource:
    """The kernel of fused group `module` around attention anchor `anchor`."""
    e = AttentionEmitter(module, inputs, anchor, allow_tf32, interpret)
    causal, scale = anchor.op.attrs["causal"], anchor.op.attrs["scale"]
    e.body(causal, scale)
    args = e.w.arg_list()
    body = signature(name, args, ["BM", "BN"]) + "\n" + "\n".join(e.w.lines) + "\n"
    itemsize = anchor.inputs[0].shape.dtype.itemsize
    flops = 2 * e.nb * e.sq * e.sk * (e.d + e.dv) // (2 if causal else 1)
    return KernelSource(name, kernel, "attention", body, args, attention_configs(e.sq, e.sk, e.bd, itemsize, e.nb),
                        [(e.sq, "BM", None), (e.nb, None, None)], flops=flops)
