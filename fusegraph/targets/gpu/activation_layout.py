"""Channels-last storage for the feature maps that convolutions read and write.

An implicit-GEMM convolution reads its A tile as [pixels, channels]. In NCHW the channels of
one pixel are H*W elements apart and the pixels of a tile row are spread by the window's
`// W` and `% W`, so no dimension of the tile is provably contiguous: every 2-byte element is
its own load, the loads cannot become asynchronous copies, and the k loop waits on memory at
every step. Stored NHWC, a pixel's channels are contiguous: the tile loads as 16-byte vectors
that the pipeliner prefetches, and the epilogue's stores along output channels coalesce too.

Intermediate buffers are the compiler's to lay out (kernels address every buffer through
strides), so each 4-d arena buffer that a convolution kernel reads or writes with its channels
on axis 1 is stored channels-last, unless a view of it cannot alias that layout. Program inputs and outputs keep
their standard layout.
"""

from __future__ import annotations

from fusegraph.errors import FusegraphError
from fusegraph.ir.program import Instruction, Module
from fusegraph.ir.index_expr import free_vars
from fusegraph.ops.base import is_fused, is_load, is_store
from fusegraph.targets.gpu.anchor import find_anchor
from fusegraph.targets.gpu.memory_plan import BufferKind, MemoryPlan, aliases_input, physical_shape

CHANNELS_LAST = (0, 2, 3, 1)  # [N, C, H, W] stored as [N, H, W, C]


def choose_activation_layouts(main: Module, plan: MemoryPlan) -> None:
    """Store channels-last every 4-d arena buffer that a 2-d convolution kernel touches."""
    wanted: set[int] = set()
    for ins in main:
        if not is_fused(ins) or not _is_conv2d(find_anchor(ins)):
            continue
        touched = [(plan.of.get(id(x)), k - 1) for k, x in enumerate([ins, *ins.inputs])]
        touched += [(b, -1) for b in plan.further.get(id(ins), [])]
        for b, k in touched:
            if b is not None and b.kind == BufferKind.ARENA and b.shape.ndim == 4 and _channels_on_axis_1(ins, k):
                wanted.add(b.id)
    values: dict[int, list[Instruction]] = {}
    for ins in main:
        b = plan.of.get(id(ins))
        if b is not None and b.id in wanted:
            values.setdefault(b.id, []).append(ins)
    for b in plan.buffers:
        if b.id not in wanted:
            continue
        b.perm = CHANNELS_LAST
        try:  # every view of the buffer must alias the new layout
            for v in values.get(b.id, []):
                if aliases_input(v):
                    physical_shape(v, plan)
        except FusegraphError:
            b.perm = None


def _channels_on_axis_1(fused: Instruction, k: int) -> bool:
    """Whether the kernel of `fused` addresses its input `k` (-1: its output) with its index's
    axis 1 on the buffer's axis 1 alone (an identity, a channel slice), not, say, through the
    NHWC transpose ConvNeXt stores after its depthwise conv: that buffer's channels are its last
    axis already, and storing it channels-last would put them H apart."""
    module = fused.op.module
    if k < 0:
        accesses = [i for i in module if is_store(i)]
    else:
        param = list(module.params.values())[k]
        accesses = [i for i in module if is_load(i) and i.inputs[0] is param]
    for a in accesses:
        m = a.op.attrs["map"]
        if len(m.out_vars) != 4 or {v.name for v in free_vars(m.exprs[1])} != {m.out_vars[1].name}:
            return False
    return True


def _is_conv2d(anchor: Instruction | None) -> bool:
    """A product with a 4-d output whose channels are axis 1: a 2-d convolution (a 4-d batched
    matrix product has its channels last)."""
    return (anchor is not None and anchor.op.family == "gemm" and anchor.shape.ndim == 4
            and anchor.op.channel_axis(4) == 1)
