"""The `fusegraph` command line.

Every command takes MODEL as a path to an .onnx file or a zoo name (`fusegraph zoo` lists
them). User errors (bad file, unsupported op, wrong input) print one line and exit 2;
`verify` exits 1 when a comparison fails.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from fusegraph.errors import FusegraphError

if TYPE_CHECKING:
    from fusegraph.ir.program import Program

EPILOG = "MODEL is a path to an .onnx file or a zoo name (see `fusegraph zoo`)."


class _StoreOnce(argparse._StoreAction):
    """A single-value option given twice is an error: silently keeping the last value hides
    a mistake (`--target ref ... --target gpu`)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        given = namespace.__dict__.setdefault("_given_options", set())
        if self.dest in given:
            raise argparse.ArgumentError(self, "given more than once; give it once")
        given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


class _Parser(argparse.ArgumentParser):
    """Command-line mistakes print one `fusegraph: error: ` line, like every other user error.
    Options that take one value may be given once (`_StoreOnce` is the default action)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"fusegraph: error: {message} (see `{self.prog} --help`)\n")


def _number(text: str, kind: type) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None


def _non_negative_int(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _tolerance(text: str) -> float:
    value = _number(text, float)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite non-negative number, got {text}")
    return value


def _directory(text: str) -> str:
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not an existing directory")
    return text


def _batch(text: str) -> tuple[int, int]:
    """`N` -> (N, N); `LO..HI` -> (LO, HI), both positive and LO <= HI."""
    lo, sep, hi = text.partition("..")
    try:
        pair = (int(lo), int(hi) if sep else int(lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a batch size N or a range LO..HI (e.g. 8 or 1..32), got {text!r}") from None
    if pair[0] < 1 or pair[1] < pair[0]:
        raise argparse.ArgumentTypeError(f"expected positive batch sizes with LO <= HI, got {text!r}")
    return pair


def _model_args(p: argparse.ArgumentParser, saved: bool = False, batch: bool = False) -> None:
    p.add_argument("model", metavar="MODEL",
                   help="an .onnx file, a zoo name" + (" or a saved program (.fgx)" if saved else ""))
    p.add_argument("--input-dim", action="append", metavar="NAME:D0,D1,...",
                   help="fix the dimensions of an input, e.g. images:1,3,640,640 (repeatable)")
    if batch:
        p.add_argument("--batch", type=_batch, metavar="N|LO..HI",
                       help="re-batch a model whose batch dimension is 1 or symbolic to N samples; compile "
                            "LO..HI -o FILE.fgx: one program per power of two in the range (a dynamic batch), "
                            "whose run and verify take the request's batch N (default: the largest)")


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="take an input from a .npy file (repeatable); others are random")
    p.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the random inputs (default 0)")


def _precision_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--fp16", action="store_true", help="convert weights and inputs to float16 (fp32 accumulation)")
    g.add_argument("--bf16", action="store_true", help="convert weights and inputs to bfloat16 (fp32 accumulation)")
    p.add_argument("--allow-tf32", action="store_true", help="let fp32 matrix products use tf32 tensor cores")


def _load(args: argparse.Namespace, model: Any = None) -> "Program":
    """The program of `args.model` (or of an already loaded `model`), with `--input-dim` applied."""
    from fusegraph import api
    from fusegraph.driver.inputs import parse_input_dims

    return api.parse_onnx(args.model if model is None else model, input_dims=parse_input_dims(args.input_dim),
                          batch=_one_batch(args))


def _one_batch(args: argparse.Namespace) -> int | None:
    """`--batch N` for a model parsed at one batch; a range there is a mistake worth one line."""
    batch = getattr(args, "batch", None)
    if batch is not None and batch[0] != batch[1]:
        from fusegraph.errors import ArgumentError

        raise ArgumentError(f"--batch {batch[0]}..{batch[1]} compiles a dynamic batch: `fusegraph compile MODEL "
                            "--batch LO..HI -o FILE.fgx`, then run or verify FILE.fgx with --batch N")
    return batch[0] if batch else None


def _fuse(program: "Program", args: argparse.Namespace) -> None:
    if getattr(args, "fused", False):
        from fusegraph import api

        api.fuse(program)


def cmd_read(args: argparse.Namespace) -> int:
    program = _load(args)
    print(program, end="")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from fusegraph import api
    from fusegraph.driver.inputs import input_ranges, load_inputs

    from fusegraph.driver.saved_files import input_shapes, is_saved_file, runnable

    if is_saved_file(args.model):
        program, target = runnable(args)
    else:
        program, target = _load(args), "ref"
        _fuse(program, args)
    inputs = load_inputs(args.input, input_shapes(program, args), args.seed, input_ranges(program))
    start = time.perf_counter()
    outputs = api.run(program, inputs, target=target)
    elapsed = time.perf_counter() - start
    for name, value in outputs.items():
        value = np.asarray(value)
        print(_summary(name, value))
        if args.save:
            np.save(f"{args.save.rstrip('/')}/{_safe(name)}.npy", value)
    print(f"ran on the {target} target in {elapsed * 1e3:.1f} ms")
    return 0


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _summary(name: str, v: np.ndarray) -> str:
    head = f"{name}: {v.dtype.name} {list(v.shape)}"
    if v.size == 0:
        return head + " (empty)"
    if v.dtype.kind in "fiub":
        f = v.astype(np.float64)
        finite = np.isfinite(f)
        stats = f"min {np.nanmin(f):.6g}, max {np.nanmax(f):.6g}, mean {np.nanmean(f):.6g}, std {np.nanstd(f):.6g}"
        bad = f", {np.count_nonzero(~finite)} non-finite" if not finite.all() else ""
        first = ", ".join(f"{x:.6g}" for x in f.reshape(-1)[:5])
        return f"{head} {stats}{bad}; first: [{first}{', ...' if v.size > 5 else ''}]"
    return head


def _gpu_options(args: argparse.Namespace) -> dict[str, Any]:
    from fusegraph.targets.gpu.compiled_program import progress_printer

    return {"fp16": args.fp16, "bf16": args.bf16, "allow_tf32": args.allow_tf32,
            "tune": not args.no_tune, "exhaustive_tune": args.exhaustive_tune, "progress": progress_printer()}


def _verify_gpu(args: argparse.Namespace) -> int:
    """The gpu target against the (unfused, fp32) reference target on the same inputs."""
    from fusegraph import api
    from fusegraph.driver.inputs import input_ranges, load_inputs

    program = _load(args)
    compiled = api.compile(program, "gpu", **_gpu_options(args))
    inputs = load_inputs(args.input, program.input_shapes, args.seed, input_ranges(program))
    want = api.run(program, inputs, target="ref")
    compiled.poison()
    got = api.run(compiled, inputs)
    tolerance = args.tolerance if args.tolerance is not None else (1e-2 if args.fp16 or args.bf16 else
                                                                    (1e-3 if args.allow_tf32 else 1e-4))
    mode = "fp16" if args.fp16 else "bf16" if args.bf16 else ("fp32, tf32 products" if args.allow_tf32 else "fp32")
    where = "Triton interpreter (CPU)" if compiled.interpreted else "GPU"
    print(f"fusegraph gpu target ({mode}, {compiled.kernel_count} kernels, {where}) vs ref target, seed {args.seed}:")
    code = _report({k: np.asarray(got[k]).astype(v.dtype) for k, v in want.items()}, want, tolerance)
    if code or args.bisect:
        from fusegraph.driver.bisect import bisect, report

        text, agree = report(bisect(compiled, inputs, tolerance))
        print(text)
        code = code or (0 if agree else 1)
    return code


def _report(ours: dict[str, np.ndarray], reference: dict[str, np.ndarray], tolerance: float) -> int:
    """One comparison line per output, then PASS or FAIL; the exit code of `verify`."""
    from fusegraph.driver.verify import compare

    ok = True
    for name, value in ours.items():
        c = compare(name, value, reference[name], tolerance)
        print("  " + c.line())
        ok &= c.passed
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def cmd_perf(args: argparse.Namespace) -> int:
    from fusegraph import api
    from fusegraph.driver.inputs import input_ranges, load_inputs
    from fusegraph.driver.perf import chrome_trace, perf_report
    from fusegraph.targets.gpu.availability import require_gpu_device

    from fusegraph.driver.saved_files import is_saved_file, timed_saved

    if is_saved_file(args.model):
        _reject_gpu_options(args, f"{args.model} was compiled with its own options")
        require_gpu_device("perf")
        compiled = timed_saved(args)
    else:
        _one_batch(args)  # a mistake in the arguments is told before the missing GPU
        require_gpu_device("perf")
        program = _load(args)
        compiled = api.compile(program, "gpu", **_gpu_options(args))
        api.run(compiled, load_inputs(args.input, program.input_shapes, args.seed, input_ranges(program)))
    print(perf_report(compiled, args.iterations, args.configs))
    if args.trace:
        with open(args.trace, "w") as f:
            f.write(chrome_trace(compiled))
        print(f"Chrome trace of one run written to {args.trace}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from fusegraph import api
    from fusegraph.driver.inputs import input_ranges, load_inputs, parse_input_dims
    from fusegraph.driver.verify import run_onnxruntime
    from fusegraph.onnx.loader import load_model

    from fusegraph.driver.saved_files import is_saved_file

    if is_saved_file(args.model):
        return _verify_saved(args)
    if args.target == "gpu":
        return _verify_gpu(args)
    if args.bisect:
        from fusegraph.errors import ArgumentError

        raise ArgumentError("--bisect compares the gpu target's kernels one by one: add --target gpu")
    _reject_gpu_options(args)
    if args.tolerance is None:
        args.tolerance = 1e-5
    model = load_model(args.model)
    dims = parse_input_dims(args.input_dim)
    batch = _one_batch(args)
    if batch is not None:  # ONNX Runtime runs the re-batched model too
        model, dims = api.rebatched(model, batch, dims)
    program = api.parse_onnx(model, input_dims=dims)
    label = "ref target"
    if args.fused:
        _fuse(program, args)
        label += ", fused"
    inputs = load_inputs(args.input, program.input_shapes, args.seed, input_ranges(program))
    ours = api.run(program, inputs, target="ref")
    theirs = run_onnxruntime(model.SerializeToString(), inputs)
    print(f"fusegraph ({label}) vs ONNX Runtime (CPU), seed {args.seed}:")
    return _report(ours, theirs, args.tolerance)


def _verify_saved(args: argparse.Namespace) -> int:
    """A .fgx file has no ONNX model to hand ONNX Runtime: what it compiles to (a saved Program:
    compiled for --target) is checked against its own program, unfused and fp32, on the ref target."""
    from fusegraph import api
    from fusegraph.driver.inputs import input_ranges, load_inputs
    from fusegraph.driver.saved_files import load_saved
    from fusegraph.dynamic_batch import DynamicBatchProgram

    loaded = load_saved(args)
    if isinstance(loaded, DynamicBatchProgram):
        from fusegraph.driver.saved_files import verify_dynamic

        _reject_gpu_options(args, f"{args.model} was compiled with its own options")
        return _report(*verify_dynamic(args, loaded))
    target = api.compiled_target(loaded)
    if target is None:
        program = loaded
        if args.target == "ref":
            _reject_gpu_options(args)
            compiled = api.compile(api.fuse(program) if args.fused else program, "ref")
        else:
            compiled = api.compile(program, "gpu", **_gpu_options(args))
    else:
        _reject_gpu_options(args, f"{args.model} was compiled with its own options")
        program, compiled = loaded.source_program, loaded
    options = compiled.source_options
    fp32 = not (options["fp16"] or options["bf16"])
    tolerance = args.tolerance if args.tolerance is not None else (
        1e-5 if options["target"] == "ref" and fp32 else 1e-4 if fp32 and not options["allow_tf32"] else
        1e-3 if fp32 else 1e-2)
    inputs = load_inputs(args.input, program.input_shapes, args.seed, input_ranges(program))
    got = api.run(compiled, {k: v.astype(compiled.input_shapes[k].dtype.numpy) for k, v in inputs.items()})
    want = api.run(program, inputs, target="ref")
    mode = "fp32" if fp32 else "fp16" if options["fp16"] else "bf16"
    print(f"fusegraph ({args.model}: {options['target']} target, {mode}) vs ref target, seed {args.seed}:")
    return _report({k: np.asarray(got[k]).astype(v.dtype) for k, v in want.items()}, want, tolerance)


GPU_ONLY_OPTIONS = {"fp16": "--fp16", "bf16": "--bf16", "allow_tf32": "--allow-tf32", "no_tune": "--no-tune",
                    "exhaustive_tune": "--exhaustive-tune"}


def _reject_gpu_options(args: argparse.Namespace, why: str = "") -> None:
    """`verify` on the ref target compares fp32 with ONNX Runtime's fp32 (and a compiled .fgx
    file brings its own options): a precision or tuning option would be ignored there, so asking
    for one is a mistake worth one line."""
    given = [flag for dest, flag in GPU_ONLY_OPTIONS.items() if getattr(args, dest)]
    if given:
        from fusegraph.errors import ArgumentError

        raise ArgumentError(f"{' and '.join(given)} does not apply: {why}" if why else
                            f"{' and '.join(given)} applies to the gpu target only: add --target gpu "
                            "(the ref target checks fp32 against ONNX Runtime)")


def cmd_compile(args: argparse.Namespace) -> int:
    from fusegraph.passes.pipeline import compile_program

    saved = None
    if args.batch and args.batch[0] != args.batch[1]:
        from fusegraph.driver.saved_files import write_dynamic

        print(write_dynamic(args))
        return 0
    _reject_saving_options(args)
    program = _load(args)
    if args.output:
        from fusegraph.driver.saved_files import write_compiled

        saved = write_compiled(args, program)  # before the passes below change the program in place
    if args.fp16 or args.bf16:
        from fusegraph.ir.dtypes import DType
        from fusegraph.passes.to_half import ToHalf

        ToHalf(DType.bfloat16 if args.bf16 else DType.float16, keep_wide=True).apply(program.main)
    report = compile_program(program, trace=args.trace_passes, out=sys.stdout)
    if args.print:
        print(program, end="")
    if args.kernels:
        from fusegraph.targets.gpu.codegen import program_kernels

        for src in program_kernels(program, allow_tf32=args.allow_tf32):
            print(f"# {src.name}: template {src.template}, configs {src.configs}")
            print(src.body)
    print(report)
    if saved:
        print(saved)
    return 0


def _reject_saving_options(args: argparse.Namespace) -> None:
    """--target and --lazy-tune say how `-o` compiles: without -o they would be ignored."""
    if not args.output and (args.target is not None or args.lazy_tune):
        from fusegraph.errors import ArgumentError

        raise ArgumentError(f"{'--target' if args.target is not None else '--lazy-tune'} applies to the program "
                            "compile saves: add -o FILE.fgx")


def cmd_graph(args: argparse.Namespace) -> int:
    from fusegraph.driver.fusion_graph import attach_times, fusion_graph, kernel_count, read_perf
    from fusegraph.driver.fusion_html import render

    program = _fused_program(args)
    graph = fusion_graph(program, model=args.model)
    if args.perf:
        attach_times(graph, read_perf(args.perf), args.perf)
    Path(args.output).write_text(render(graph))
    print(f"wrote {args.output}: {kernel_count(program)} fused kernels")
    return 0


def _fused_program(args: argparse.Namespace) -> "Program":
    """The fused program of MODEL; of a .fgx file, the one it compiles to (a gpu program's own)."""
    import copy

    from fusegraph import api
    from fusegraph.driver.saved_files import is_saved_file, load_saved
    from fusegraph.ops.base import is_fused

    if not is_saved_file(args.model):
        return api.fuse(_load(args))
    loaded = load_saved(args)
    program = loaded if api.compiled_target(loaded) is None else loaded.program
    return program if any(is_fused(i) for i in program.main) else api.fuse(copy.deepcopy(program))


def cmd_serve(args: argparse.Namespace) -> int:
    from fusegraph.driver.serve_cli import serve_command

    return serve_command(args)


def cmd_zoo(args: argparse.Namespace) -> int:
    from fusegraph import zoo

    names = zoo.names()
    width = max(len(n) for n in names)
    for name in names:
        print(f"{name:{width}s}  {zoo.summary(name)}")
    return 0


def cmd_ops(args: argparse.Namespace) -> int:
    from fusegraph.onnx.importer import supported_onnx_ops

    ops = supported_onnx_ops()
    print(f"{len(ops)} supported ONNX ops:")
    print("  " + ", ".join(ops))
    return 0


COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], str]] = {
    "read": (cmd_read, "parse a model and print its program (one line per instruction, lens and strides)"),
    "compile": (cmd_compile, "run the fusion passes and report the fused kernels"),
    "run": (cmd_run, "run a model on the NumPy reference target and summarize its outputs"),
    "verify": (cmd_verify, "compare the reference target with ONNX Runtime (or, with --target gpu, the gpu "
                           "target with the reference target) on the same random inputs"),
    "perf": (cmd_perf, "compile for the GPU and time the program kernel by kernel and end to end"),
    "graph": (cmd_graph, "draw the fused program as an HTML page: one colored box per kernel holding its ops"),
    "serve": (cmd_serve, "serve a model through NVIDIA Triton Inference Server (KServe v2 HTTP and gRPC), or "
                         "write a Triton model repository"),
    "zoo": (cmd_zoo, "list the models built into fusegraph"),
    "ops": (cmd_ops, "list the supported ONNX ops"),
}


