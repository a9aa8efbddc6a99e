"""Benchmark: what Triton reaches on the transformer GEMMs under four operand/schedule choices.

Not fusegraph's template: seven small standalone Triton kernels of `C = A @ B + bias` (fp16,
fp32 accumulation, A [M, K] and B [K, N] row-major) that differ only in how they read their
operands and walk their tiles, each timed under eight tile configs against cuBLAS's addmm:

* `ptr`: one program per tile, operands read by pointer loads (Triton pipelines them as
  16-byte asynchronous copies): the template's own form.
* `tma`: one program per tile, operands read through tensor descriptors made in the kernel
  (the Hopper TMA): the template's `FUSEGRAPH_TMA=1` form (templates/gemm_tma.py).
* `tma_p` / `tma_ps`: persistent, one program per multiprocessor walking tiles in groups of 8
  row tiles, the tile loop flattened into the k loop so the next tile's copies overlap this
  one's epilogue; the result stored by pointer / through a descriptor.
* `ptr_p`: the persistent walk with pointer loads.
* `tmah` / `tmah_p`: `tma` and `tma_ps` with descriptors made on the host and passed to the
  kernel by value, so no program makes its own.
* `ws` / `ws_p`: Triton's automatic warp specialization on Hopper (`tl.range(...,
  warp_specialize=True)`: producer warps issue the TMA copies, consumer warp groups the MMAs),
  one program per tile over the k loop / persistent over the tile loop; B is read K-major
  (`[N, K]`, as a weight can be stored at load time), the form Triton's own persistent
  tutorial specializes. `tma_t` is `tma` with the same K-major B, unspecialized, to tell the
  layout's share from the specialization's.

Each contender is a CUDA graph of 20 back-to-back launches, timed by CUDA events over 10
replays (median per launch), cuBLAS the same way; results are checked against addmm. The table
gives each schedule's best time over the configs, its ratio to cuBLAS and the config.
Usage: `PYTHONPATH=. python3 bench/gemm_schedules.py [--only ptr,tma_ps] [--quick]` (a GPU of
compute capability 9.0 or later).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton
import triton.language as tl

from bench.common import bench_parser, selected
from bench.timing import Table, write_results

SHAPES = [("vit qkv", 6304, 384, 1152), ("vit proj", 6304, 384, 384), ("vit fc1", 6304, 384, 1536),
          ("vit fc2", 6304, 1536, 384), ("bert qkv", 4096, 768, 2304), ("bert proj", 4096, 768, 768),
          ("bert fc1", 4096, 768, 3072), ("bert fc2", 4096, 3072, 768)]
VARIANTS = ["ptr", "tma", "tma_p", "tma_ps", "ptr_p", "tmah", "tmah_p", "tma_t", "ws", "ws_p"]
# (BM, BN, BK, warps, stages)
CONFIGS = [(128, 128, 64, 4, 3), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 128, 64, 4, 3), (128, 64, 64, 4, 4),
           (128, 128, 64, 4, 4), (64, 256, 64, 4, 3), (128, 128, 32, 4, 4)]
# The warp-specialized variants split a 128-row tile between two 4-warp consumer groups (and a
# producer group) only at num_warps=4; 64x256 fails to build under Triton 3.6.
WS_CONFIGS = [(128, 128, 64, 4, 3), (128, 128, 64, 4, 4), (128, 256, 64, 4, 3), (128, 256, 64, 4, 2),
              (256, 128, 64, 4, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 3), (128, 256, 32, 4, 4)]


@triton.jit
def k_ptr(a, b, c, bias, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    pid_m = tl.program_id(0); pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM); rn = pid_n * BN + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        rk = tl.multiple_of(k0, BK) + tl.arange(0, BK)
        x = tl.load(a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        y = tl.load(b + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(x, y, acc)
    out = acc + tl.load(bias + rn, mask=rn < N)[None, :].to(tl.float32)
    tl.store(c + rm[:, None] * N + rn[None, :], out.to(tl.float16), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def k_tma(a, b, c, bias, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    pid_m = tl.program_id(0); pid_n = tl.program_id(1)
    ad = tl.make_tensor_descriptor(a, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    bd = tl.make_tensor_descriptor(b, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        acc = tl.dot(ad.load([pid_m * BM, k0]), bd.load([k0, pid_n * BN]), acc)
    rm = pid_m * BM + tl.arange(0, BM); rn = pid_n * BN + tl.arange(0, BN)
    out = acc + tl.load(bias + rn, mask=rn < N)[None, :].to(tl.float32)
    tl.store(c + rm[:, None] * N + rn[None, :], out.to(tl.float16), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def k_tma_p(a, b, c, bias, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr, NPROG: tl.constexpr, TSTORE: tl.constexpr):
    ad = tl.make_tensor_descriptor(a, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    bd = tl.make_tensor_descriptor(b, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    cd = tl.make_tensor_descriptor(c, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    npm = tl.cdiv(M, BM); npn = tl.cdiv(N, BN); tiles = npm * npn
    per_group = GROUP * npn
    for t in tl.range(tl.program_id(0), tiles, NPROG, flatten=True):
        g = t // per_group; first = g * GROUP; gs = min(npm - first, GROUP)
        pid_m = first + (t % per_group) % gs; pid_n = (t % per_group) // gs
        acc = tl.zeros([BM, BN], tl.float32)
        for k0 in range(0, K, BK):
            acc = tl.dot(ad.load([pid_m * BM, k0]), bd.load([k0, pid_n * BN]), acc)
        rn = pid_n * BN + tl.arange(0, BN)
        out = (acc + tl.load(bias + rn, mask=rn < N)[None, :].to(tl.float32)).to(tl.float16)
        if TSTORE:
            cd.store([pid_m * BM, pid_n * BN], out)
        else:
            rm = pid_m * BM + tl.arange(0, BM)
            tl.store(c + rm[:, None] * N + rn[None, :], out, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def k_ptr_p(a, b, c, bias, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr, NPROG: tl.constexpr, TSTORE: tl.constexpr):
    npm = tl.cdiv(M, BM); npn = tl.cdiv(N, BN); tiles = npm * npn
    per_group = GROUP * npn
    for t in tl.range(tl.program_id(0), tiles, NPROG, flatten=True):
        g = t // per_group; first = g * GROUP; gs = min(npm - first, GROUP)
        pid_m = first + (t % per_group) % gs; pid_n = (t % per_group) // gs
        rm = pid_m * BM + tl.arange(0, BM); rn = pid_n * BN + tl.arange(0, BN)
        acc = tl.zeros([BM, BN], tl.float32)
        for k0 in range(0, K, BK):
            rk = tl.multiple_of(k0, BK) + tl.arange(0, BK)
            x = tl.load(a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            y = tl.load(b + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(x, y, acc)
        out = (acc + tl.load(bias + rn, mask=rn < N)[None, :].to(tl.float32)).to(tl.float16)
        tl.store(c + rm[:, None] * N + rn[None, :], out, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def k_tmah(ad, bd, c, bias, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    pid_m = tl.program_id(0); pid_n = tl.program_id(1)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        acc = tl.dot(ad.load([pid_m * BM, k0]), bd.load([k0, pid_n * BN]), acc)
    rm = pid_m * BM + tl.arange(0, BM); rn = pid_n * BN + tl.arange(0, BN)
    out = acc + tl.load(bias + rn, mask=rn < N)[None, :].to(tl.float32)
    tl.store(c + rm[:, None] * N + rn[None, :], out.to(tl.float16), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def k_tmah_p(ad, bd, cd, bias, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr, NPROG: tl.constexpr):
    npm = tl.cdiv(M, BM); npn = tl.cdiv(N, BN); tiles = npm * npn
    per_group = GROUP * npn
    for t in tl.range(tl.program_id(0), tiles, NPROG, flatten=True):
        g = t // per_group; first = g * GROUP; gs = min(npm - first, GROUP)
        pid_m = first + (t % per_group) % gs; pid_n = (t % per_group) // gs
        acc = tl.zeros([BM, BN], tl.float32)
        for k0 in range(0, K, BK):
            acc = tl.dot(ad.load([pid_m * BM, k0]), bd.load([k0, pid_n * BN]), acc)
        rn = pid_n * BN + tl.arange(0, BN)
        cd.store([pid_m * BM, pid_n * BN], (acc + tl.load(bias + rn, mask=rn < N)[None, :].to(tl.float32)).to(tl.float16))


@triton.jit
def k_ws(a, bt, c, bias, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr, WS: tl.constexpr):
    pid_m = tl.program_id(0); pid_n = tl.program_id(1)
    ad = tl.make_tensor_descriptor(a, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    bd = tl.make_tensor_descriptor(bt, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    acc = tl.zeros([BM, BN], tl.float32)
    for kt in tl.range(0, tl.cdiv(K, BK), warp_specialize=WS):
        acc = tl.dot(ad.load([pid_m * BM, kt * BK]), bd.load([pid_n * BN, kt * BK]).T, acc)
    rm = pid_m * BM + tl.arange(0, BM); rn = pid_n * BN + tl.arange(0, BN)
    out = acc + tl.load(bias + rn, mask=rn < N)[None, :].to(tl.float32)
    tl.store(c + rm[:, None] * N + rn[None, :], out.to(tl.float16), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def k_ws_p(a, bt, c, bias, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr, NPROG: tl.constexpr):
    ad = tl.make_tensor_descriptor(a, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    bd = tl.make_tensor_descriptor(bt, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    cd = tl.make_tensor_descriptor(c, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    npm = tl.cdiv(M, BM); npn = tl.cdiv(N, BN); tiles = npm * npn
    per_group = GROUP * npn
    for t in tl.range(tl.program_id(0), tiles, NPROG, flatten=False, warp_specialize=True):
        g = t // per_group; first = g * GROUP; gs = min(npm - first, GROUP)
        pid_m = first + (t % per_group) % gs; pid_n = (t % per_group) // gs
        acc = tl.zeros([BM, BN], tl.float32)
        for kt in range(0, tl.cdiv(K, BK)):
            acc = tl.dot(ad.load([pid_m * BM, kt * BK]), bd.load([pid_n * BN, kt * BK]).T, acc)
        rn = pid_n * BN + tl.arange(0, BN)
        cd.store([pid_m * BM, pid_n * BN], (acc + tl.load(bias + rn, mask=rn < N)[None, :].to(tl.float32)).to(tl.float16))


def graph_time(fn, reps: int = 20, iters: int = 10) -> float:
    """Median microseconds per launch of `fn`, from a CUDA graph of `reps` launches."""
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(reps):
                fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1000 / reps)
    return sorted(times)[len(times) // 2]


def launcher(variant: str, a, b, c, bias, m: int, k: int, n: int, config: tuple[int, ...], sms: int):
    bm, bn, bk, warps, stages = config
    if variant in ("ptr", "tma"):
        kern = k_ptr if variant == "ptr" else k_tma
        return lambda: kern[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
            a, b, c, bias, m, n, k, BM=bm, BN=bn, BK=bk, GROUP=8, num_warps=warps, num_stages=stages)
    programs = min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn))
    if variant in ("tma_t", "ws", "ws_p"):  # B K-major, made once here (a weight's load-time layout)
        bt = b.t().contiguous()
        if variant == "ws_p":
            return lambda: k_ws_p[(programs,)](a, bt, c, bias, m, n, k, BM=bm, BN=bn, BK=bk, GROUP=8, NPROG=programs,
                                               num_warps=warps, num_stages=stages)
        return lambda: k_ws[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
            a, bt, c, bias, m, n, k, BM=bm, BN=bn, BK=bk, GROUP=8, WS=variant == "ws", num_warps=warps, num_stages=stages)
    if variant in ("tmah", "tmah_p"):  # descriptors made on the host, passed by value
        from triton.tools.tensor_descriptor import TensorDescriptor

        ad, bd = TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bk, bn])
        if variant == "tmah":
            return lambda: k_tmah[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
                ad, bd, c, bias, m, n, k, BM=bm, BN=bn, BK=bk, GROUP=8, num_warps=warps, num_stages=stages)
        cd = TensorDescriptor.from_tensor(c, [bm, bn])
        return lambda: k_tmah_p[(programs,)](ad, bd, cd, bias, m, n, k, BM=bm, BN=bn, BK=bk, GROUP=8, NPROG=programs,
                                             num_warps=warps, num_stages=stages)
    kern = k_ptr_p if variant == "ptr_p" else k_tma_p
    return lambda: kern[(programs,)](a, b, c, bias, m, n, k, BM=bm, BN=bn, BK=bk, GROUP=8, NPROG=programs,
                                     TSTORE=variant == "tma_ps", num_warps=warps, num_stages=stages)


def main() -> None:
    args = bench_parser(__doc__, cpu_smoke=False).parse_args()
    variants = [v for v in VARIANTS if selected(v, args.only)]
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        sys.exit("bench/gemm_schedules.py needs a GPU of compute capability 9.0 or later (tensor descriptors)")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    table = Table("best time over the configs, us (ratio to cuBLAS) and config",
                  ["shape", "MxKxN", "cuBLAS us", *variants])
    for name, m, k, n in SHAPES:
        torch.manual_seed(args.seed)
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", dtype=torch.float16) / 20
        bias = torch.randn(n, device="cuda", dtype=torch.float16)
        c = torch.empty(m, n, device="cuda", dtype=torch.float16)
        ref = torch.addmm(bias, a, b).float()
        cublas = graph_time(lambda: torch.addmm(bias, a, b, out=c))
        best: dict[str, tuple[float, str]] = {}
        for variant in variants:
            configs = WS_CONFIGS if variant.startswith("ws") else CONFIGS
            for config in configs[:2] if args.quick else configs:
                fn = launcher(variant, a, b, c, bias, m, k, n, config, sms)
                c.zero_()
                try:
                    fn()
                    torch.cuda.synchronize()
                except Exception as e:  # a config Triton cannot build: said, left out
                    print(f"{name} {variant} {config}: {type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}", file=sys.stderr)
                    continue
                err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
                if err > 1e-2:
                    print(f"{name} {variant} {config}: wrong result ({err:.1e}), left out", file=sys.stderr)
                    continue
                t = graph_time(fn)
                print(f"{name:10s} {variant:7s} {config}: {t:7.1f} us", file=sys.stderr, flush=True)
                label = "{}x{}x{}w{}s{}".format(*config)
                if variant not in best or t < best[variant][0]:
                    best[variant] = (t, label)
        table.add(name, f"{m}x{k}x{n}", f"{cublas:.1f}",
                  *(f"{best[v][0]:.1f} ({best[v][0] / cublas:.2f}) {best[v][1]}" if v in best else "-" for v in variants))
    write_results(args.name or "gemm-schedules", "Triton GEMM schedules vs cuBLAS (torch.addmm), fp16",
                  args.device, [table], save=not (args.quick or args.no_save))


if __name__ == "__main__":
    main()
