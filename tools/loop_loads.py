"""Count the global loads in the main loop of every GEMM and depthwise kernel of a model, from sm_90 PTX.

A convolution whose A tile is loaded element by element (`ld.global.b16`) instead of with
16-byte asynchronous copies (`cp.async`) runs several times slower on a Hopper GPU. Which one
Triton emits depends on what its alignment analysis proves, and that differs between Triton
versions: 3.9 (CI's) proved `k0 % C` aligned where 3.6 (the H200's) did not. Run this under
the Triton version of the GPU machine; no GPU is needed:

    python3.11 -m venv /tmp/v36 && /tmp/v36/bin/pip install triton==3.6.0 numpy==2.4.6 \\
        onnx==1.23.2 ml_dtypes==0.7.0 protobuf==7.36.2
    PYTHONPATH=. /tmp/v36/bin/python tools/loop_loads.py yolov5s [--fp32]

For batch 32, pass the graph `bench/yolov5s.py --batch 32 --save-onnx FILE` writes (its tile
choices differ).

One line per GEMM kernel (its default config): scalar 2-byte loads, vector loads and
asynchronous copies per thread per iteration of its k loop; per depthwise kernel, the same over
its tap loop (the whole kernel when the taps are unrolled).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LOOP = re.compile(r"Inner Loop Header.*?\n(.*?)bra\s+\$L__BB\d+_\d+;", re.S)


def loop_loads(ptx: str, whole_without_loop: bool = False) -> tuple[int, int, int]:
    """(scalar, vector, cp.async) global loads in the first inner loop of `ptx` (with
    `whole_without_loop`, in all of it when it has no loop)."""
    m = LOOP.search(ptx)
    body = m.group(1) if m else ptx if whole_without_loop else ""
    scalar = len(re.findall(r"ld\.global\.(?:b16|b32)\b", body))
    return scalar, len(re.findall(r"ld\.global\.v\d", body)), len(re.findall(r"cp\.async\.c[ag]", body))


def main(argv: list[str] | None = None) -> int:
    import onnx
    import triton

    import fusegraph
    import fusegraph.zoo
    from fusegraph.ir.dtypes import DType
    from fusegraph.passes.to_half import ToHalf
    from fusegraph.targets.gpu.ahead_of_time import arg_dtypes, build_for
    from fusegraph.targets.gpu.codegen import program_kernels

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="zoo name or .onnx file")
    ap.add_argument("--fp32", action="store_true", help="float32 kernels (default: fp16, as the benchmarks)")
    args = ap.parse_args(argv)
    model = fusegraph.zoo.load(args.model) if fusegraph.zoo.is_zoo_name(args.model) else onnx.load(args.model)
    program = fusegraph.parse_onnx(model)
    if not args.fp32:
        ToHalf(DType.float16, keep_wide=True).apply(program.main)
    fusegraph.fuse(program)
    fused = [i for i in program.main if i.op.name == "fused"]
    print(f"triton {triton.__version__}, sm_90, per thread per k iteration: scalar / vector / cp.async loads")
    for ins, src in zip(fused, program_kernels(program)):
        if src.template not in ("gemm", "depthwise"):
            continue
        ptx = build_for(src, arg_dtypes(ins, src)).asm["ptx"]
        scalar, vector, copies = loop_loads(ptx, whole_without_loop=src.template == "depthwise")
        flag = "  <- element by element" if scalar else ""
        print(f"{src.name[:48]:48s} {scalar:4d} {vector:4d} {copies:4d}{flag}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
