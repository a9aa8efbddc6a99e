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
from fusegraph.ir.index_expr import Expr, bounds
from fusegraph.ir.index_map import delinearize
from fusegraph.ir.program import Instruction, Module
from fusegraph.targets.gpu.kernel_source import KernelSource, signature
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
    rm, rn, rk, gz = var("rm", M), var("rn", N), var("rk", K), var("gz", g)
    n_idx = rm // P
    o = delinearize(rm % P, O) if O else ()
    ci = rk // KK
    kk = delinearize(rk % KK, k_sp) if k_sp else ()
    spatial = [o[j] * a["stride"][j] - a["padding"][j] + kk[j] * a["dilation"][j] for j in range(r)]
    valid = [(spatial[j], 0, X[2 + j]) for j in range(r)]
    return GemmSpec(M, N, K, g, (n_idx, gz * cg + ci, *spatial), (gz * ng + rn, ci, *kk),
                    (n_idx, gz * ng + rn, *o), valid)


def dot_spec(dot: Instruction) -> GemmSpec:
    a, b = dot.inputs
    *batch, M, K = a.shape.lens
    N = b.shape.lens[-1]
    nb = math.prod(batch)
    rm, rn, rk, bz = var("rm", M), var("rn", N), var("rk", K), var("gz", nb)
    bi = delinearize(bz, batch) if batch else ()
    return GemmSpec(M, N, K, nb, (*bi, rm, rk), (*bi, rk, rn), (*bi, rm, rn), [])


def gemm_kernel(name: str, kernel: str, module: Module, inputs: KernelInputs, anchor: Instruction,
                allow_tf32: bool = False, interpret: bool = False) -> KernelSource:
    spec = conv_spec(anchor) if anchor.op.name == "convolution" else dot_spec(anchor)
    dtype = anchor.inputs[0].shape.dtype
    if not dtype.is_float:
        raise CodegenError(f"{anchor.op.name} on {dtype} has no GPU template (floating point only)")
    out_index = spec.out_index

    def acc_value(tile: Tile, index: Index) -> str:
        if index != out_index:
            raise CodegenError(f"the epilogue of {kernel} reads the {anchor.op.name} at another index")
        return "acc"

    w = KernelWriter(module, inputs, {id(anchor): acc_value})
    w.emit("pid_m = tl.program_id(0)")
    w.emit("pid_n = tl.program_id(1)")
    w.emit("gz = tl.program_id(2)")
    w.emit("rm = pid_m * BM + tl.arange(0, BM)")
    w.emit("rn = pid_n * BN + tl.arange(0, BN)")
    w.emit("acc = tl.zeros([BM, BN], dtype=tl.float32)")
    w.emit(f"for k0 in range(0, {spec.k}, BK):")
    w.indent += 1
    w.emit("rk = k0 + tl.arange(0, BK)")
    m_bound = f"(rm[:, None] < {spec.m})"
    n_bound = f"(rn[None, :] < {spec.n})"
    ta = Tile({"rm": "rm[:, None]", "rk": "rk[None, :]", "gz": "gz"},
              {"rm": m_bound, "rk": f"(rk[None, :] < {spec.k})"})
    tb = Tile({"rk": "rk[:, None]", "rn": "rn[None, :]", "gz": "gz"},
              {"rk": f"(rk[:, None] < {spec.k})", "rn": n_bound})
    conds = []
    for e, lo, hi in spec.a_valid:
        blo, bhi = bounds(e)
        if blo < lo:
            conds.append(f"({ta.code(e)} >= {lo})")
        if bhi >= hi:
            conds.append(f"({ta.code(e)} < {hi})")
    a_in, b_in = anchor.inputs
    w.raw_loads = {id(x) for x in anchor.inputs if x.op.name == "load"}
    av = w.value(a_in, ta, spec.a_index, tuple(conds))
    if conds and a_in.op.name != "load":  # a computed prologue is zero in the padding too
        av = w.let(f"tl.where({' & '.join(conds)}, {av}, 0.0)")
    bv = w.value(b_in, tb, spec.b_index)
    operand = TRITON_TYPES[dtype]
    if interpret and dtype == DType.bfloat16:
        operand = "tl.float32"  # the interpreter's bf16 dot is wrong
    precision = "" if dtype != DType.float32 else (', input_precision="tf32"' if allow_tf32 else ', input_precision="ieee"')
    # an operand whose index ignores a tile dim (a size-1 dim) is broadcast to the full tile
    w.emit(f"acc = tl.dot(tl.broadcast_to({av}, [BM, BK]).to({operand}), "
           f"tl.broadcast_to({bv}, [BK, BN]).to({operand}), acc{precision})")
    w.indent -= 1
    te = Tile({"rm": "rm[:, None]", "rn": "rn[None, :]", "gz": "gz"}, {"rm": m_bound, "rn": n_bound})
    (ret,) = module.returns
    w.store(ret, te, out_index)
    args = w.arg_list()
    body = signature(name, args, ["BM", "BN", "BK"]) + "\n" + "\n".join(w.lines) + "\n"
    configs = _configs(spec)
    m, n, batch = spec.m, spec.n, spec.batch
    return KernelSource(name, kernel, "gemm", body, args, configs,
                        [(m, "BM"), (n, "BN"), (batch, None)],
                        flops=2 * spec.m * spec.n * spec.k * spec.batch)


def _pow2(x: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, 1 << (max(1, x) - 1).bit_length()))


def _configs(spec: GemmSpec) -> list[dict[str, int]]:
    """A few tile shapes around the problem's size; the first is the untuned default."""
    bn = _pow2(spec.n, 16, 128)
    bk = _pow2(spec.k, 16, 64)
    out = [{"BM": 64, "BN": bn, "BK": bk, "num_warps": 4, "num_stages": 3}]
    for bm, bn2, bk2, warps, stages in ((128, 128, 32, 8, 3), (64, 64, 32, 4, 4), (128, 64, 64, 4, 3),
                                         (32, 64, 64, 4, 4), (64, 128, 64, 4, 3), (128, 256, 64, 8, 3)):
        c = {"BM": bm, "BN": min(bn2, _pow2(spec.n, 16, 256)), "BK": min(bk2, bk), "num_warps": warps, "num_stages": stages}
        if c not in out:
            out.append(c)
    return out
