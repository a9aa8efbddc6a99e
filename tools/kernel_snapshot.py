"""Write every fused program and generated kernel of the zoo to text files, to prove a
refactoring changes no kernel.

A change meant to keep behaviour is checked by running this before and after it and comparing
the two folders: each file holds a model's printed fused program, then each kernel's template,
grid, flops, arguments, config list and Triton source, generated for the GPU (no GPU needed; the
device facts default to the H200's on a machine without one, so run both sides on the same kind
of machine). Cases: every zoo model in fp32, and YOLOv5s in fp16 (640, 160, unfolded BN) and at
batch 32 (fp16 and fp32).

    .venv/bin/python tools/kernel_snapshot.py OUT_DIR
    diff -r BEFORE_DIR AFTER_DIR        # no output: the same kernels
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the source tree's fusegraph

from fusegraph import api, zoo  # noqa: E402
from fusegraph.onnx.rebatch import with_batch  # noqa: E402
from fusegraph.ir.dtypes import DType  # noqa: E402
from fusegraph.passes.to_half import ToHalf  # noqa: E402
from fusegraph.targets.gpu.codegen import program_kernels  # noqa: E402
from fusegraph.targets.gpu.returned_views import copy_returned_views  # noqa: E402


def cases() -> list[tuple[str, bool, int]]:
    """(zoo name, fp16, batch) of every snapshot."""
    out = [(name, False, 1) for name in zoo.names()]
    out += [(name, True, 1) for name in ("yolov5s", "yolov5s-160", "yolov5s-bn")]
    return out + [("yolov5s", True, 32), ("yolov5s", False, 32)]


def snapshot(name: str, half: bool, batch: int) -> str:
    """The text of one case: the fused program, then each kernel."""
    model = zoo.load(name)
    program = api.parse_onnx(with_batch(model, batch) if batch != 1 else model)
    if half:
        ToHalf(DType.float16, keep_wide=True).apply(program.main)
    api.fuse(program)
    copy_returned_views(program.main)
    parts = [str(program)]
    for s in program_kernels(program):
        parts.append(f"=== {s.name} {s.template} grid={s.grid_dims} flops={s.flops} "
                     f"default_tune={s.default_tune} args={s.args}\nconfigs={s.configs}\n{s.source}")
    return "\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="folder for one .txt file per case")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, half, batch in cases():
        tag = f"{name}{'-fp16' if half else ''}{f'-b{batch}' if batch != 1 else ''}"
        text = snapshot(name, half, batch)
        (args.out_dir / f"{tag}.txt").write_text(text)
        print(f"{tag}: {text.count('=== ')} kernels", flush=True)


if __name__ == "__main__":
    main()
