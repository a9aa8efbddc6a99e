"""Benchmark: fusegraph's attention kernel alone against PyTorch's flash attention.

Each case is scaled dot-product attention on q, k, v of [B, H, S, 64] in fp16 (B = 1, 32;
H = 6, 12; S = 128, 197, 512: ViT-S's heads at 197 tokens, BERT's at 128 and 512), optionally
causal. The contenders:

* fusegraph: one ONNX `Attention` node (opset 23) parsed and compiled for the GPU in fp16 with
  the default tune: one kernel, the flash-attention template; timed as replays of its CUDA graph;
* flash: `torch.nn.functional.scaled_dot_product_attention` under
  `torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)`, captured in a CUDA graph;
* sdpa: the same call with PyTorch's own backend choice (cuDNN or efficient attention on an H200).

Both outputs are checked against a float32 reference from the same fp16-rounded inputs before
timing. The rate is 4 * B * H * S * S * 64 floating-point operations (two products; half that
when causal) per run. Usage: `PYTHONPATH=. python3 bench/attention.py [--causal] [--quick]`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import fusegraph
from bench.common import Check, bench_parser, check, compile_fusegraph, exact_fp32, failure, selected
from bench.timing import Table, Timing, capture_graph, count_kernels, fmt_us, is_cuda, time_gpu, write_results

HEAD = 64
CASES = [(b, h, s) for b in (1, 32) for h in (6, 12) for s in (128, 197, 512)]
CONTENDERS = ("fusegraph", "flash", "sdpa")


@dataclass
class Result:
    name: str
    check: Check | None = None
    kernels: str = "-"
    timing: Timing | None = None
    note: str = ""


def attention_model(b: int, h: int, s: int, causal: bool):
    """One ONNX Attention node on float32 [B, H, S, 64] inputs (compiled in fp16)."""
    shape = [b, h, s, HEAD]
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=int(causal))
    graph = helper.make_graph([node], "attention",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


def flops(b: int, h: int, s: int, causal: bool) -> int:
    return 4 * b * h * s * s * HEAD // (2 if causal else 1)


def run_fusegraph(case: tuple[int, int, int], inputs: dict[str, torch.Tensor], ref: torch.Tensor,
                  args: argparse.Namespace, device: torch.device) -> Result:
    r = Result("fusegraph")
    runner, reason = compile_fusegraph(fusegraph.parse_onnx(attention_model(*case, args.causal)), device)
    if runner is None:
        r.note = reason
        return r
    try:
        r.check = check(runner.run(inputs)["y"], ref, args.tolerance)
        if not r.check.ok:
            r.note = "output check failed: not timed"
            return r
        runner.bind(inputs)
        kc = count_kernels(runner.replay, device)
        r.kernels = kc.text() if kc else "?"
        r.timing = time_gpu([runner.replay], iters=args.iters, warmup=args.warmup, device=device)
    except Exception as e:  # report it in the table; the torch contenders still run
        r.note = failure(e)
    return r


def run_torch(name: str, fn: Callable[[], torch.Tensor], ref: torch.Tensor, args: argparse.Namespace,
              device: torch.device) -> Result:
    r = Result(name)
    try:
        graph, out = capture_graph(fn)
        out.fill_(float("nan"))  # the replay must rewrite every element
        graph.replay()
        r.check = check(out, ref, args.tolerance)
        if not r.check.ok:
            r.note = "output check failed: not timed"
            return r
        kc = count_kernels(graph.replay, device)
        r.kernels = kc.text() if kc else "?"
        r.timing = time_gpu([graph.replay], iters=args.iters, warmup=args.warmup, device=device)
    except Exception as e:
        r.note = failure(e)
    return r


def run_case(case: tuple[int, int, int], args: argparse.Namespace, device: torch.device) -> list[Result]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, s = case
    gen = torch.Generator().manual_seed(args.seed * 1000 + b * 100 + h * 10 + s)
    q, k, v = (torch.randn(b, h, s, HEAD, generator=gen).to(device=device, dtype=torch.float16) for _ in range(3))
    with exact_fp32():
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=args.causal)
    out = []
    if selected("fusegraph", args.only):
        out.append(run_fusegraph(case, {"q": q, "k": k, "v": v}, ref, args, device))

    def flash() -> torch.Tensor:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)

    if selected("flash", args.only):
        out.append(run_torch("flash", flash, ref, args, device))
    if selected("sdpa", args.only):
        out.append(run_torch("sdpa", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=args.causal),
                             ref, args, device))
    torch.cuda.synchronize()
    return out


def rate(case: tuple[int, int, int], causal: bool, t: Timing | None) -> str:
    return f"{flops(*case, causal) / (t.median_us * 1e6):.0f}" if t else "-"


def table(results: dict[tuple[int, int, int], list[Result]], causal: bool) -> Table:
    names = [r.name for r in next(iter(results.values()))]
    headers = ["B x H x S (D=64)", "GFLOP"]
    for n in names:
        headers += [f"{n} us", f"{n} TFLOP/s", f"{n} kernels", f"{n} err"]
    if "fusegraph" in names and "flash" in names:
        headers.append("fusegraph / flash")
    t = Table("attention alone, fp16, CUDA graph replays (median)", headers)
    for case, rs in results.items():
        cells = [f"{case[0]} x {case[1]} x {case[2]}", f"{flops(*case, causal) / 1e9:.2f}"]
        for r in rs:
            cells += [fmt_us(r.timing.median_us if r.timing else None) + (f" ({r.note})" if r.note else ""),
                      rate(case, causal, r.timing), r.kernels, r.check.text() if r.check else "-"]
        by = {r.name: r.timing for r in rs}
        if "fusegraph / flash" in headers:
            ours, theirs = by.get("fusegraph"), by.get("flash")
            cells.append(f"{ours.median_us / theirs.median_us:.2f}x" if ours and theirs else "-")
        t.add(*cells)
    return t


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--causal", action="store_true", help="causal attention (default: none)")
    parser.add_argument("--iters", type=int, default=300, help="timed replays per contender (default 300)")
    parser.add_argument("--cases", default=None, help="comma-separated BxHxS cases (default: all twelve)")
    args = parser.parse_args(argv)
    args.warmup = 20
    if args.quick:
        args.iters, args.warmup = 20, 5
    device = torch.device(args.device)
    if not is_cuda(device):
        print("bench/attention.py needs a CUDA GPU (flash attention and fusegraph's gpu target)")
        return 1
    cases = CASES if args.cases is None else [tuple(int(x) for x in c.split("x")) for c in args.cases.split(",")]
    results = {case: run_case(case, args, device) for case in cases}  # type: ignore[misc]
    name = args.name or ("attention-causal" if args.causal else "attention")
    notes = [f"{'causal' if args.causal else 'no mask'}, q, k, v of [B, H, S, {HEAD}] fp16, scale 1/sqrt({HEAD})",
             "fusegraph: one ONNX Attention node, default tune; flash: sdpa_kernel(FLASH_ATTENTION); "
             "sdpa: PyTorch's own backend choice"]
    write_results(name, "Attention kernel against SDPA", device, [table(results, args.causal)], notes,
                  save=not args.no_save)
    failed = [r for rs in results.values() for r in rs if r.check is not None and not r.check.ok]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
