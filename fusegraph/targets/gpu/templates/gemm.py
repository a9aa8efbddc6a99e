"""The GEMM template: convolution (implicit GEMM) and batched matrix products.

A program computes an (m, n) tile of the product, looping over k in chunks. The template is
three parts: the spec (`gemm_spec.py`: where each anchor's product reads A and B and writes its
output), the emitter (`gemm_emit.py`: the Triton text of the loop, split-k and the epilogue)
and the config policy (`gemm_configs.py`: the tile candidates, from the device's facts).
"""

from __future__ import annotations

from fusegraph.ir.program import Instruction, Module
from fusegraph.targets.gpu.kernel_source import KernelSource, signature
from fusegraph.targets.gpu.kernel_writer import KernelInputs
from fusegraph.targets.gpu.templates.gemm_configs import gemm_configs
from fusegraph.targets.gpu.templates.gemm_emit import GemmEmitter
from fusegraph.targets.gpu.templates.gemm_prefetch import weight_prefetch
from fusegraph.targets.gpu.templates.gemm_reduce import run_length
from fusegraph.targets.gpu.templates.gemm_spec import channel_period, gemm_spec, split_by_period
from fusegraph.targets.gpu.templates.registry import lowers


@lowers("gemm")
def gemm_kernel(name: str, kernel: str, module: Module, inputs: KernelInputs, anchor: Instruction,
                allow_tf32: bool = False, interpret: bool = False) -> KernelSource:
    """The kernel of fused group `module` around product anchor `anchor`."""
    spec = gemm_spec(anchor)
    period = run_length(module) or channel_period(module, anchor, spec)  # a softmax's run is one tile
    if period:
        split_by_period(spec, period)
    tile = max(16, 1 << (period - 1).bit_length()) if period else 0
    emitter = GemmEmitter(module, inputs, anchor, spec, kernel, allow_tf32, interpret)
    pieces = emitter.body(period, tile)
    parts = emitter.pixel_sums or emitter.row_parts
    args = emitter.arg_list() + ["ws", "cnt"] + (["part", "pcnt"] if parts else [])
    constexprs = ["BM", "BN", "BK", "SPLIT"] + (["PIECES"] if pieces else [])
    body = signature(name, args, constexprs) + "\n" + "\n".join(emitter.lines) + "\n"
    configs, default_tune = gemm_configs(spec, anchor.inputs[0].shape.dtype, tile, pieces, emitter.a_bytes())
    n_grid: tuple[int, str | None, str | None] = (spec.n // period, None, None) if period else (spec.n, "BN", None)
    return KernelSource(name, kernel, "gemm", body, args, configs,
                        [(spec.m, "BM", None), n_grid, (spec.batch, None, "SPLIT")],
                        flops=spec.flops, default_tune=default_tune,
                        parts=parts, before_wait=weight_prefetch(emitter.w, spec, emitter.b_in, period),
                        tensor_descriptors=bool(emitter.tma))
