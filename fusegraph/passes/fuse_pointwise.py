"""Pointwise fusion: every pointwise op left after anchor fusion joins one fused kernel.

Roots are the pointwise ops whose value is needed by something other than a pointwise op
(through any chain of views): a kernel, a return, a concat. Each root's group recomputes
its pointwise producers at the index it reads them, through any chain of views in between
(no "same index" requirement), so one kernel reads only the group's true inputs.
"""

from __future__ import annotations

from fusegraph.ir.index_map import identity_map
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import OpKind
from fusegraph.ops.base import input_map_of as view_input_map
from fusegraph.passes.group_builder import GroupBuilder, Piece, Unfusable, group_name, kernel_name, place
from fusegraph.passes.rewrite import rewrite_each


def _consumers(ins: Instruction, users: dict[Instruction, list[Instruction]], returned: set[int]) -> list[Instruction]:
    """The non-view readers of `ins`, looking through chains of views (a returned view counts)."""
    out, stack = [], list(users.get(ins, []))
    while stack:
        u = stack.pop()
        if u.op.kind != OpKind.POINTWISE and view_input_map(u) is not None and id(u) not in returned:
            stack.extend(users.get(u, []))
        else:
            out.append(u)
    return out


class FusePointwise:
    name = "fuse_pointwise"

    def apply(self, module: Module) -> bool:
        users = module.users()
        returned = {id(r) for r in module.returns}

        def is_root(ins: Instruction) -> bool:
            if id(ins) in returned:
                return True
            cons = _consumers(ins, users, returned)
            return not cons or any(c.op.kind != OpKind.POINTWISE for c in cons)

        root_ids = {id(i) for i in module.instructions if i.op.kind == OpKind.POINTWISE and is_root(i)}

        def fuse(root: Instruction) -> bool:
            if id(root) not in root_ids:
                return False
            b = GroupBuilder(group_name(module), inline=lambda ins, at: ins.op.kind == OpKind.POINTWISE and id(ins) not in root_ids)
            try:
                value = b.add(root.op, [b.gather(x) for x in root.inputs], root.origin)
            except Unfusable:
                return False
            fused = b.finish(root, [Piece(identity_map(root.shape.lens), (), value)], kernel_name(b.inlined + [root]))
            place(module, fused, root, [root])
            return True

        return rewrite_each(module, fuse, drop_dead=True)
