"""Concat elimination: producers write straight into their slice of the concat's buffer.

For `concat(a, b, c)` the buffer is allocated once; each input's fused kernel gets it as an
extra input and stores through `embed . store map`, so no copy kernel runs. The kernels are
chained (each returns the buffer the next writes into) so the program stays in SSA form.
Other readers of a retargeted producer read its slice of the buffer as a view. An input that
is not a fused kernel of its own gets a copy kernel into its slice.

An input may also be a slice (along the concat axis) of a kernel that computes more than that
part, as merged sibling convolutions do: the kernel then writes all of its output into the
buffer, its part in the part's slot and the rest in extra channels before or after the concat's
own, and the concat's readers read the concat's range of the buffer as a view. This needs the
kernel's output to cover whole slots wherever it overlaps the concat, so only the kernel that
supplies the first (or last) slot can reach past the concat's start (or end).
"""

from __future__ import annotations

from fusegraph.ir.index_map import IndexMap, embed_map
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import is_allocate, is_fused, is_fused_output, is_store
from fusegraph.ops.fused import Allocate, Fused, Store
from fusegraph.ops.source import make_param
from fusegraph.ops.views import Slice
from fusegraph.passes.group_builder import GroupBuilder, group_name
from fusegraph.passes.rewrite import rewrite_each


def _store_chain(sub: Module) -> tuple[list[Instruction], Instruction]:
    """The stores a group's result goes through (first to last) and the buffer they start from."""
    stores = []
    ins = sub.returns[0]
    while is_store(ins):
        stores.append(ins)
        ins = ins.inputs[0]
    return stores[::-1], ins


def _retargetable(ins: Instruction) -> bool:
    return is_fused(ins) and is_allocate(_store_chain(ins.op.module)[1])


def retarget(module: Module, fused: Instruction, buffer: Instruction, emb: IndexMap) -> Instruction:
    """`fused` storing through `emb` into `buffer` (its new last input) instead of a fresh buffer;
    its `fused_output`s read the new instruction."""
    sub = fused.op.module
    stores, alloc = _store_chain(sub)
    sub.replace(alloc, make_param(f"x{len(fused.inputs)}", buffer.shape.as_standard()))
    for st in stores:
        sub.replace(st, sub.make(Store(emb.after(st.op.attrs["map"]), st.op.attrs["domain"]), st.inputs, st.origin))
    new = module.make(Fused(sub, fused.op.attrs["kernel"]), [*fused.inputs, buffer], fused.origin)
    for ins in module.instructions:  # its further outputs are still its own buffers
        if is_fused_output(ins) and ins.inputs[0] is fused:
            ins.inputs = [new]
    return new


def _source(x: Instruction, axis: int) -> tuple[Instruction, int]:
    """Where a concat input's elements are computed and where along `axis` they start there: the
    input itself, or the producer of a unit-step slice along `axis` alone (a kernel computing
    more channels than one concat part, such as merged sibling convolutions)."""
    cut = x.op.ranges()
    if cut is not None and len(cut) == 1 and cut[0][0] == axis:
        return x.inputs[0], cut[0][1]
    return x, 0


class EliminateConcat:
    name = "eliminate_concat"

    def apply(self, module: Module) -> bool:
        def eliminate(ins: Instruction) -> bool:
            if not ins.op.concatenates:
                return False
            self._eliminate(module, ins)
            return True

        return rewrite_each(module, eliminate, drop_dead=True)

    def _writers(self, module: Module, concat: Instruction, offsets: list[int]) -> dict[int, tuple[Instruction, int, list[int]]]:
        """The kernels that store their parts of `concat` straight into its buffer, by id: the
        kernel, where its index 0 lands along the axis (in the concat's coordinates, negative when
        it starts before the concat) and the inputs it supplies. `offsets` are the inputs' offsets.
        """
        axis, length = concat.op.attrs["axis"], concat.shape.lens[concat.op.attrs["axis"]]
        returned = {id(r) for r in module.returns}
        inputs: dict[int, list[int]] = {}
        for k, x in enumerate(concat.inputs):
            src, _ = _source(x, axis)
            if _retargetable(src) and id(src) not in returned:
                inputs.setdefault(id(src), []).append(k)
        writers = {}
        for ks in inputs.values():
            src, start = _source(concat.inputs[ks[0]], axis)
            shift = offsets[ks[0]] - start
            ks = [k for k in ks if offsets[k] - _source(concat.inputs[k], axis)[1] == shift]
            n = src.shape.lens[axis]
            covered = sum(concat.inputs[k].shape.lens[axis] for k in ks)
            if covered != min(length, shift + n) - max(0, shift):
                continue  # the kernel's other channels would land on another input's slot
            if (shift < 0 or shift + n > length) and id(concat) in returned:
                continue  # a returned value stays a buffer of its own
            writers[id(src)] = (src, shift, ks)
        return writers

    def _eliminate(self, module: Module, concat: Instruction) -> None:
        axis = concat.op.attrs["axis"]
        length = concat.shape.lens[axis]
        inputs = list(concat.inputs)
        offsets, offset = [], 0
        for x in inputs:
            offsets.append(offset)
            offset += x.shape.lens[axis]
        writers = self._writers(module, concat, offsets)
        before = max([0] + [-shift for _, shift, _ in writers.values()])
        after = max([0] + [shift + src.shape.lens[axis] - length for src, shift, _ in writers.values()])
        lens = list(concat.shape.lens)
        lens[axis] = before + length + after
        pos = {id(i): k for k, i in enumerate(module.instructions)}
        written = {k for _, _, ks in writers.values() for k in ks}
        # write the parts in the order their producers run: the chain through the buffer
        # must not make an early producer wait for a part computed from its own output;
        # a step is a writing kernel's id or, for an input that needs a copy, its index
        steps: list[tuple[int, str, int]] = [(pos[key], "kernel", key) for key in writers]
        steps += [(pos.get(id(inputs[k]), -1), "copy", k) for k in range(len(inputs)) if k not in written]
        steps.sort(key=lambda step: step[0])
        buf = module.make(Allocate(concat.shape.dtype, lens), [], concat.origin)
        module.insert_before(module.instructions[min([p for p, _, _ in steps if p >= 0], default=0)], buf)
        for _, kind, key in steps:
            if kind == "kernel":
                src, shift, _ = writers[key]
                at, n = before + shift, src.shape.lens[axis]
                new = retarget(module, src, buf, embed_map(src.shape.lens, lens, axis, at))
                module.insert_before(src, new)
                # every other reader (slices feeding this concat included) reads its part of the buffer
                part = module.make(Slice([axis], [at], [at + n]), [new], src.origin)
                module.insert_before(src, part)
                module.replace_uses(src, part)
                module.remove(src)
            else:  # the input as it is read now (it may have become a view of this buffer)
                x = concat.inputs[key]
                b = GroupBuilder(group_name(module))
                value = b.gather(x)
                dest = b.param(buf)
                emb = embed_map(x.shape.lens, lens, axis, before + offsets[key])
                st = b.add(Store(emb, ()), [dest, value], concat.origin)
                b.sub.set_returns([st], ["out"])
                new = Instruction(Fused(b.sub, "copy"), b.inputs, st.shape, concat.origin)
                module.insert_before(concat, new)
            buf = new
        if before or after:
            view = module.make(Slice([axis], [before], [before + length]), [buf], concat.origin)
            module.insert_before(concat, view)
            buf = view
        module.replace_uses(concat, buf)
        module.remove(concat)
        module.sort()
