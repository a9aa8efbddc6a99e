"""Concat sinking: ops after a concat that work along its axis position by position move above
it, one copy per part, where each copy then joins the kernel that computes its part.

YOLOv8's detection tail concatenates its three levels' box logits along the anchor axis and
only then takes a softmax over each box side's 16 bins (through a reshape and a transpose) and
their weighted sum; no head convolution sees that softmax, since it reads all three levels, so
it ran as kernels of its own. Rewritten as concat(softmax(a), softmax(b), softmax(c)), each
level's softmax and sum join its head convolution's epilogue (`reduction_epilogue.py`,
`weighted_sum_epilogue.py`) and concat elimination writes the three results into one buffer.
The class scores' sigmoid after their concat joins each class convolution the same way.

Legality: op(concat(p_1, .., p_k)) = concat(op(p_1'), .., op(p_k')) when each position of the
op's output along the concat axis is computed from the same position of its inputs alone,
that axis mapping to one output axis:

* pointwise ops, and reductions (softmax, layernorm, folds) that do not reduce that axis: the
  axis is kept; their other operands are sliced to each part's range;
* views that keep the axis whole: a transpose moves it, a slice that does not cut it keeps it,
  a reshape keeps it when it only regroups the axes before it and the axes after it;
* a concat along another axis, its other inputs sliced;
* a convolution along a spatial axis its 1x1 window reads without stride or padding (its
  weights read as they are).

Profit: a copy per part pays only where each copy joins its part's kernel; elsewhere it would
multiply small kernels. So each part must be computed by an anchor's group (the nearest anchor
above it, as `fuse_anchors.anchor_group` builds it) that does not hold the concat already, or
be a constant (computed from literals alone), which concat elimination copies into the
buffer with a kernel anyway: that kernel then computes the part's copies instead (a vision
transformer's class token plus its position, next to the patch tokens' convolution, which
adds theirs in its epilogue; the sum over all tokens is then never a pass of its own). At
least one part must be an anchor's. The
pass then grows the sunk region from the concat in program order, one computing op at a time
(with the views between), rewrites the program with it on trial and asks fusion's own rule
(`anchor_group`) whether every copy of every computing op in the region joins its part's
anchor's group; an op that passes stays in the region. Region values read outside it become
one concat of their copies again, which concat elimination writes in place.
"""

from __future__ import annotations

import math
from typing import Sequence

from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import Op, OpKind, is_literal
from fusegraph.ops.movement import Concat
from fusegraph.ops.views import Reshape, Slice
from fusegraph.passes.fuse_anchors import anchor_group, part_anchor
from fusegraph.passes.rewrite import rewrite_each


def view_axis(view: Instruction, axis: int) -> int | None:
    """The output axis of `view` that holds input axis `axis` whole and alone, or None."""
    op, in_lens, out_lens = view.op, view.inputs[0].shape.lens, view.shape.lens
    perm = op.axis_permutation()
    if perm is not None:
        return perm.index(axis)
    cut = op.ranges()
    if cut is not None:
        return None if any(a == axis for a, _, _ in cut) else axis
    if op.keeps_order:
        before, after = math.prod(in_lens[:axis]), math.prod(in_lens[axis + 1:])
        for b, n in enumerate(out_lens):
            if n == in_lens[axis] and math.prod(out_lens[:b]) == before and math.prod(out_lens[b + 1:]) == after:
                return b
    return None


def window_free_axis(anchor: Instruction, axis: int) -> int | None:
    """`axis` when it is a spatial axis of convolution `anchor` whose window is one position
    wide, without stride or padding: each output position reads only its own input position."""
    op = anchor.op
    if not op.spatial_window or op.weight_input is None or axis < 2:
        return None
    w, k, i = anchor.inputs[op.weight_input], anchor.shape.ndim - 2, axis - 2
    pad = op.attrs["padding"]
    if w.shape.lens[axis] != 1 or op.attrs["stride"][i] != 1 or pad[i] or pad[i + k]:
        return None
    return axis


