"""Benchmark: a dynamic batch (one compile for batch 1..32) answering requests of several
batch sizes, end to end (NumPy in, NumPy out) and on the GPU alone. GPU only.

Each request runs the smallest compiled size that holds it, padded on the device; the table
gives the median wall time of `run` per request, the GPU time of the size it ran (CUDA graph
replays between events) and the ratio to the largest size's wall time, so the cost of padding
(batch 17 runs the size-32 program) is a number. Each request's last sample is checked against
the batch-1 program's answer for that sample alone (within 2% of the output's largest value:
fp16 sums in another order).

    PYTHONPATH=. python3 bench/dynamic_batch.py                     # YOLOv5s fp16, 1..32
    PYTHONPATH=. python3 bench/dynamic_batch.py --requests 1,3,17,32 --iters 50 --lazy-tune
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="yolov5s")
    parser.add_argument("--batch", default="1..32", help="LO..HI compiled (default 1..32)")
    parser.add_argument("--requests", default="1,3,17,32", help="request batch sizes, comma separated")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--fp32", action="store_true")
    parser.add_argument("--lazy-tune", action="store_true", help="tune each size at its first run")
    args = parser.parse_args()

    import fusegraph

    lo, _, hi = args.batch.partition("..")
    start = time.perf_counter()
    dynamic = fusegraph.compile_dynamic_batch(args.model, (int(lo), int(hi)), "gpu", fp16=not args.fp32,
                                              lazy_tune=args.lazy_tune)
    print(f"compiled {args.model} for sizes {dynamic.sizes} in {time.perf_counter() - start:.1f} s")
    rng = np.random.default_rng(0)
    rows, largest = [], None
    for b in sorted(int(r) for r in args.requests.split(",")):
        inputs = {k: rng.random((b, *shape)).astype(dtype) for k, (dtype, shape) in dynamic.input_specs.items()}
        out = dynamic.run(inputs)  # tunes a lazily tuned size, captures its graph
        _check(dynamic, inputs, out)
        wall = []
        for _ in range(args.iters):
            t = time.perf_counter()
            dynamic.run(inputs)
            wall.append(time.perf_counter() - t)
        size = dynamic.size_for(b)
        gpu = float(np.median(dynamic.programs[size].time_runs(args.iters)))
        rows.append((b, size, float(np.median(wall)) * 1e3, gpu))
        largest = rows[-1][2]
    print(f"{'request':>8} {'size run':>8} {'wall ms':>9} {'GPU ms':>8} {'wall / largest':>15}")
    for b, size, wall_ms, gpu in rows:
        print(f"{b:>8} {size:>8} {wall_ms:>9.3f} {gpu:>8.3f} {wall_ms / largest:>15.2f}")


def _check(dynamic, inputs, out) -> None:
    """The last sample's answer equals the size-1 program's on that sample alone (when 1 is a size)."""
    if 1 not in dynamic.sizes:
        return
    last = {k: v[-1:] for k, v in inputs.items()}
    want = dynamic.run(last)
    for name, value in out.items():
        err = float(np.max(np.abs(value[-1:].astype(np.float64) - want[name].astype(np.float64))))
        scale = float(np.max(np.abs(want[name].astype(np.float64)))) or 1.0
        status = "ok" if err <= 2e-2 * scale else "MISMATCH"
        print(f"  batch {len(next(iter(inputs.values())))}: {name} last sample vs batch 1: max abs diff {err:.3g} ({status})")


if __name__ == "__main__":
    main()
