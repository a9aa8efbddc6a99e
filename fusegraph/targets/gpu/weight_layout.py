"""Physical layouts of convolution weights, chosen for the kernels that read them.

A weight tensor is a literal, uploaded once, so its bytes can be stored in any order: kernels
address every buffer through strides. A KxK convolution's GEMM reads a tile of weights
[channels, output channels] for one tap at a time; in ONNX's [M, C, kh, kw] order consecutive
output channels are C*kh*kw elements apart and consecutive channels kh*kw apart, so no dimension
of the tile is contiguous and every 2-byte weight costs a 32-byte memory sector. Stored as
[kh, kw, C, M], output channels are contiguous and the tile loads coalesce.

1x1 convolutions too: their [M, C] weights make the GEMM's B operand K-major, which Triton's
dot multiplies about three times slower than an N-major one of the same size. A layer whose
output channels per group are not a multiple of 8 (the detection head's 255) keeps ONNX's
order: its rows would start at unaligned addresses and lose the 16-byte copies.

A depthwise convolution's template reads one [channels] vector per tap: its [M, 1, kh, kw]
weights stored [kh, kw, 1, M] too, whatever M, make each vector contiguous.
"""

from __future__ import annotations

from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import is_fused, is_literal, is_load
from fusegraph.targets.gpu.anchor import find_anchor
from fusegraph.targets.gpu.memory_plan import BufferKind, MemoryPlan

TAP_MAJOR = (2, 3, 1, 0)  # [M, C, kh, kw] stored as [kh, kw, C, M]


def choose_weight_layouts(main: Module, plan: MemoryPlan) -> None:
    """Store [kh, kw, C, M] each literal that only 2-d convolutions read as plain weights, when
    their output channels per group are a multiple of 8 or the convolution is depthwise."""
    wanted: dict[int, bool] = {}
    for ins in main:
        for k, x in enumerate(ins.inputs):
            b = plan.of.get(id(x))
            if b is None or b.kind != BufferKind.LITERAL or not is_literal(x):
                continue
            ok = False
            if is_fused(ins):
                anchor = find_anchor(ins)
                param = list(ins.op.module.params.values())[k]
                ok = (anchor is not None and _conv2d_weights(anchor, x)
                      and _only_plain_weight_reads(ins.op.module, param, anchor))
            wanted[b.id] = wanted.get(b.id, True) and ok
    for b in plan.buffers:
        if wanted.get(b.id):
            b.perm = TAP_MAJOR


def _conv2d_weights(anchor: Instruction, w: Instruction) -> bool:
    """4-d weights of a product whose output channels are their axis 0 (a 2-d convolution's
    [M, C, kh, kw]), with a multiple of 8 output channels per group or lowered as depthwise."""
    if anchor.op.family != "gemm" or w.shape.ndim != 4 or anchor.op.weight_channel_axis(4) != 0:
        return False
    if anchor.op.template_family([x.shape for x in anchor.inputs]) == "depthwise":
        return True
    return (w.shape.lens[0] // anchor.op.attrs["group"]) % 8 == 0


def _only_plain_weight_reads(module: Module, param: Instruction, anchor: Instruction) -> bool:
    readers = [i for i in module if param in i.inputs]
    return (len(readers) == 1 and is_load(readers[0]) and readers[0] is anchor.inputs[anchor.op.weight_input]
            and readers[0].op.attrs["map"].is_identity() and not readers[0].op.attrs["domain"])