def split_axis(ins: Instruction, axes: Sequence[int | None]) -> int | None:
    """The axis along which `ins`'s output splits when its inputs split along `axes` (None
    for an input that does not), or None when `ins` does not work along it position by
    position (the module docstring lists the cases)."""
    split = {a for a in axes if a is not None}
    if len(split) != 1 or ins.shape.elements == 0:
        return None
    (a,) = split
    op = ins.op
    if op.kind == OpKind.POINTWISE:
        return a
    if op.concatenates:
        return None if op.attrs["axis"] == a else a
    if op.kind == OpKind.VIEW:
        return view_axis(ins, a)
    if op.kind == OpKind.REDUCE:
        try:
            reduced = op.reduced_axes(ins.inputs[0].shape.ndim)
        except NotImplementedError:
            return None  # a window across an axis (LRN)
        return None if a in reduced else a
    if op.kind == OpKind.ANCHOR and axes[0] is not None and all(x is None for x in axes[1:]):
        return window_free_axis(ins, a)
    return None


def _part_op(ins: Instruction, axis: int, length: int) -> Op:
    """`ins`'s op for a part `length` long along output axis `axis`."""
    if ins.op.kind == OpKind.VIEW and ins.op.keeps_order:
        lens = list(ins.shape.lens)
        lens[axis] = length
        return Reshape(lens)
    return ins.op


class _Snapshot:
    """A module's instructions, their inputs and its returns, to undo a trial rewrite."""

    def __init__(self, module: Module) -> None:
        self.module = module
        self.instructions = list(module.instructions)
        self.inputs = [list(i.inputs) for i in self.instructions]
        self.returns = list(module.returns)

    def restore(self) -> None:
        self.module.instructions = list(self.instructions)
        for ins, xs in zip(self.instructions, self.inputs):
            ins.inputs = list(xs)
        self.module.returns = list(self.returns)


def sink(module: Module, concat: Instruction, region: Sequence[Instruction]) -> dict[int, list[Instruction]]:
    """Rewrite `region` (instructions after `concat` in program order, each computed from
    `concat` or earlier ones of it through `split_axis`) into one copy per part of `concat`;
    region values read outside it become concats of their copies. Returns the copies of each
    region instruction (by id)."""
    axis = concat.op.attrs["axis"]
    sizes = [x.shape.lens[axis] for x in concat.inputs]
    split: dict[int, tuple[int, list[Instruction]]] = {id(concat): (axis, list(concat.inputs))}

    def place(before: Instruction, op: Op, args: list[Instruction]) -> Instruction:
        return module.insert_before(before, module.make(op, args, before.origin))

    for r in region:
        axes = [split[id(x)][0] if id(x) in split else None for x in r.inputs]
        b = split_axis(r, axes)
        assert b is not None, f"{r.op} cannot be sunk below {concat.op}"
        parts, start = [], 0
        for j, n in enumerate(sizes):
            args = [split[id(x)][1][j] if a is not None else x if r.op.kind == OpKind.ANCHOR
                    else place(r, Slice([b], [start], [start + n]), [x]) for x, a in zip(r.inputs, axes)]
            parts.append(place(r, _part_op(r, b, n), args))
            start += n
        split[id(r)] = (b, parts)
    inside = {id(r) for r in region}
    users = module.users()
    for r in region:
        if r in module.returns or any(id(u) not in inside for u in users[r]):
            b, parts = split[id(r)]
            module.replace_uses(r, place(r, Concat(b), parts))
    for r in region:
        module.remove(r)
    if all(id(u) in inside for u in users[concat]) and concat not in module.returns:
        module.remove(concat)
    return {k: v[1] for k, v in split.items() if k != id(concat)}


def constant(part: Instruction) -> bool:
    """Whether `part` is computed from literals alone (through views and pointwise ops)."""
    stack, seen = [part], set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if is_literal(x):
            continue
        if x.op.kind not in (OpKind.VIEW, OpKind.POINTWISE) or not x.inputs:
            return False
        stack.extend(x.inputs)
    return True


