"""Program outputs that no kernel computes get a copy kernel.

A view returned as it is (a reshape after a transpose, a tile, a negative-step slice) has no
buffer of its own, and its strides need not describe any buffer: the reference target
materializes it, the GPU target gives it a copy kernel that reads through the view's index
map, like any other fused group. So does a returned view that exists only as an index map (a
depth-to-space rearrangement, a nearest resize by whole factors): nothing else would compute it. A returned input or weight gets one too, so every output
has a buffer the next run cannot change under the caller.
"""

from __future__ import annotations

from fusegraph.ir.index_map import identity_map
from fusegraph.ir.program import Module
from fusegraph.ops.base import input_map_of, is_fused
from fusegraph.passes.group_builder import GroupBuilder, Piece, group_name
from fusegraph.targets.gpu.memory_plan import aliases_input


def copy_returned_views(main: Module) -> None:
    """Return a fresh copy of each output that is a view, a parameter or a literal."""
    outputs = list(main.returns)
    bufferless = False
    for k, r in enumerate(outputs):
        mapped = not (aliases_input(r) or r.op.kind.is_source) and not is_fused(r) and input_map_of(r) is not None
        if not (aliases_input(r) or r.op.kind.is_source or mapped):
            continue
        if r.shape.elements == 0:
            continue  # nothing to copy; the plan gives it a buffer of its own
        b = GroupBuilder(group_name(main))
        value = b.gather(r)
        fused = b.finish(r, [Piece(identity_map(r.shape.lens), (), value)], "copy")
        fused.module = main
        main.instructions.append(fused)
        outputs[k] = fused
        bufferless |= mapped
    main.set_returns(outputs, list(main.return_names))
    if bufferless:  # the copied view has no buffer to leave behind
        main.remove_dead_code()
