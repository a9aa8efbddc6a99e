"""Every tile config of the fused detection-head kernel, timed on the GPU: the search behind
the head's candidate list in `templates/gemm_configs.py`.

Compiles each head level with fusegraph, then launches its one kernel under each config of a
grid (BM, BK, warps, stages; BN is the anchor's 128-wide tile), checks the output against the
float32 reference and reads the kernel's GPU time from the profiler, L2 flushed before each
run (cold) and back to back (hot). Prints one table per level, fastest cold first.

With `--ablate` it times the tuned kernel with parts cut out instead (the sigmoid, the products,
the odd-width stores): the differences between the rows say where the time goes. Those
variants compute wrong outputs on purpose and are not checked.

    PYTHONPATH=. python3 bench/head_configs.py [--levels 80,40,20] [--iters 200] [--ablate]
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import fusegraph
from bench.common import check, exact_fp32
from bench.head import LEVELS, Level, eager_head, head_model, make_weights
from bench.timing import Table, kernel_time
from fusegraph.targets.gpu.bound_program import BoundProgram
from fusegraph.targets.gpu.compiled_program import torch_dtype
from fusegraph.targets.gpu.kernel_loader import load_kernel
from fusegraph.targets.gpu.parallel_compile import compile_all
from fusegraph.targets.gpu.templates.gemm_configs import pipeline_budget, pipeline_bytes


def grid_configs(cin: int, pieces: bool) -> list[dict[str, int]]:
    """BM x BK x warps x stages, BN the 128-wide period tile, no split; with `pieces` each also
    with the tile's columns computed as two narrower products (PIECES, `templates/gemm_emit.py`).
    Stages 1 comes last: under Triton 3.6 some of its configs in pieces make an illegal memory
    access on the H200, after which the CUDA context is unusable."""
    plain = list(itertools.product((32, 64, 128), (32, 64, 128), (4, 8)))
    tiles = [(bm, bk, warps, stages) for stages in (2, 3, 4, 1) for bm, bk, warps in plain]
    out = []
    for (bm, bk, warps, stages), piece in itertools.product(tiles, (0, 1) if pieces else (None,)):
        c = {"BM": bm, "BN": 128, "BK": bk, "SPLIT": 1, "num_warps": warps, "num_stages": stages}
        if piece is not None:
            c["PIECES"] = piece
        if cin % bk == 0 and pipeline_bytes(c, 2) <= pipeline_budget():
            out.append(c)
    return out


@dataclass
class Head:
    """One head level compiled by fusegraph, its one kernel bound to device buffers."""

    level: Level
    bound: BoundProgram
    kernel: Any
    ref: torch.Tensor


def compile_head(level: Level) -> Head:
    w_np, b_np = make_weights(level, 0)
    compiled = fusegraph.compile(fusegraph.parse_onnx(head_model(level, w_np, b_np)), "gpu", fp16=True)
    (kernel,) = compiled.kernels
    x = torch.randn(1, level.cin, level.size, level.size, device="cuda").half()
    with exact_fp32():
        ref = eager_head(x.float(), torch.from_numpy(w_np).cuda().half().float(),
                         torch.from_numpy(b_np).cuda().half().float())
    return Head(level, compiled.bind({"x": x}, capture=False), kernel, ref)


def time_launch(launch: Callable[[], None], iters: int) -> tuple[float, float]:
    """GPU us of one launch, median, L2 cold and hot."""
    cold = kernel_time(launch, iters=iters, warmup=10, flush_l2=True)
    hot = kernel_time(launch, iters=iters, warmup=10)
    return cold.median_us, hot.median_us


def sweep(head: Head, iters: int, tolerance: float) -> Table:
    kernel = head.kernel
    configs = grid_configs(head.level.cin, "PIECES" in kernel.src.configs[0])
    compile_all([(kernel.src, [torch_dtype(b.shape.dtype) for b in kernel.args], c) for c in configs])
    rows = []
    for c in configs:
        def launch() -> None:
            head.bound.launch(kernel, c)

        try:
            launch()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a config Triton rejects is a row, not a crash
            rows.append((float("inf"), c, f"failed: {type(e).__name__}: {e}"[:160].replace("\n", " ")))
            continue
        ok = check(head.bound.outputs()["y"], head.ref, tolerance)
        cold, hot = time_launch(launch, iters)
        rows.append((cold, c, f"{hot:.2f}" + ("" if ok.ok else f" WRONG {ok.err:.1e}")))
    rows.sort(key=lambda r: r[0])
    table = Table(f"head {head.level.label}: chosen {kernel.config}",
                  ["BM", "BK", "warps", "stages", "pieces", "GPU us cold", "GPU us hot"])
    for cold, c, hot in rows:
        table.add(c["BM"], c["BK"], c["num_warps"], c["num_stages"], c.get("PIECES", "-"), f"{cold:.2f}", hot)
    return table


STORE = re.compile(r"^(\s*)tl\.store\(out \+ (.*), (v\d+)\.to\(tl\.float16\)\, mask=(.*)\)$")


def _rewrite(body: str, product: bool = True, sigmoid: bool = True, store: str | None = None) -> str:
    """The kernel body with its products (`tl.dot`), its sigmoid or its store replaced. Every
    constexpr branch is rewritten alike, so the variant holds whichever the config takes."""
    lines = body.split("\n")
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not product and re.match(r"acc\d* = tl\.dot\(", stripped):  # the operand loads then go unused too
            lines[i] = line[: line.index("acc")] + "pass"
        elif not sigmoid and "= tl.sigmoid(" in stripped:
            lines[i] = line.replace("tl.sigmoid(", "(")
        elif store is not None and (m := STORE.match(line)):
            indent, address, value, mask = m.groups()
            rn = re.search(r"\b(rn\d*)\[None, :\]", address)
            lines[i] = indent + store.format(address=address, value=value, mask=mask, rn=rn.group(1) if rn else "rn")
    out = "\n".join(lines)
    if out == body:
        raise ValueError("the kernel body has none of the lines the variant rewrites")
    return out


# name -> (what it leaves out, how the body changes): differences between the rows say where
# the kernel's time goes (the product, the epilogue's math, the odd-width stores, the fixed cost)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "full": ("nothing: the kernel as generated", {}),
    "no-sigmoid": ("the sigmoid", {"sigmoid": False}),
    "aligned-store": ("the 85-wide rows: every tile stores 128 columns into a scratch buffer of 16-byte aligned rows",
                      {"store": "tl.store(ws + (pid_n * tl.num_programs(0) * BM + rm[:, None]) * BN + {rn}[None, :], "
                                "{value}.to(tl.float16))"}),
    "one-row-store": ("all stores but each tile's first row", {"store": "tl.store(out + {address}, {value}.to(tl.float16), "
                                                                        "mask={mask} & (tl.arange(0, BM)[:, None] == 0))"}),
    "no-product": ("the products (no operand loads, no MMA)", {"product": False}),
    "launch-only": ("the products and all stores but one row", {
        "product": False,
        "store": "tl.store(out + {address}, {value}.to(tl.float16), mask={mask} & (tl.arange(0, BM)[:, None] == 0))"}),
}


def variant(kernel: Any, args: list[Any], config: dict[str, int], name: str) -> tuple[Callable[[], None], torch.Tensor]:
    """A launcher of `kernel` rewritten as VARIANTS[name] under `config`, and its scratch
    buffer (passed as the split-k workspace, which a SPLIT 1 kernel does not otherwise use)."""
    grid = kernel.src.grid(config)
    scratch = torch.zeros(grid[0] * grid[1] * config["BM"] * config["BN"], dtype=torch.float16, device=args[0].device)
    args = [scratch if a == "ws" else t for a, t in zip(kernel.src.args, args)]
    change = VARIANTS[name][1]
    fn = load_kernel(replace(kernel.src, body=_rewrite(kernel.src.body, **change) if change else kernel.src.body))
    constexprs, options = kernel.src.launch_arguments(config)

    def launch() -> None:
        fn[grid](*args, **constexprs, **options)

    return launch, scratch


def ablate(head: Head, config: dict[str, int], iters: int) -> Table:
    """The kernel under `config` with parts of it cut out, one variant a row."""
    table = Table(f"head {head.level.label}, parts cut out, config {config}",
                  ["variant", "leaves out", "GPU us cold", "GPU us hot"])
    for name, (what, _) in VARIANTS.items():
        try:
            launch, _ = variant(head.kernel, head.bound.args(head.kernel), config, name)
            launch()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a variant that does not apply is a row, not a crash
            table.add(name, what, f"failed: {type(e).__name__}: {e}"[:120], "")
            continue
        cold, hot = time_launch(launch, iters)
        table.add(name, what, f"{cold:.2f}", f"{hot:.2f}")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="80,40,20", help="grid sizes of the levels to sweep (default 80,40,20)")
    parser.add_argument("--iters", type=int, default=200, help="timed runs per config and L2 state (default 200)")
    parser.add_argument("--tolerance", type=float, default=1e-2,
                        help="largest relative norm error against the float32 reference (default 1e-2)")
    parser.add_argument("--ablate", action="store_true",
                        help="instead of the sweep, time the tuned kernel with parts of it cut out (see VARIANTS)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("head_configs.py times kernels on a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    sizes = {int(s) for s in args.levels.split(",")}
    for cin, size in LEVELS:
        if size not in sizes:
            continue
        head = compile_head(Level(cin, size))
        if args.ablate:
            print(ablate(head, head.kernel.config, args.iters).markdown(), flush=True)
        else:
            print(sweep(head, args.iters, args.tolerance).markdown(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
