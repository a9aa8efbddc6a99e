"""`.fgx` files where the command line takes a MODEL: `run` and `verify` load one instead of
parsing a model, and `compile -o` writes one."""

from __future__ import annotations

import argparse
from typing import Any

from fusegraph.errors import ArgumentError

SUFFIX = ".fgx"


def is_saved_file(model: str) -> bool:
    return str(model).lower().endswith(SUFFIX)


def load_saved(args: argparse.Namespace) -> Any:
    """The Program or compiled program in `args.model`. Its input shapes were fixed when it was
    compiled, so `--input-dim` cannot apply and is refused rather than ignored."""
    import fusegraph

    if getattr(args, "input_dim", None):
        raise ArgumentError(f"--input-dim does not apply to {args.model}: a saved program's input shapes are fixed")
    return fusegraph.load(args.model)


def runnable(args: argparse.Namespace) -> tuple[Any, str]:
    """What `run` runs for a .fgx MODEL and the target it runs on: a compiled program as it was
    compiled, a saved Program on the ref target (fused first with --fused)."""
    from fusegraph import api

    loaded = load_saved(args)
    target = api.compiled_target(loaded)
    if target is not None:
        if args.fused:
            raise ArgumentError(f"--fused applies to a saved Program; {args.model} holds a program compiled for {target}")
        return loaded, target
    if args.fused:
        api.fuse(loaded)
    return api.compile(loaded, "ref"), "ref"


def write_compiled(args: argparse.Namespace, program: Any) -> str:
    """Compile `program` for the gpu target with the precision options of `args` (tuned on a GPU)
    and save it to `args.output`; the line that says so."""
    import fusegraph
    from fusegraph.targets.gpu.compiled_program import progress_printer

    if not is_saved_file(args.output):
        raise ArgumentError(f"-o {args.output}: the saved program's file name must end in {SUFFIX}")
    compiled = fusegraph.compile(program, "gpu", fp16=args.fp16, bf16=args.bf16, allow_tf32=args.allow_tf32,
                                 progress=progress_printer())
    fusegraph.save(compiled, args.output)
    mode = "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"
    return f"saved {args.output}: gpu target, {mode}, {compiled.kernel_count} kernels with their configs"
