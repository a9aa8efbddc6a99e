"""Horizontal fusion: sibling anchors that read the same input become one anchor.

Convolutions (group 1) or matrix products that read the same instruction with the same
attributes and constant weights of the same shape compute `conv(x, W1)`, `conv(x, W2)`, ...:
one `conv(x, [W1; W2; ...])` computes all of them in one kernel that reads `x` once, and each
sibling's result is a slice of its output along the channel axis. The two 1x1 convolutions
that open a CSP block, Inception's 1x1 branch convolutions and the Q/K/V projections of
attention have this shape.

The rewrite runs before fusion and merges a sibling's whole epilogue with it, so that the
merged anchor's group is exactly the union of the groups the siblings would have had. It fires
only where that is the whole story:

* each sibling's group (asked of `fuse_anchors.anchor_group`, the rule fusion applies) is the
  anchor plus pointwise ops whose other operands are constants (a folded bias, a scale), and
  the groups are isomorphic, op for op; the merged epilogue reads the constants stacked along
  channels, so it splits by output channel without any branch or domain. An operand that is
  the same for every channel, a value per row computed before the siblings (the 1 / std by
  which `defer_norm` scales the rows of BERT's Q, K and V products), is shared, not stacked. A sibling's group is
  cut after that pointwise part: the views its kernel would also hold (BERT's head splits of
  Q, K and V, each its own reshape and transpose) stay behind as readers of its slice, and the
  kernels reading them (the attention kernel) read through their maps. A sibling whose
  pointwise part holds a reduction or a computed operand (which could depend on another
  sibling's result: a cycle) does not merge;
* no sibling's result is returned, and the results that feed a concat (along the channel axis)
  feed one concat, at a run of its slots at its start or its end. The merged output is ordered
  so that this run faces the concat and the other siblings' channels lie outside it: concat
  elimination then lets the merged kernel write its channels into the concat's buffer, extended
  by the extra channels, which their readers see through a slice view, so no copy appears.
  Siblings that do not fit this stay as they are.

Every member of a merged group depends only on the shared input and constants, so the merged
anchor can sit where the first sibling was without creating a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

import numpy as np

from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import OpKind
from fusegraph.ops.source import make_literal
from fusegraph.ops.views import MultiBroadcast, Slice
from fusegraph.passes.dead_code import DeadCodeElimination
from fusegraph.passes.fuse_anchors import anchor_group
from fusegraph.passes.literal_values import broadcast_literal


@dataclass
class _Sibling:
    anchor: Instruction
    out: Instruction  # the output of the anchor's group
    members: list[Instruction]  # the anchor first, then its epilogue in program order


def _weights(anchor: Instruction) -> Instruction:
    return anchor.inputs[anchor.op.weight_input]


def _weight_axis(anchor: Instruction) -> int:
    """The axis of output channels in the weights: M of conv's [M, C, *k], N of dot's [..., K, N]."""
    return anchor.op.weight_channel_axis(_weights(anchor).shape.ndim)


def _channel_axis(anchor: Instruction) -> int:
    """The axis of output channels in the anchor's result."""
    return anchor.op.channel_axis(anchor.shape.ndim)


def _family_key(ins: Instruction) -> Hashable | None:
    """Anchors with equal keys compute the same function of the same input, up to their weights
    along the output-channel axis; None for an instruction that cannot be merged."""
    if ins.op.family != "gemm" or ins.op.weight_input is None or ins.shape.elements == 0:
        return None
    if ins.op.attrs.get("group", 1) != 1:
        return None  # grouped channels do not stack into one weight tensor
    w = _weights(ins)
    if broadcast_literal(w) is None:
        return None
    lens = list(w.shape.lens)
    del lens[_weight_axis(ins)]
    data = tuple(id(x) for k, x in enumerate(ins.inputs) if k != ins.op.weight_input)
    return ins.op, data, tuple(lens), w.shape.dtype


def _constant(x: Instruction, anchor: Instruction) -> np.ndarray | None:
    """The value of side operand `x` at the anchor's rank when it is a constant, else None."""
    value = broadcast_literal(x)
    return value if value is not None and value.ndim == anchor.shape.ndim else None


def _row_source(x: Instruction, anchor: Instruction, pos: dict[int, int]) -> Instruction | None:
    """The value side operand `x` broadcasts along the output channels when it is the same for
    every channel and computed before the anchor (a deferred layernorm's 1 / std per row,
    `defer_norm`): siblings sharing it read it the same way merged, and it cannot depend on any
    of them. None otherwise."""
    if not x.op.broadcasts or x.shape.lens != anchor.shape.lens:
        return None
    source = x.inputs[0]
    axis = _channel_axis(anchor)
    if source.shape.ndim != anchor.shape.ndim or source.shape.lens[axis] != 1:
        return None
    return source if pos.get(id(source), len(pos)) < pos[id(anchor)] else None


