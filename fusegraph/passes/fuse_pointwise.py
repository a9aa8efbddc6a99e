"""Pointwise fusion: every pointwise op left after anchor fusion joins one fused kernel.

Roots are the pointwise ops whose value is needed by something other than a pointwise op
(through any chain of views): a kernel, a return, a concat. Each root's group recomputes
its pointwise producers at the index it reads them, through any chain of views in between
(no "same index" requirement), so one kernel reads only the group's true inputs.

A concat that only pointwise ops read (through views) is read as a select of its parts by
index range (`GroupBuilder._select`) when one of its parts would otherwise cost a kernel: a
pointwise part (which would be a root only to be written into the concat's buffer) or a part
that concat elimination must copy (a constant, an input, a view). YOLOv8's box arithmetic,
`concat(centre, size) * stride`, is then one kernel instead of three. A concat of kernel
outputs only stays a buffer: they write their parts in place already, and a select would
only add masks.
"""

from __future__ import annotations

from fusegraph.ir.index_map import identity_map
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import OpKind, is_fused
from fusegraph.ops.base import input_map_of as view_input_map
from fusegraph.passes.group_builder import GroupBuilder, Piece, Unfusable, group_name, kernel_name, place
from fusegraph.passes.rewrite import rewrite_each


def _consumers(ins: Instruction, users: dict[Instruction, list[Instruction]], returned: set[int],
               selected: set[int]) -> list[Instruction]:
    """The non-view readers of `ins`, looking through chains of views and the concats in
    `selected` (a returned view counts)."""
    out, stack = [], list(users.get(ins, []))
    while stack:
        u = stack.pop()
        if id(u) in selected or u.op.kind != OpKind.POINTWISE and view_input_map(u) is not None and id(u) not in returned:
            stack.extend(users.get(u, []))
        else:
            out.append(u)
    return out


def _written_in_place(part: Instruction, axis: int) -> bool:
    """Whether concat elimination writes `part` into the concat's buffer with no kernel of its
    own: a kernel's output, or a slice of one along the concat's axis."""
    cut = part.op.ranges()
    if cut is not None and len(cut) == 1 and cut[0][0] == axis:
        part = part.inputs[0]
    return is_fused(part)


def selected_concats(module: Module, users: dict[Instruction, list[Instruction]], returned: set[int]) -> set[int]:
    """The concats that pointwise kernels read as selects (see the module docstring)."""
    out: set[int] = set()
    for ins in module.instructions:
        if not ins.op.concatenates or ins.shape.elements == 0:
            continue
        if all(_written_in_place(x, ins.op.attrs["axis"]) for x in ins.inputs):
            continue
        readers = _consumers(ins, users, returned, set())
        if id(ins) not in returned and readers and all(u.op.kind == OpKind.POINTWISE for u in readers):
            out.add(id(ins))
    return out


class FusePointwise:
    name = "fuse_pointwise"

    def apply(self, module: Module) -> bool:
        users = module.users()
        returned = {id(r) for r in module.returns}
        selected = selected_concats(module, users, returned)

        def is_root(ins: Instruction) -> bool:
            if id(ins) in returned:
                return True
            cons = _consumers(ins, users, returned, selected)
            return not cons or any(c.op.kind != OpKind.POINTWISE for c in cons)

        root_ids = {id(i) for i in module.instructions if i.op.kind == OpKind.POINTWISE and is_root(i)}

        def inline(ins: Instruction, at: object) -> bool:
            return ins.op.kind == OpKind.POINTWISE and id(ins) not in root_ids or id(ins) in selected

        def fuse(root: Instruction) -> bool:
            if id(root) not in root_ids:
                return False
            b = GroupBuilder(group_name(module), inline=inline)
            try:
                value = b.add(root.op, [b.gather(x) for x in root.inputs], root.origin)
            except Unfusable:
                return False
            fused = b.finish(root, [Piece(identity_map(root.shape.lens), (), value)], kernel_name(b.inlined + [root]))
            place(module, fused, root, [root])
            return True

        return rewrite_each(module, fuse, drop_dead=True)
