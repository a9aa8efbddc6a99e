"""`.fgx` files where the command line takes a MODEL: `run` and `verify` load one instead of
parsing a model, and `compile -o` writes one."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

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
    loaded = fusegraph.load(args.model, verbose=getattr(args, "verbose", False))
    batch = getattr(args, "batch", None)
    if batch is not None:
        if not isinstance(loaded, fusegraph.DynamicBatchProgram):
            raise ArgumentError(f"--batch does not apply to {args.model}: it was compiled for one batch (compile "
                                "--batch LO..HI -o FILE.fgx makes a file that answers a range)")
        if batch[0] != batch[1]:
            raise ArgumentError(f"--batch {batch[0]}..{batch[1]}: a request has one batch size; give --batch N")
        loaded.size_for(batch[0])  # outside the compiled range: one clear line
    return loaded


def input_shapes(program: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The input shapes `run` draws inputs for: a dynamic batch's at the request's batch
    (`--batch N`, default its largest), any other program's own."""
    from fusegraph.dynamic_batch import DynamicBatchProgram

    if isinstance(program, DynamicBatchProgram):
        return program.input_shapes_at(args.batch[0] if args.batch else program.max_batch)
    return program.input_shapes


def timed_saved(args: argparse.Namespace) -> Any:
    """What `perf FILE.fgx` times: the gpu program it holds, or for a dynamic batch the size that
    `--batch N` (default the largest) runs, after one run on the inputs (which tunes a lazily
    tuned size and captures its CUDA graph)."""
    from fusegraph import api
    from fusegraph.driver.inputs import load_inputs
    from fusegraph.dynamic_batch import DynamicBatchProgram

    loaded = load_saved(args)
    target = api.compiled_target(loaded)
    if target != "gpu":
        raise ArgumentError(f"perf times the gpu target; {args.model} holds "
                            f"{'a program compiled for ' + target if target else 'an uncompiled Program'}")
    loaded.run(load_inputs(args.input, input_shapes(loaded, args), args.seed))
    if isinstance(loaded, DynamicBatchProgram):
        return loaded.programs[loaded.size_for(args.batch[0] if args.batch else loaded.max_batch)]
    return loaded


def verify_dynamic(args: argparse.Namespace, dynamic: Any) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], float]:
    """A dynamic batch's answers at the request's batch, and the ref target's: the program of
    the size that batch runs, fp32 and unfused, fed the request padded as `run` pads it and cut
    back (the padding's invisibility is checked by the tests against per-sample runs)."""
    from fusegraph import api
    from fusegraph.driver.inputs import load_inputs
    from fusegraph.dynamic_batch import pad_to
    from fusegraph.ir.shape import Shape

    batch = args.batch[0] if args.batch else dynamic.max_batch
    size = dynamic.size_for(batch)
    source = dynamic.programs[size].source_program
    shapes = {k: Shape.of(v.dtype, [batch, *v.lens[1:]]) for k, v in source.input_shapes.items()}
    inputs = load_inputs(args.input, shapes, args.seed)
    got = dynamic.run(inputs)
    want = api.run(source, {k: pad_to(v, size, v.dtype) for k, v in inputs.items()}, target="ref")
    want = {k: v[:batch] for k, v in want.items()}
    options = dynamic.programs[size].source_options
    fp32 = not (options["fp16"] or options["bf16"])
    tolerance = args.tolerance if args.tolerance is not None else (
        1e-5 if options["target"] == "ref" and fp32 else 1e-4 if fp32 and not options["allow_tf32"] else
        1e-3 if fp32 else 1e-2)
    mode = "fp32" if fp32 else "fp16" if options["fp16"] else "bf16"
    print(f"fusegraph ({args.model}: {options['target']} target, {mode}, batch {batch} of the size-{size} program) "
          f"vs ref target, seed {args.seed}:")
    return {k: np.asarray(got[k]).astype(v.dtype) for k, v in want.items()}, want, tolerance


def write_dynamic(args: argparse.Namespace) -> str:
    """`compile MODEL --batch LO..HI -o FILE.fgx`: compile and save the dynamic batch; the line that says so."""
    import fusegraph
    from fusegraph.driver.inputs import parse_input_dims
    from fusegraph.targets.gpu.compiled_program import progress_printer

    if not args.output:
        raise ArgumentError(f"--batch {args.batch[0]}..{args.batch[1]} compiles a dynamic batch: save it with -o FILE.fgx")
    if not is_saved_file(args.output):
        raise ArgumentError(f"-o {args.output}: the saved program's file name must end in {SUFFIX}")
    target = args.target or "gpu"
    dynamic = fusegraph.compile_dynamic_batch(args.model, args.batch, target, fp16=args.fp16, bf16=args.bf16,
                                              allow_tf32=args.allow_tf32, lazy_tune=args.lazy_tune,
                                              input_dims=parse_input_dims(args.input_dim), progress=progress_printer())
    fusegraph.save(dynamic, args.output)
    mode = "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"
    tuning = "tuned at first use" if args.lazy_tune else "tuned" if target == "gpu" else "no tuning"
    return (f"saved {args.output}: {target} target, {mode}, batch {args.batch[0]}..{args.batch[1]} as sizes "
            f"{', '.join(map(str, dynamic.sizes))} ({tuning})")


def runnable(args: argparse.Namespace) -> tuple[Any, str]:
    """What `run` runs for a .fgx MODEL and the target it runs on: a compiled program as it was
    compiled, a saved Program on the ref target (fused first with --fused)."""
    import fusegraph
    from fusegraph import api

    loaded = load_saved(args)
    if isinstance(loaded, fusegraph.DynamicBatchProgram):
        if args.fused:
            raise ArgumentError(f"--fused applies to a saved Program; {args.model} holds a dynamic batch")
        return loaded, loaded.target
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
    target = args.target or "gpu"
    options = {"progress": progress_printer()} if target == "gpu" else {}
    compiled = fusegraph.compile(program, target, fp16=args.fp16, bf16=args.bf16, allow_tf32=args.allow_tf32, **options)
    fusegraph.save(compiled, args.output)
    mode = "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"
    if target == "ref":
        return f"saved {args.output}: ref target, {mode}"
    return f"saved {args.output}: gpu target, {mode}, {compiled.kernel_count} kernels with their configs"
