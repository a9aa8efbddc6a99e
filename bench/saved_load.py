"""Benchmark: how long a second process takes from `fusegraph.load` to its first outputs, and
whether those outputs are the freshly compiled program's, bit for bit. GPU only.

This process compiles the model (tuned, fp16 by default), runs it on seeded inputs, saves the
program to a .fgx file and the outputs to an .npz file. A fresh Python process then loads the
file with an empty Triton cache (so only the file's stored binaries can spare it compiling),
runs the same inputs and reports: the time to import fusegraph and torch, the load's phases
(FUSEGRAPH_TIMING=1: read, rebuild, generate, weight upload, Triton's work per kernel binary,
the launchers, the CUDA graph of NumPy inputs captured by the load), the first run (with its
first launches and graph capture when the load did not capture it), a second run, how many
kernels Triton compiled (cache entries holding PTX: a stored binary brings only its metadata
and cubin), and whether every output is identical to the fresh compile's.

    PYTHONPATH=. python3 bench/saved_load.py                        # YOLOv5s, fp16, batch 1
    PYTHONPATH=. python3 bench/saved_load.py --batch 1..32 --request 17   # a dynamic batch
    PYTHONPATH=. python3 bench/saved_load.py --fp32 --model yolov5s-160
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np


def compile_and_save(args: argparse.Namespace, folder: Path) -> dict[str, np.ndarray]:
    """Compile, save, and run the program on the seeded inputs; the outputs of that run."""
    import fusegraph

    lo, _, hi = args.batch.partition("..")
    start = time.perf_counter()
    if hi:
        compiled = fusegraph.compile_dynamic_batch(args.model, (int(lo), int(hi)), "gpu", fp16=not args.fp32)
    else:
        program = fusegraph.parse_onnx(args.model, batch=int(lo) if int(lo) != 1 else None)
        compiled = fusegraph.compile(program, "gpu", fp16=not args.fp32)
    print(f"compiled {args.model} in {time.perf_counter() - start:.1f} s")
    fusegraph.save(compiled, folder / "model.fgx")
    print(f"saved {folder / 'model.fgx'}: {(folder / 'model.fgx').stat().st_size / 2**20:.1f} MiB")
    inputs = _inputs(compiled, args)
    np.savez(folder / "inputs.npz", **inputs)
    return compiled.run(inputs)


def _inputs(compiled, args: argparse.Namespace) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(args.seed)
    if hasattr(compiled, "input_specs"):  # a dynamic batch: the request's batch
        request = args.request or compiled.max_batch
        return {k: rng.random((request, *shape)).astype(dtype) for k, (dtype, shape) in compiled.input_specs.items()}
    return {k: rng.random(s.lens).astype(s.dtype.numpy) for k, s in compiled.input_shapes.items()}


SECOND_PROCESS = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import torch
import fusegraph
torch.cuda.init()
t_import = time.perf_counter() - t0
folder = sys.argv[1]
inputs = dict(np.load(folder + "/inputs.npz"))
t1 = time.perf_counter()
loaded = fusegraph.load(folder + "/model.fgx")
t_load = time.perf_counter() - t1
single = hasattr(loaded, "kernels")  # not a dynamic batch: a CompiledProgram with its capture's steps
if single:
    loaded.last_capture = {}
t2 = time.perf_counter()
out = loaded.run(inputs)
torch.cuda.synchronize()
t_first = time.perf_counter() - t2
first_run_steps = dict(loaded.last_capture) if single else None  # {}: the load captured the graph already
t3 = time.perf_counter()
loaded.run(inputs)
torch.cuda.synchronize()
t_second = time.perf_counter() - t3
np.savez(folder + "/loaded.npz", **{k: np.asarray(v) for k, v in out.items()})
print(json.dumps({"import_s": t_import, "load_s": t_load, "first_run_s": t_first, "second_run_s": t_second,
                  "first_run_steps": first_run_steps}))
"""


def second_process(folder: Path) -> dict[str, float]:
    """Load and run in a fresh process with empty Triton and fusegraph caches."""
    env = dict(os.environ, FUSEGRAPH_TIMING="1", TRITON_CACHE_DIR=str(folder / "triton-cache"),
               FUSEGRAPH_CACHE_DIR=str(folder / "fusegraph-cache"))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", SECOND_PROCESS, str(folder)], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    sys.stderr.write(done.stderr)
    if done.returncode:
        raise SystemExit(f"the second process failed (exit {done.returncode})")
    times = json.loads(done.stdout.strip().splitlines()[-1])
    times["process_wall_s"] = wall
    return times


def compiled_kernels(cache: Path) -> int:
    """Triton cache entries holding PTX: kernels Triton compiled rather than took from a stored binary."""
    return sum(1 for _ in cache.rglob("*.ptx")) if cache.exists() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="yolov5s", help="zoo name or .onnx file (default yolov5s)")
    parser.add_argument("--batch", default="1", help="N, or LO..HI for a dynamic batch (default 1)")
    parser.add_argument("--request", type=int, default=None, help="with LO..HI: the request's batch (default HI)")
    parser.add_argument("--fp32", action="store_true", help="compile in fp32 (default fp16)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep the files (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fusegraph-load-") as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        fresh = compile_and_save(args, folder)
        times = second_process(folder)
        loaded = dict(np.load(folder / "loaded.npz"))
        compiled = compiled_kernels(folder / "triton-cache")
    print(f"second process: import fusegraph+torch+CUDA {times['import_s']:.2f} s, load {times['load_s']:.2f} s, "
          f"first run {times['first_run_s']:.2f} s, second run {times['second_run_s'] * 1e3:.1f} ms, "
          f"whole process {times['process_wall_s']:.2f} s")
    steps = times["first_run_steps"]
    if steps is not None:
        print("first run: " + (", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in steps.items()) if steps else
                               "replayed the CUDA graph the load captured"))
    print(f"load + first run: {times['load_s'] + times['first_run_s']:.2f} s; kernels Triton compiled: {compiled}")
    same = True
    for name, want in fresh.items():
        got = loaded[name]
        equal = got.shape == want.shape and np.array_equal(got, want, equal_nan=True)
        diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if got.shape == want.shape else float("nan")
        print(f"  {name} {list(want.shape)}: {'identical' if equal else f'DIFFERENT (max abs diff {diff:.3g})'}")
        same &= equal
    print("PASS" if same and compiled == 0 else "FAIL")


if __name__ == "__main__":
    main()