def computes_below(concat: Instruction, users: dict[Instruction, list[Instruction]]) -> bool:
    """Whether an op that computes (neither a view nor a concat) splits along `concat`'s parts
    below it, reached through views and concats that split (`split_axis`): nothing else is
    worth sinking."""
    stack = [(concat, concat.op.attrs["axis"])]
    while stack:
        x, axis = stack.pop()
        for u in users.get(x, []):
            b = split_axis(u, [axis if y is x else None for y in u.inputs])
            if b is not None and u.op.kind != OpKind.VIEW and not u.op.concatenates:
                return True
            if b is not None:
                stack.append((u, b))
    return False


class SinkConcat:
    """Sinks what each concat's readers compute per part into the parts' kernels (see the
    module docstring)."""

    name = "sink_concat"

    def apply(self, module: Module) -> bool:
        facts: list = []  # the module's readers and positions, while it is unchanged

        def try_sink(ins: Instruction) -> bool:
            if not ins.op.concatenates:
                return False
            if not facts:
                facts.extend([module.users(), {id(i): k for k, i in enumerate(module.instructions)}])
            users, pos = facts
            if id(ins) not in pos or not self.sink_below(module, ins, users, pos):
                return False
            facts.clear()
            return True

        return rewrite_each(module, try_sink, drop_dead=True)

    def sink_below(self, module: Module, concat: Instruction, users: dict[Instruction, list[Instruction]],
                   pos: dict[int, int]) -> bool:
        """Sink the largest region below `concat` whose copies all join their parts' kernels
        (`users` and `pos`: the module's readers and program positions)."""
        axis = concat.op.attrs["axis"]
        if len(concat.inputs) < 2 or concat.shape.elements == 0:
            return False
        if not computes_below(concat, users):
            return False
        anchors: list[Instruction | None] = []  # None: a constant part
        groups: dict[int, set[int]] = {}
        for x in concat.inputs:
            a = part_anchor(module, x, pos, groups)
            if a is None and not constant(x):
                return False  # a part no kernel computes
            if a is not None and id(concat) in groups[id(a)]:
                return False  # the concat is already in a part's kernel
            anchors.append(a)
        if all(a is None for a in anchors):
            return False
        snapshot = _Snapshot(module)
        axis_of: dict[int, int] = {id(concat): axis}
        committed: list[Instruction] = []
        pending: list[Instruction] = []  # views whose readers may still join
        for r in snapshot.instructions[pos[id(concat)] + 1:]:
            axes = [axis_of.get(id(x)) for x in r.inputs]
            b = split_axis(r, axes) if any(a is not None for a in axes) else None
            if b is None:
                continue
            if r.op.kind == OpKind.VIEW:
                pending.append(r)
                axis_of[id(r)] = b
                continue
            views = _pending_above(r, pending)
            trial = sorted([*committed, *views, r], key=lambda i: pos[id(i)])
            copies = sink(module, concat, trial)
            joined = self._all_join(module, anchors, trial, copies)
            snapshot.restore()
            if joined:
                committed = trial
                pending = [v for v in pending if v not in views]
                axis_of[id(r)] = b
        if not committed:
            return False
        sink(module, concat, committed)
        return True

    @staticmethod
    def _all_join(module: Module, anchors: list[Instruction | None], region: list[Instruction],
                  copies: dict[int, list[Instruction]]) -> bool:
        """Whether every copy of each computing op of `region` is a member of its part's anchor's
        group (a constant part's copies make the kernel that fills its part)."""
        groups: dict[int, set[int]] = {}
        for a in anchors:
            if a is not None and id(a) not in groups:
                groups[id(a)] = {id(m) for m in anchor_group(module, a)[1]}
        return all(a is None or id(c) in groups[id(a)] for r in region if r.op.kind != OpKind.VIEW
                   for a, c in zip(anchors, copies[id(r)]))


def _pending_above(ins: Instruction, pending: list[Instruction]) -> list[Instruction]:
    """The views of `pending` that `ins` reads, directly or through each other."""
    out: list[Instruction] = []
    stack = list(ins.inputs)
    while stack:
        x = stack.pop()
        if any(x is v for v in pending) and not any(x is v for v in out):
            out.append(x)
            stack.extend(x.inputs)
    return out
