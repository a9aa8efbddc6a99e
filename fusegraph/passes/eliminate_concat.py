"""Concat elimination: producers write straight into their slice of the concat's buffer.

For `concat(a, b, c)` the buffer is allocated once; each input's fused kernel gets it as an
extra input and stores through `embed . store map`, so no copy kernel runs. The kernels are
chained (each returns the buffer the next writes into) so the program stays in SSA form.
Other readers of a retargeted producer read its slice of the buffer as a view. An input that
is not a fused kernel of its own gets a copy kernel into its slice.
"""

from __future__ import annotations

from fusegraph.ir.index_map import IndexMap, embed_map
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.fused import Allocate, Fused, Store
from fusegraph.ops.views import Slice
from fusegraph.passes.dead_code import DeadCodeElimination
from fusegraph.passes.group_builder import GroupBuilder, group_name


def _store_chain(sub: Module) -> tuple[list[Instruction], Instruction]:
    """The stores a group's result goes through (first to last) and the buffer they start from."""
    stores = []
    ins = sub.returns[0]
    while ins.op.name == "store":
        stores.append(ins)
        ins = ins.inputs[0]
    return stores[::-1], ins


def _retargetable(ins: Instruction) -> bool:
    return isinstance(ins.op, Fused) and _store_chain(ins.op.module)[1].op.name == "allocate"


def retarget(module: Module, fused: Instruction, buffer: Instruction, emb: IndexMap) -> Instruction:
    """`fused` storing through `emb` into `buffer` (its new last input) instead of a fresh buffer."""
    sub = fused.op.module
    stores, alloc = _store_chain(sub)
    sub.replace(alloc, sub.make_param(f"x{len(fused.inputs)}", buffer.shape.as_standard()))
    for st in stores:
        sub.replace(st, sub.make(Store(emb.after(st.op.attrs["map"]), st.op.attrs["domain"]), st.inputs, st.origin))
    return module.make(Fused(sub, fused.op.attrs["kernel"]), [*fused.inputs, buffer], fused.origin)


class EliminateConcat:
    name = "eliminate_concat"

    def apply(self, module: Module) -> bool:
        changed = False
        for concat in [i for i in module.instructions if i.op.name == "concat"]:
            self._eliminate(module, concat)
            changed = True
        if changed:
            DeadCodeElimination().apply(module)
        return changed

    def _eliminate(self, module: Module, concat: Instruction) -> None:
        users = module.users()
        axis = concat.op.attrs["axis"]
        first = min(module.instructions.index(x) for x in concat.inputs if x in module.instructions) \
            if any(x in module.instructions for x in concat.inputs) else 0
        buf = module.make(Allocate(concat.shape.dtype, concat.shape.lens), [], concat.origin)
        module.instructions.insert(first, buf)
        buf.module = module
        offsets, offset = [], 0
        for x in concat.inputs:
            offsets.append(offset)
            offset += x.shape.lens[axis]
        # write the parts in the order their producers run: the chain through the buffer
        # must not make an early producer wait for a part computed from its own output
        pos = {id(i): k for k, i in enumerate(module.instructions)}
        order = sorted(range(len(concat.inputs)), key=lambda k: pos.get(id(concat.inputs[k]), -1))
        seen: set[int] = set()
        for k in order:
            x, offset = concat.inputs[k], offsets[k]
            emb = embed_map(x.shape.lens, concat.shape.lens, axis, offset)
            readers = users.get(x, [])
            if _retargetable(x) and id(x) not in seen and x not in module.returns:
                new = retarget(module, x, buf, emb)
                module.insert_before(x, new)
                new.module = module
                others = [r for r in readers if r is not concat]
                if others:
                    part = module.make(Slice([axis], [offset], [offset + x.shape.lens[axis]]), [new], x.origin)
                    module.insert_before(x, part)
                    part.module = module
                    for r in others:
                        r.inputs = [part if i is x else i for i in r.inputs]
                module.remove(x)
            else:
                b = GroupBuilder(group_name(module))
                value = b.gather(x)
                dest = b.param(buf)
                st = b.add(Store(emb, ()), [dest, value], concat.origin)
                b.sub.set_returns([st], ["out"])
                new = Instruction(Fused(b.sub, "copy"), b.inputs, st.shape, concat.origin)
                module.insert_before(concat, new)
                new.module = module
            seen.add(id(x))
            buf = new
        module.replace_uses(concat, buf)
        module.remove(concat)
        module.sort()
