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

A part that is itself a concat (along any axis) read only there is flattened into its parts,
each written at its place in the outer buffer: YOLOv8's output concatenates its boxes with a
concat of the three levels' class scores, and each class kernel writes its box of the output.
"""

from __future__ import annotations

from typing import Any, Sequence

from fusegraph.ir.index_map import IndexMap, embed_map, identity_map
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


def _nested(module: Module, x: Instruction, users: dict[Instruction, list[Instruction]]) -> bool:
    """Whether concat `x` is one slot of another concat and read nowhere else: that concat
    writes `x`'s parts into its own buffer (`_leaves`)."""
    readers = users.get(x, [])
    return (x.op.concatenates and len(readers) == 1 and readers[0].op.concatenates
            and x not in module.returns and x.shape.elements > 0)


def _leaves(module: Module, concat: Instruction, users: dict[Instruction, list[Instruction]]
            ) -> dict[int, list[tuple[Instruction, int, tuple[int, ...]]]]:
    """For each input of `concat` that is a nested concat (`_nested`), its parts found through
    any depth of nesting: the concat holding the part, the part's slot there and where the
    part's index 0 lands in `concat`."""
    out: dict[int, list[tuple[Instruction, int, tuple[int, ...]]]] = {}

    def walk(inner: Instruction, starts: tuple[int, ...], into: list) -> None:
        axis, offset = inner.op.attrs["axis"], 0
        for k, x in enumerate(inner.inputs):
            at = tuple(s + offset if a == axis else s for a, s in enumerate(starts))
            if _nested(module, x, users):
                walk(x, at, into)
            else:
                into.append((inner, k, at))
            offset += x.shape.lens[axis]

    axis, offset = concat.op.attrs["axis"], 0
    for k, x in enumerate(concat.inputs):
        if _nested(module, x, users):
            out[k] = []
            walk(x, tuple(offset if a == axis else 0 for a in range(x.shape.ndim)), out[k])
        offset += x.shape.lens[axis]
    return out


def _box_map(part: Instruction, starts: Sequence[int], lens: Sequence[int]) -> IndexMap:
    """The map of `part`'s index to the buffer of `lens` where its index 0 lands at `starts`."""
    vs = identity_map(part.shape.lens).out_vars
    return IndexMap(vs, [v + s for v, s in zip(vs, starts)], lens)


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
            if not ins.op.concatenates or _nested(module, ins, module.users()):
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
        nested = _leaves(module, concat, module.users())
        writers = self._writers(module, concat, offsets)
        before = max([0] + [-shift for _, shift, _ in writers.values()])
        after = max([0] + [shift + src.shape.lens[axis] - length for src, shift, _ in writers.values()])
        lens = list(concat.shape.lens)
        lens[axis] = before + length + after
        pos = {id(i): k for k, i in enumerate(module.instructions)}
        written = {k for _, _, ks in writers.values() for k in ks}
        # write the parts in the order their producers run: the chain through the buffer
        # must not make an early producer wait for a part computed from its own output;
        # a step is a writing kernel's id, for an input that needs a copy its index, for a
        # part of a nested concat that concat, the part's slot and where the part lands
        steps: list[tuple[int, str, Any]] = [(pos[key], "kernel", key) for key in writers]
        steps += [(pos.get(id(inputs[k]), -1), "copy", k) for k in range(len(inputs)) if k not in written and k not in nested]
        leaves = [leaf for ls in nested.values() for leaf in ls]
        every_part = [*inputs, *(c.inputs[k] for c, k, _ in leaves)]
        for leaf in leaves:  # a kernel that writes one part only writes it in place
            x = leaf[0].inputs[leaf[1]]
            in_place = _retargetable(x) and x not in module.returns and sum(y is x for y in every_part) == 1
            steps.append((pos.get(id(x), -1), "leaf" if in_place else "leaf copy", leaf))
        steps.sort(key=lambda step: step[0])

        def in_buffer(starts: Sequence[int]) -> list[int]:
            return [s + before if a == axis else s for a, s in enumerate(starts)]

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
            elif kind == "leaf":
                inner, k, starts = key
                src, at = inner.inputs[k], in_buffer(starts)
                new = retarget(module, src, buf, _box_map(src, at, lens))
                module.insert_before(src, new)
                box = [(a, s, s + n) for a, (s, n) in enumerate(zip(at, src.shape.lens)) if n != lens[a]]
                part = module.make(Slice(*zip(*box)) if box else Slice([axis], [0], [lens[axis]]), [new], src.origin)
                module.insert_before(src, part)
                module.replace_uses(src, part)
                module.remove(src)
            else:  # the input as it is read now (it may have become a view of this buffer)
                if kind == "copy":
                    x, at = concat.inputs[key], in_buffer([offsets[key] if a == axis else 0 for a in range(len(lens))])
                else:
                    inner, k, starts = key
                    x, at = inner.inputs[k], in_buffer(starts)
                b = GroupBuilder(group_name(module))
                value = b.gather(x)
                dest = b.param(buf)
                emb = _box_map(x, at, lens)
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