def _version() -> str:
    """The installed distribution's version; the package's own when it runs from a source tree
    that is not installed (the two agree in a release)."""
    from importlib import metadata

    try:
        return metadata.version("fusegraph")
    except metadata.PackageNotFoundError:
        from fusegraph import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fusegraph", description="An ONNX inference compiler that fuses "
                                     "convolutions and matrix products with pointwise ops and layout changes.",
                                     epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"fusegraph {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (fn, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".", epilog=EPILOG)
        p.set_defaults(func=fn)
        if name in ("read", "compile", "run", "verify", "perf", "graph"):
            _model_args(p, saved=name in ("run", "verify", "perf", "graph"), batch=name not in ("read", "graph"))
        if name in ("run", "verify", "perf"):
            _run_args(p)
        if name in ("run", "verify"):
            p.add_argument("--fused", action="store_true", help="run the fused program (after the fusion passes)")
            p.add_argument("--verbose", action="store_true",
                           help="for a .fgx MODEL: print the phases of loading it and their times (as FUSEGRAPH_TIMING=1)")
        if name in ("compile", "verify", "perf"):
            _precision_args(p)
        if name in ("verify", "perf"):
            p.add_argument("--no-tune", action="store_true", help="use each kernel's default block sizes")
            p.add_argument("--exhaustive-tune", action="store_true", help="time every candidate config of each kernel")
        if name == "run":
            p.add_argument("--save", metavar="DIR", type=_directory, help="save each output as DIR/NAME.npy")
        if name == "verify":
            p.add_argument("--target", choices=("ref", "gpu"), default="ref",
                           help="ref: the reference target vs ONNX Runtime (default); gpu: the gpu target vs the "
                                "reference target")
            p.add_argument("--tolerance", type=_tolerance, default=None,
                           help="largest relative norm error that passes (default 1e-5 for ref; for gpu 1e-4 in "
                                "fp32, 1e-3 with --allow-tf32, 1e-2 in fp16/bf16)")
            p.add_argument("--bisect", action="store_true",
                           help="with --target gpu: compare every fused instruction's output with the reference "
                                "target's, kernel by kernel, and name the first that differs (also done on FAIL)")
        if name == "perf":
            p.add_argument("-n", "--iterations", type=_positive_int, default=100, help="timed runs (default 100)")
            p.add_argument("--trace", metavar="FILE", help="write a Chrome trace (JSON) of one run")
            p.add_argument("--configs", action="store_true",
                           help="show each kernel's launch config (tile sizes, warps, stages) after its time")
        if name == "compile":
            p.add_argument("--print", action="store_true", help="print the fused program")
            p.add_argument("--trace-passes", action="store_true",
                           help="print the program after each pass and the time each pass took")
            p.add_argument("--kernels", action="store_true", help="print the generated Triton source of every kernel")
            p.add_argument("-o", "--output", metavar="FILE.fgx",
                           help="also compile for the gpu target (tuned on a GPU) and save the program there")
            p.add_argument("--target", choices=("gpu", "ref"), default=None,
                           help="with -o: the target the saved program is compiled for (default gpu)")
            p.add_argument("--lazy-tune", action="store_true",
                           help="with -o and --batch LO..HI: tune each batch size at its first run, not now")
        if name == "graph":
            p.add_argument("-o", "--output", metavar="FILE.html", required=True, help="the page to write")
            p.add_argument("--perf", metavar="PERF", help="kernel times: the output of `fusegraph perf MODEL` "
                                                          "saved as text, or its --trace JSON")
        if name == "serve":
            from fusegraph.driver.serve_cli import add_serve_args

            add_serve_args(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    vars(args).pop("_given_options", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            code = args.func(args)
        except FusegraphError as e:
            _flush_warnings(caught)
            print(f"fusegraph: error: {e}", file=sys.stderr)
            return 2
        except BrokenPipeError:
            return 0
    _flush_warnings(caught)
    return code


def _flush_warnings(caught: list[warnings.WarningMessage]) -> None:
    for w in caught:
        if issubclass(w.category, UserWarning):
            print(f"fusegraph: warning: {w.message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
