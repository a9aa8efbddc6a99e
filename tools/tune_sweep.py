"""Every candidate config of a few kernels, timed on the GPU: the evidence for a candidate order.

An exhaustive tune of a whole zoo model builds hundreds of configs (ConvNeXt-T: 481, more than
270 s on 16 cores). This builds small models holding only the kernels in question, one per
case, tunes each exhaustively with a tuning report (`FUSEGRAPH_TUNING_REPORT`), and prints
`tools/tuning_summary.py`'s table over all of them: per kernel, the best candidate the default
tune times against the best of all.

Cases (ConvNeXt-T's shapes at batch 1):
  convnext_head     global mean -> layernorm(768) -> linear 768x1000: `reduce_mean` and the
                    1-row `layernorm_dot_add`
  convnext_s1..s4   one block of stage 1-4 (96 channels at 56x56 ... 768 at 7x7): depthwise
                    7x7 + bias, to channels-last, layernorm, linear to 4C + erf GELU, linear
                    back, to channels-first, residual add

    PYTHONPATH=. python3 tools/tune_sweep.py [--cases convnext_head,convnext_s2] [--out DIR] [--case-seconds S]

A case that runs past --case-seconds (a config whose build does not end, say) is stopped with
every process it started, and the sweep goes on with the next case.
    python3 tools/tune_sweep.py --write-only DIR   # the ONNX files alone (no GPU needed)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

STAGES = {"convnext_s1": (96, 56), "convnext_s2": (192, 28), "convnext_s3": (384, 14), "convnext_s4": (768, 7)}
CASES = ("convnext_head", *STAGES)


def _model(nodes: list[onnx.NodeProto], x: list[int], weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "sweep", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def head(channels: int = 768, classes: int = 1000) -> onnx.ModelProto:
    """ConvNeXt's classifier: mean over the last map's pixels, layernorm, linear."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[2, 3], keepdims=1),
             helper.make_node("Flatten", ["m"], ["f"], axis=1),
             helper.make_node("LayerNormalization", ["f", "g", "b"], ["n"], axis=-1, epsilon=1e-6),
             helper.make_node("Gemm", ["n", "w", "c"], ["y"], transB=1)]
    return _model(nodes, [1, channels, 7, 7], {"g": 1 + 0.1 * rng.standard_normal(channels), "b": rng.standard_normal(channels),
                                               "w": 0.05 * rng.standard_normal((classes, channels)), "c": rng.standard_normal(classes)})


def block(channels: int, side: int) -> onnx.ModelProto:
    """One ConvNeXt block as the legacy exporter writes it (GELU in its erf form)."""
    rng = np.random.default_rng(1)
    c, h = channels, 4 * channels
    nodes = [helper.make_node("Conv", ["x", "wd", "bd"], ["d"], kernel_shape=[7, 7], pads=[3] * 4, group=c),
             helper.make_node("Transpose", ["d"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t", "g", "b"], ["n"], axis=-1, epsilon=1e-6),
             helper.make_node("MatMul", ["n", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Div", ["a1", "sqrt2"], ["q"]), helper.make_node("Erf", ["q"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["a1", "e1"], ["p"]),
             helper.make_node("Mul", ["p", "half"], ["gl"]),
             helper.make_node("MatMul", ["gl", "w2"], ["m2"]), helper.make_node("Add", ["m2", "b2"], ["a2"]),
             helper.make_node("Mul", ["a2", "gamma"], ["s"]),
             helper.make_node("Transpose", ["s"], ["u"], perm=[0, 3, 1, 2]), helper.make_node("Add", ["u", "x"], ["y"])]
    weights = {"wd": 0.2 * rng.standard_normal((c, 1, 7, 7)), "bd": rng.standard_normal(c),
               "g": 1 + 0.1 * rng.standard_normal(c), "b": rng.standard_normal(c),
               "w1": rng.standard_normal((c, h)) / np.sqrt(c), "b1": rng.standard_normal(h),
               "w2": rng.standard_normal((h, c)) / np.sqrt(h), "b2": rng.standard_normal(c),
               "gamma": 0.1 * rng.standard_normal(c), "sqrt2": np.array(np.sqrt(2.0)), "one": np.array(1.0),
               "half": np.array(0.5)}
    return _model(nodes, [1, c, side, side], weights)


def case_model(case: str) -> onnx.ModelProto:
    if case == "convnext_head":
        return head()
    if case in STAGES:
        return block(*STAGES[case])
    raise SystemExit(f"unknown case {case!r}; the cases: {', '.join(CASES)}")


def run_case(cmd: list[str], env: dict[str, str], log: Path, seconds: float) -> str:
    """Run one case's command with its output in `log`; "rc=N", or what stopped it. The command
    runs in a session of its own, so a timeout ends its build workers with it."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return f"rc={proc.wait(timeout=seconds)}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return f"stopped after {seconds:g} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--out", default="", help="folder for the tuning report and the perf logs (default: a temporary one)")
    parser.add_argument("--write-only", metavar="DIR", help="write the cases' ONNX files to DIR and stop")
    parser.add_argument("--case-seconds", type=float, default=240.0,
                        help="stop a case (and its build workers) after this long and go on (default 240)")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    scratch = Path(tempfile.mkdtemp(prefix="tune-sweep-"))  # the models (up to 19 MB) and a fresh kernel cache
    models = Path(args.write_only) if args.write_only else scratch
    models.mkdir(parents=True, exist_ok=True)
    paths = {c: models / f"{c}.onnx" for c in cases}
    for c, p in paths.items():
        onnx.save(case_model(c), str(p))
    if args.write_only:
        print("\n".join(str(p) for p in paths.values()))
        return 0
    out = Path(args.out) if args.out else scratch
    out.mkdir(parents=True, exist_ok=True)
    report = out / "tuning.jsonl"
    report.unlink(missing_ok=True)
    env = {**os.environ, "FUSEGRAPH_TUNING_REPORT": str(report), "FUSEGRAPH_CACHE_DIR": str(scratch / "cache")}
    for c, p in paths.items():
        cmd = [sys.executable, "-m", "fusegraph.driver.cli", "perf", str(p), "--fp16", "--exhaustive-tune", "--configs"]
        status = run_case(cmd, env, out / f"{c}.log", args.case_seconds)
        total = [line for line in open(out / f"{c}.log") if line.startswith("Total time")]
        print(f"{c}: {status} {total[0].strip() if total else '(no total: see ' + str(out / (c + '.log')) + ')'}", flush=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tuning_summary import main as summary

    return summary([str(report), "--top", "40"]) if report.exists() else 1


if __name__ == "__main__":
    raise SystemExit(main())
