"""Every tile config of the fused detection-head kernel, timed on the GPU: the search behind
the head's candidate list in `templates/gemm.py`.

Compiles each head level with fusegraph, then launches its one kernel under each config of a
grid (BM, BK, warps, stages; BN is the anchor's 128-wide tile), checks the output against the
float32 reference and reads the kernel's GPU time from the profiler, L2 flushed before each
run (cold) and back to back (hot). Prints one table per level, fastest cold first.

    PYTHONPATH=. python3 bench/head_configs.py [--levels 80,40,20] [--iters 200]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import fusegraph
from bench.common import check, exact_fp32
from bench.head import LEVELS, Level, eager_head, head_model, make_weights
from bench.timing import Table, kernel_time
from fusegraph.targets.gpu.compiled_program import torch_dtype
from fusegraph.targets.gpu.parallel_compile import compile_all


def grid_configs(cin: int) -> list[dict[str, int]]:
    """BM x BK x warps x stages, BN the 128-wide period tile, no split."""
    out = []
    for bm, bk, warps, stages in itertools.product((32, 64, 128), (32, 64, 128), (4, 8), (1, 2, 3, 4)):
        if cin % bk or stages * (bm * bk + bk * 128) * 2 > 200 * 1024:
            continue
        out.append({"BM": bm, "BN": 128, "BK": bk, "SPLIT": 1, "num_warps": warps, "num_stages": stages})
    return out


def sweep(level: Level, iters: int, tolerance: float) -> Table:
    w_np, b_np = make_weights(level, 0)
    compiled = fusegraph.parse_onnx(head_model(level, w_np, b_np)).compile(target="gpu", fp16=True)
    (kernel,) = compiled.kernels
    x = torch.randn(1, level.cin, level.size, level.size, device="cuda").half()
    with exact_fp32():
        ref = eager_head(x.float(), torch.from_numpy(w_np).cuda().half().float(),
                         torch.from_numpy(b_np).cuda().half().float())
    tensors, _ = compiled._inputs({"x": x})
    compiled._bound_inputs = tensors
    args = compiled._args(kernel, tensors)
    configs = grid_configs(level.cin)
    compile_all([(kernel.src, [torch_dtype(b.shape.dtype) for b in kernel.args], c) for c in configs])
    rows = []
    for c in configs:
        def launch() -> None:
            kernel.launch(args, c)

        try:
            launch()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a config Triton rejects is a row, not a crash
            rows.append((float("inf"), c, f"failed: {type(e).__name__}"))
            continue
        ok = check(compiled.outputs()["y"], ref, tolerance)
        cold = kernel_time(launch, iters=iters, warmup=10, flush_l2=True)
        hot = kernel_time(launch, iters=iters, warmup=10)
        rows.append((cold.median_us, c, f"{hot.median_us:.2f}" + ("" if ok.ok else f" WRONG {ok.err:.1e}")))
    rows.sort(key=lambda r: r[0])
    table = Table(f"head {level.label}: chosen {kernel.config}",
                  ["BM", "BK", "warps", "stages", "GPU us cold", "GPU us hot"])
    for cold, c, hot in rows:
        table.rows.append([str(c["BM"]), str(c["BK"]), str(c["num_warps"]), str(c["num_stages"]), f"{cold:.2f}", hot])
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="80,40,20", help="grid sizes of the levels to sweep (default 80,40,20)")
    parser.add_argument("--iters", type=int, default=200, help="timed runs per config and L2 state (default 200)")
    parser.add_argument("--tolerance", type=float, default=1e-2,
                        help="largest relative norm error against the float32 reference (default 1e-2)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("head_configs.py times kernels on a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    sizes = {int(s) for s in args.levels.split(",")}
    for cin, size in LEVELS:
        if size in sizes:
            print(sweep(Level(cin, size), args.iters, args.tolerance).markdown(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
