"""The flat template: one program per block of output elements, one element per lane.

It serves every fused group whose output element is computed on its own: pointwise groups,
copies, and the window and movement families, whose anchors are a small loop per element
(pooling windows, LRN, data movement): each registers an anchor emitter for its op. Contiguous dims collapse on their own: the
iteration index is the delinearized flat offset, and the index algebra folds an identity
address back into the offset, so loads and stores are plain vector accesses. The offset walks
the dims in the order the output buffer stores them (a channels-last buffer channel-fastest),
so neighbouring lanes write neighbouring addresses whatever the layout.
"""

from __future__ import annotations

import math

from fusegraph.ir.index_expr import evaluate
from fusegraph.ir.index_map import delinearize, linear_offset
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import is_store
from fusegraph.targets.gpu.errors import CodegenError
from fusegraph.targets.gpu.kernel_source import KernelSource, signature
from fusegraph.targets.gpu.kernel_writer import KernelInputs, KernelWriter, Tile, var
from fusegraph.targets.gpu.templates.registry import Emitter, emitter_for, lowers


def flat_kernel(name: str, kernel: str, module: Module, inputs: KernelInputs,
                anchor: Instruction | None = None, emitter: Emitter | None = None) -> KernelSource:
    ret = module.returns[0]  # the further outputs are stored over the same space
    space = _space(ret)
    total = math.prod(space)
    xo = var("xo", total)
    anchors = {}
    if anchor is not None and emitter is not None:
        anchors[id(anchor)] = lambda tile, idx: emitter(w, anchor, tile, idx)
    w = KernelWriter(module, inputs, anchors)
    order = _store_order(w, ret, space)
    walked = delinearize(xo, [space[d] for d in order]) if space else ()
    index = tuple(walked[order.index(d)] for d in range(len(space)))
    tile = Tile({"xo": "xo"}, {"xo": f"(xo < {total})" if total > 1 else None})
    w.emit("xo = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)")
    for r in module.returns:
        w.store(r, tile, index)
    args = w.arg_list()
    body = signature(name, args, ["XBLOCK"]) + "\n" + "\n".join(w.lines) + "\n"
    block = min(1024, max(16, 1 << (max(1, total) - 1).bit_length()))
    configs = [{"XBLOCK": block, "num_warps": 4, "num_stages": 1}]
    if block > 256:
        configs += [{"XBLOCK": 256, "num_warps": 2, "num_stages": 1}, {"XBLOCK": 512, "num_warps": 4, "num_stages": 1}]
    return KernelSource(name, kernel, "flat", body, args, configs, [(total, "XBLOCK", None)])


@lowers("window", "movement")
def anchored_flat_kernel(name: str, kernel: str, module: Module, inputs: KernelInputs, anchor: Instruction,
                         allow_tf32: bool = False, interpret: bool = False) -> KernelSource:
    """The flat kernel around a window or movement anchor (the product options do not apply)."""
    return flat_kernel(name, kernel, module, inputs, anchor, emitter_for(anchor.op))


def _store_order(w: KernelWriter, store: Instruction, space: tuple[int, ...]) -> list[int]:
    """The iteration dims from the slowest to the fastest moving address of the stored buffer."""
    root = w.root_buffer(store)
    _, shape = w.buffer(root)
    dims = [var(f"d{j}", n) for j, n in enumerate(space)]
    addr = linear_offset(store.op.attrs["map"].apply(tuple(dims), check=False), shape.strides, shape.offset)
    zero = {d.name: 0 for d in dims}
    base = evaluate(addr, zero)
    step = [abs(evaluate(addr, {**zero, d.name: 1}) - base) if n > 1 else 0 for d, n in zip(dims, space)]
    return sorted(range(len(space)), key=lambda j: -step[j])


def _space(store: Instruction) -> tuple[int, ...]:
    """The iteration space of a group: the domain of its stores' maps (all the same)."""
    spaces = set()
    ins = store
    while is_store(ins):
        spaces.add(ins.op.attrs["map"].out_lens)
        ins = ins.inputs[0]
    if len(spaces) != 1:
        raise CodegenError(f"stores over different index spaces {sorted(spaces)}")
    return spaces.pop()
