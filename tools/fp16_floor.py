"""The error that plain fp16 arithmetic has on a zoo model: the floor that fusegraph's fp16
accuracy figures are read against.

fusegraph's fp16 output is compared with its float32 twin (`bench/models.py`, "rel err vs
fp32"). How large that error may be depends on the weights as much as on the kernels: the
zoo's weights are calibrated to unit-scale activations in every layer, which keeps more signal
in fp16's rounding than a library's small random initialization does. This script runs the
same unfused graph with the same weights as a plain PyTorch module on the CPU
(`bench/torch_reference.py`), once in float32 and once after `ToHalf` (weights, inputs and
every stored value in fp16, as fusegraph compiles it; products as PyTorch's CPU kernels compute
them), and prints the relative norm error of the fp16 run's first output against the fp32 run.

Usage: `python3 tools/fp16_floor.py [--models bert_base,vit_small_patch16_224] [--batch 1]`
(minutes for BERT at sequence 512: CPU fp16 products are slow).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.common import rel_err  # noqa: E402
from bench.models import SPECS, Case, bench_parser  # noqa: E402
from bench.torch_reference import build_module  # noqa: E402
from fusegraph.passes.to_half import ToHalf  # noqa: E402


def fp16_error(name: str, batch: int) -> float:
    """Relative norm error of the graph-generated module's fp16 run against its fp32 run."""
    case = Case(name, batch, bench_parser("").parse_args([]), torch.device("cpu"))
    program = case.program()
    with torch.no_grad():
        want = case.call(build_module(program), torch.float32, generated=True)().float()
        ToHalf().apply(program.main)
        got = case.call(build_module(program), torch.float16, generated=True)().float()
    return float(rel_err(got, want))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="vit_small_patch16_224,deit_small_patch16_224,bert_base,bert_base_s512",
                        help=f"comma-separated zoo models of bench/models.py ({', '.join(SPECS)})")
    parser.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    args = parser.parse_args(argv)
    print("| model | batch | plain fp16 rel err vs fp32 | seconds |\n| --- | --- | --- | --- |")
    for name in args.models.split(","):
        start = time.monotonic()
        err = fp16_error(name, args.batch)
        print(f"| {name} | {args.batch} | {err:.1e} | {time.monotonic() - start:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