def _pointwise_prefix(s: _Sibling, pos: dict[int, int]) -> _Sibling:
    """The sibling cut after its pointwise epilogue: views that follow (a head split) stay
    behind as readers of its slice of the merged output, which fusion then stores through."""
    index = {id(s.anchor)}
    members = [s.anchor]
    for m in s.members[1:]:
        if m.op.kind != OpKind.POINTWISE or m.shape.lens != s.anchor.shape.lens:
            break
        if not all(id(x) in index or _constant(x, s.anchor) is not None or _row_source(x, s.anchor, pos) is not None
                   for x in m.inputs):
            break
        members.append(m)
        index.add(id(m))
    if len(members) == len(s.members):
        return s
    return _Sibling(s.anchor, members[-1], members)


def _signature(s: _Sibling, pos: dict[int, int]) -> Hashable | None:
    """The shape of a sibling's group: its epilogue ops and where each operand comes from (a member
    by index, None for a constant, or the row value it broadcasts: `_row_source`), and which
    member is the output; None when the group holds anything else (views, reductions, an
    operand computed outside it)."""
    index = {id(m): k for k, m in enumerate(s.members)}
    entries = []
    for m in s.members[1:]:
        if m.op.kind != OpKind.POINTWISE or m.shape.lens != s.anchor.shape.lens:
            return None
        refs: list[int | None | Instruction] = []
        for x in m.inputs:
            if id(x) in index:
                refs.append(index[id(x)])
            elif _constant(x, s.anchor) is not None:
                refs.append(None)
            elif (row := _row_source(x, s.anchor, pos)) is not None:
                refs.append(row)
            else:
                return None
        entries.append((m.op, tuple(refs)))
    return tuple(entries), index[id(s.out)]


def _ordered(module: Module, siblings: list[_Sibling], users: dict[Instruction, list[Instruction]]) -> list[_Sibling]:
    """The siblings worth merging, in the channel order of the merged output (see the module
    docstring); fewer than two means no merge."""
    returned = {id(r) for r in module.returns}
    axis = _channel_axis(siblings[0].anchor)
    free: list[_Sibling] = []
    bound: dict[int, tuple[Instruction, dict[int, _Sibling]]] = {}
    for s in siblings:
        if id(s.out) in returned:
            continue
        concats = [u for u in users.get(s.out, []) if u.op.concatenates]
        if not concats:
            free.append(s)
            continue
        c = concats[0]
        if len(concats) > 1 or c.op.attrs["axis"] != axis or id(c) in returned:
            continue  # merging would cost a copy into the second concat (or the returned one)
        bound.setdefault(id(c), (c, {}))[1][id(s.out)] = s
    best: list[_Sibling] = []
    best_at_end = True
    for c, by_out in bound.values():
        tail: list[_Sibling] = []
        for x in reversed(c.inputs):
            if id(x) not in by_out:
                break
            tail.insert(0, by_out[id(x)])
        head: list[_Sibling] = []
        for x in c.inputs:
            if id(x) not in by_out:
                break
            head.append(by_out[id(x)])
        run, at_end = (tail, True) if len(tail) >= len(head) else (head, False)
        if len(run) > len(best):
            best, best_at_end = run, at_end
    return best + free if best_at_end else free + best


def _stacked(values: list[np.ndarray], siblings: list[_Sibling]) -> np.ndarray:
    """The siblings' constants side by side along the channel axis, as small as their values
    allow: an axis along which every one of them is constant keeps length 1, and a constant
    equal everywhere is a single element."""
    axis = _channel_axis(siblings[0].anchor)
    flat_axes = [a for a in range(values[0].ndim)
                 if a != axis and all(bool(np.all(v == v.take([0], axis=a))) for v in values)]
    parts = []
    for v, s in zip(values, siblings):
        lens = list(s.anchor.shape.lens)
        for a in flat_axes:
            lens[a] = 1
            v = v.take([0], axis=a)
        parts.append(np.broadcast_to(v, lens))
    value = np.concatenate(parts, axis=axis)
    flat = value.reshape(-1)
    if np.array_equal(flat, np.broadcast_to(flat[:1], flat.shape)):
        return flat[:1].reshape((1,) * value.ndim)
    return value


