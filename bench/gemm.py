"""Benchmark: fusegraph's GEMM template against cuBLAS on the transformer zoo's batch-32 shapes.

Each shape is one linear layer as an exporter writes it, `MatMul(x[M, K], W[K, N]) + bias`,
fp16: fusegraph compiles it (default tune, or every config with --exhaustive-tune) to one
kernel, the product with its bias add in the epilogue; cuBLAS runs `torch.addmm(bias, x, W)` on
the same fp16 tensors. Both are captured in CUDA graphs and timed by CUDA events per replay
(bench/timing.py). The table gives each side's time and TFLOP/s (2*M*N*K flops), their ratio
and the config the tuner chose, so a tile policy change shows where it helps.

Shapes: ViT-S/16 and DeiT-S at batch 32 (197 tokens, width 384, MLP 1536: M = 6304) and
BERT-base at batch 32, sequence 128 (width 768, MLP 3072: M = 4096): the QKV, projection,
fc1 and fc2 products of one block; and the batch-1 products of BERT (M = 128) and ViT (M = 197),
where reading the weights bounds the time.
With --gelu only the fc1 shapes run, each followed by GELU in its erf form as exporters write it,
against cuBLAS's addmm followed by torch's gelu.
Usage: `PYTHONPATH=. python3 bench/gemm.py [--exhaustive-tune] [--gelu] [--shapes vit] [--quick]`.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

import fusegraph
from bench.common import bench_parser, check, compile_fusegraph, first_line
from bench.timing import Table, capture_graph, is_cuda, time_gpu, write_results

# (model, layer, M, K, N)
SHAPES = [
    ("vit-s/16 b32", "qkv", 6304, 384, 1152),
    ("vit-s/16 b32", "proj", 6304, 384, 384),
    ("vit-s/16 b32", "fc1", 6304, 384, 1536),
    ("vit-s/16 b32", "fc2", 6304, 1536, 384),
    ("bert-base b32 s128", "qkv", 4096, 768, 2304),
    ("bert-base b32 s128", "proj", 4096, 768, 768),
    ("bert-base b32 s128", "fc1", 4096, 768, 3072),
    ("bert-base b32 s128", "fc2", 4096, 3072, 768),
    # batch 1: few rows, the weights' bytes bound the time
    ("bert-base b1 s128", "qkv", 128, 768, 2304),
    ("bert-base b1 s128", "proj", 128, 768, 768),
    ("bert-base b1 s128", "fc1", 128, 768, 3072),
    ("bert-base b1 s128", "fc2", 128, 3072, 768),
    ("vit-s/16 b1", "fc1", 197, 384, 1536),
    ("vit-s/16 b1", "fc2", 197, 1536, 384),
]


def linear_model(m: int, k: int, n: int, rng: np.random.Generator,
                 gelu: bool = False) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """The ONNX graph of one linear layer with its weight and bias (returned too, for cuBLAS);
    with `gelu`, followed by GELU as the exporters write nn.GELU: x * 0.5 * (1 + erf(x / sqrt 2))."""
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = (rng.standard_normal(n) * 0.1).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["h" if gelu else "y"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    if gelu:
        inits += [numpy_helper.from_array(np.array(v, np.float32), name)
                  for name, v in (("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5))]
        nodes += [helper.make_node("Div", ["h", "sqrt2"], ["hs"]), helper.make_node("Erf", ["hs"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["h", "e1"], ["he"]),
                  helper.make_node("Mul", ["he", "half"], ["y"])]
    graph = helper.make_graph(
        nodes, "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w, b


def bench_shape(model: str, layer: str, m: int, k: int, n: int, args, table: Table) -> None:
    rng = np.random.default_rng(args.seed)
    proto, w, b = linear_model(m, k, n, rng, gelu=args.gelu)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).cuda().half()
    wt, bt = torch.from_numpy(w).cuda().half(), torch.from_numpy(b).cuda().half()
    iters = 20 if args.quick else 200
    if args.gelu:  # cuBLAS's product, then torch's erf GELU: two kernels
        graph, ref = capture_graph(lambda: torch.nn.functional.gelu(torch.addmm(bt, x, wt)))
    else:
        graph, ref = capture_graph(lambda: torch.addmm(bt, x, wt))
    cublas = time_gpu([graph.replay], iters=iters).median_us
    flops = 2.0 * m * n * k
    runner, why = compile_fusegraph(fusegraph.parse_onnx(proto), torch.device("cuda"), fp16=True,
                                    exhaustive_tune=args.exhaustive_tune)
    if runner is None:
        table.add(model, layer, f"{m}x{k}x{n}", f"{flops / 1e9:.2f}", "-", "-", f"{cublas:.1f}",
                  f"{flops / cublas / 1e6:.0f}", "-", why)
        return
    out = runner.run({"x": x})["y"]
    err = check(out.float(), ref.float(), 2e-2)
    ours = time_gpu([runner.replay], iters=iters).median_us
    (kernel,) = runner.compiled.kernels
    c = kernel.config
    config = f"{c['BM']}x{c['BN']}x{c['BK']} w{c['num_warps']} s{c['num_stages']}" + (f" split{c['SPLIT']}" if c.get("SPLIT", 1) > 1 else "")
    table.add(model, layer, f"{m}x{k}x{n}", f"{flops / 1e9:.2f}", f"{ours:.1f}", f"{flops / ours / 1e6:.0f}",
              f"{cublas:.1f}", f"{flops / cublas / 1e6:.0f}", f"{ours / cublas:.2f}", f"{config}; err {err.text()}")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--exhaustive-tune", action="store_true", help="let fusegraph time every config")
    parser.add_argument("--gelu", action="store_true",
                        help="fc1 shapes with the exporters' erf GELU after the bias; cuBLAS then runs addmm + torch's gelu")
    parser.add_argument("--shapes", default="", help="only shapes whose model name contains this text (b1, b32, bert, vit)")
    args = parser.parse_args()
    if not is_cuda(args.device) or not torch.cuda.is_available():
        sys.exit("bench/gemm.py needs a CUDA GPU")
    epilogue = "bias and erf GELU in the epilogue (cuBLAS: addmm, then torch's gelu)" if args.gelu else "bias in the epilogue"
    table = Table(f"GEMM template vs cuBLAS, fp16, {epilogue}",
                  ["model", "layer", "MxKxN", "GFLOP", "fusegraph us", "TFLOP/s", "cuBLAS us", "cuBLAS TFLOP/s",
                   "ratio", "config"])
    for shape in SHAPES:
        if args.shapes in shape[0] and (shape[1] == "fc1" or not args.gelu):
            try:
                bench_shape(*shape, args, table)
            except Exception as e:  # noqa: BLE001 - one failing shape must not hide the others
                table.add(*shape[:2], f"{shape[2]}x{shape[3]}x{shape[4]}", "-", "-", "-", "-", "-", "-",
                          f"failed: {first_line(e)}")
            print(table.rows[-1], file=sys.stderr, flush=True)
    tuned = "every config timed (--exhaustive-tune)" if args.exhaustive_tune else "default tune"
    name = args.name or ("gemm-exhaustive" if args.exhaustive_tune else "gemm") + ("-gelu" if args.gelu else "")
    write_results(name, "GEMM template vs cuBLAS (torch.addmm)", args.device, [table],
                  notes=[f"fusegraph: {tuned}; ratio = fusegraph time / cuBLAS time"],
                  save=not (args.quick or args.no_save))


if __name__ == "__main__":
    main()
