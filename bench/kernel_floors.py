"""Per-kernel table of YOLOv5s: each fusegraph kernel's time against its own floor.

Reads the per-kernel lines of a `fusegraph perf` report (measured on the GPU) and joins them
with each kernel's bytes, FLOPs and special-function operations, counted here from the same
fused program: bytes are every input read once (the view's elements for a slice of a larger
buffer; not a buffer the kernel only writes into) plus the elements it stores; FLOPs are
2*M*N*K of its matrix product, or 2 per tap and output of a depthwise convolution (its
template's `flops`); special-function operations (exp2, reciprocal, ...: 16 a clock
per multiprocessor) are SPECIAL_OPS per element of each op that needs them. The floor is the
largest of bytes over the copy bandwidth, FLOPs over the matrix rate (the float32 FMA rate for
a template without tensor cores: depthwise) and special-function operations over their rate; the table is sorted by time lost (time minus floor), so the next
kernel to work on comes first.

    python3 bench/kernel_floors.py PERF_LOG [--model yolov5s] [--batch N] [--fp16] [--bandwidth 4.2e12] [--flops 7.9e14]
                                   [--vector-flops 6.7e13] [--special 4.2e12]
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

# special-function operations per element, as Triton lowers the op on sm_90 (the sigmoid:
# `ex2.approx` and the reciprocal inside `div.full`, in the PTX of the YOLOv5s kernels)
SPECIAL_OPS = {"sigmoid": 2, "exp": 1, "log": 1, "sqrt": 1, "tanh": 2, "sin": 1, "cos": 1}
LINE = re.compile(r"^(@\d+) = (\S+)\(.*\) -> .*: ([0-9.]+)ms, \d+%(?:  \[.*\])?$")  # a config may follow


def kernel_costs(model: str, fp16: bool, batch: int | None = None) -> dict[str, tuple[str, int, int, int, str, str]]:
    """For each fused instruction, by its printed name: kernel name, bytes, FLOPs,
    special-function operations, output shape, template."""
    from fusegraph import parse_onnx
    from fusegraph.ir.dtypes import DType
    from fusegraph.passes.pipeline import fuse
    from fusegraph.passes.to_half import ToHalf
    from fusegraph.targets.gpu.codegen import program_kernels

    program = parse_onnx(model, batch=batch)
    if fp16:
        ToHalf(DType.float16, keep_wide=True).apply(program.main)
    fuse(program)
    sources = program_kernels(program)
    out = {}
    fused = [(pos, ins) for pos, ins in enumerate(program.main.instructions) if ins.op.name == "fused"]
    for (pos, ins), src in zip(fused, sources):
        module = ins.op.module
        params = list(module.params.values())
        read = {id(x) for i in module for x in i.inputs if i.op.name == "load"}
        nbytes = sum(x.shape.elements * x.shape.dtype.itemsize for p, x in zip(params, ins.inputs) if id(p) in read)
        # a multi-output group stores each of its returns
        stored = sum(math.prod(r.op.attrs["map"].out_lens) * r.shape.dtype.itemsize for r in module.returns)
        special = sum(SPECIAL_OPS.get(i.op.name, 0) * i.shape.elements for i in module)
        shape = "x".join(map(str, ins.shape.lens))
        out[f"@{pos}"] = (ins.op.attrs["kernel"], nbytes + stored, src.flops, special, shape, src.template)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("perf_log", type=Path)
    ap.add_argument("--model", default="yolov5s")
    ap.add_argument("--fp16", action="store_true", default=True)
    ap.add_argument("--batch", type=int, default=None, help="the batch the perf report was taken at (its --batch)")
    ap.add_argument("--bandwidth", type=float, default=4.2e12, help="bytes/s (measured copy bandwidth)")
    ap.add_argument("--flops", type=float, default=7.9e14, help="FLOP/s (measured dense fp16/bf16 matrix rate)")
    ap.add_argument("--vector-flops", type=float, default=6.7e13,
                    help="FLOP/s without tensor cores (float32 FMA: 128 lanes on each of 132 multiprocessors at 1.98 GHz)")
    ap.add_argument("--special", type=float, default=4.2e12,
                    help="special-function operations/s (16 a clock on each of the H200's 132 multiprocessors at 1.98 GHz)")
    args = ap.parse_args(argv)
    times = {}
    for line in args.perf_log.read_text().splitlines():
        m = LINE.match(line.strip())
        if m:
            times[m.group(1)] = (m.group(2), float(m.group(3)) * 1e3)
    costs = kernel_costs(args.model, args.fp16, args.batch)
    rows = []
    for name, (kernel, us) in times.items():
        k2, nbytes, flops, special, shape, template = costs[name]
        assert k2 == kernel, f"{name}: the log says {kernel}, the program {k2}"
        rate = args.flops if template == "gemm" else args.vector_flops
        floor = max(nbytes / args.bandwidth, flops / rate, special / args.special) * 1e6
        rows.append((us - floor, name, kernel, shape, us, nbytes, flops, special, floor))
    rows.sort(reverse=True)
    total = sum(r[4] for r in rows)
    total_floor = sum(r[8] for r in rows)
    total_special = sum(r[7] for r in rows) / args.special * 1e6
    print("| kernel | name | output | time us | bytes | MFLOP | special Mop | floor us | time / floor | lost us |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for lost, name, kernel, shape, us, nbytes, flops, special, floor in rows:
        print(f"| {name} | {kernel} | {shape} | {us:.1f} | {nbytes / 1e6:.2f} MB | {flops / 1e6:.0f} | {special / 1e6:.1f} | "
              f"{floor:.2f} | {us / floor:.1f}x | {lost:.1f} |")
    print(f"\nsum of kernel times {total:.1f} us, sum of floors {total_floor:.1f} us (bandwidth "
          f"{args.bandwidth / 1e12:.1f} TB/s, matrix rate {args.flops / 1e12:.0f} TFLOP/s, vector rate "
          f"{args.vector_flops / 1e12:.0f} TFLOP/s, special functions "
          f"{args.special / 1e12:.1f} Top/s); the special-function operations alone take {total_special:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