def _merged_constant(module: Module, siblings: list[_Sibling], member: int, operand: int,
                     lens: tuple[int, ...]) -> list[Instruction]:
    """A literal holding the siblings' constants for one operand of one epilogue member, and its
    broadcast to the merged shape `lens` (the last instruction is the operand)."""
    values = [_constant(s.members[member].inputs[operand], s.anchor) for s in siblings]
    value = _stacked(values, siblings)  # type: ignore[arg-type]
    x = siblings[0].members[member].inputs[operand]
    source = x
    while source.op.broadcasts:
        source = source.inputs[0]
    drop = value.ndim - source.shape.ndim  # keep the rank the constant had (leading dims of 1 go)
    if drop > 0 and all(n == 1 for n in value.shape[:drop]):
        value = value.reshape(value.shape[drop:])
    lit = make_literal(value.astype(x.shape.dtype.numpy), origin=x.origin)
    if lit.shape.lens == tuple(lens):
        return [lit]
    return [lit, module.make(MultiBroadcast(lens), [lit], x.origin)]


def _merged_weights(module: Module, group: list[_Sibling]) -> list[Instruction]:
    """The siblings' weights stacked along their output channels: one literal, behind a
    broadcast when each sibling's was one (a batched product's weights, kept as one matrix for
    all batches by `compact_literals`)."""
    a0 = group[0].anchor
    axis = _weight_axis(a0)
    values = [broadcast_literal(_weights(s.anchor)) for s in group]
    lens = list(_weights(a0).shape.lens)
    lens[axis] = sum(_weights(s.anchor).shape.lens[axis] for s in group)
    whole = [_weights(s.anchor).shape.lens for s in group]
    # the compact values stack only where each holds all its output channels and the rest agree
    if (any(v.shape[axis] != w[axis] for v, w in zip(values, whole))  # type: ignore[union-attr]
            or len({v.shape[:axis] + v.shape[axis + 1:] for v in values}) != 1):  # type: ignore[union-attr]
        values = [np.broadcast_to(v, w) for v, w in zip(values, whole)]  # type: ignore[arg-type]
    lit = make_literal(np.concatenate(values, axis=axis), origin=_weights(a0).origin)  # type: ignore[arg-type]
    if list(lit.shape.lens) == lens:
        return [lit]
    return [lit, module.make(MultiBroadcast(lens), [lit], lit.origin)]


def _merge(module: Module, group: list[_Sibling], signature: Hashable) -> None:
    """Replace the siblings' groups by one anchor with stacked weights and one epilogue; each
    sibling's output becomes a slice of the merged output."""
    entries, out_index = signature  # type: ignore[misc]
    pos = {id(i): k for k, i in enumerate(module.instructions)}
    first = min((s.anchor for s in group), key=lambda a: pos[id(a)])
    a0 = group[0].anchor
    added = _merged_weights(module, group)
    inputs = list(a0.inputs)
    inputs[a0.op.weight_input] = added[-1]
    added.append(module.make(a0.op, inputs, a0.origin))
    merged = [added[-1]]
    for j, (op, refs) in enumerate(entries, start=1):
        args = []
        for k, ref in enumerate(refs):
            if ref is None:
                added += _merged_constant(module, group, j, k, merged[0].shape.lens)
                args.append(added[-1])
            elif isinstance(ref, Instruction):  # a row value, broadcast along the merged channels
                added.append(module.make(MultiBroadcast(merged[0].shape.lens), [ref], group[0].members[j].origin))
                args.append(added[-1])
            else:
                args.append(merged[ref])
        merged.append(module.make(op, args, group[0].members[j].origin))
        added.append(merged[-1])
    out = merged[out_index]
    axis = _channel_axis(a0)
    offset = 0
    for s in group:
        n = s.anchor.shape.lens[axis]
        part = module.make(Slice([axis], [offset], [offset + n]), [out], s.out.origin)
        module.replace_uses(s.out, part)
        added.append(part)
        offset += n
    for ins in added:
        module.insert_before(first, ins)


class MergeSiblings:
    """Sibling convolutions and matrix products with constant weights become one anchor."""

    name = "merge_siblings"

    def apply(self, module: Module) -> bool:
        families: dict[Hashable, list[Instruction]] = {}
        for ins in module.instructions:
            key = _family_key(ins)
            if key is not None:
                families.setdefault(key, []).append(ins)
        changed = False
        for anchors in families.values():
            if len(anchors) < 2:
                continue
            classes: dict[Hashable, list[_Sibling]] = {}
            pos = {id(i): k for k, i in enumerate(module.instructions)}
            for a in anchors:
                s = _pointwise_prefix(_Sibling(a, *anchor_group(module, a)), pos)
                sig = _signature(s, pos)
                if sig is not None:
                    classes.setdefault(sig, []).append(s)
            users = module.users()
            for sig, siblings in classes.items():
                if len(siblings) < 2:
                    continue
                group = _ordered(module, siblings, users)
                if len(group) >= 2:
                    _merge(module, group, sig)
                    changed = True
            if changed:
                DeadCodeElimination().apply(module)
        return changed
