"""Anchor fusion: a convolution, dot or pooling with its epilogue, as one fused instruction.

The epilogue grows forward from the anchor through every consumer whose map from the anchor's
output is invertible (Hidet's rule): pointwise ops (their other operands are side inputs, read
through their own view chains), bijective views (reshape, transpose, depth_to_space, ...),
unit-step slices (a split: each branch keeps a domain, the part of the anchor's output it
covers) and concats of branches of the same group; and a softmax whose runs lie within tiles
of the anchor's output channels, or a sum or mean over a convolution's pixels
(`reduction_epilogue.py`). Each tensor of the epilogue is a list of
pieces: where an anchor-output index lands in it, on which domain, with which value. The
group's output is stored through those maps, so the kernel writes the final layout directly.

A product's A operand is read through views and also computes the producers that
`prologue_rule.py` accepts (pointwise ops, a concat as a select, a layernorm over K), so its
kernel reads their inputs instead of a tensor written for it; the weights are read as they are.
A layernorm that other readers need is stored by the kernel as a further output too.

The same machinery serves reductions and data movement ops (`FuseReductions`,
`FuseMovement`): their prologue reads through views and recomputes pointwise producers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from fusegraph.ir.index_expr import bounds
from fusegraph.ir.index_map import IndexMap, embed_map, identity_map
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import OpKind
from fusegraph.ops.base import input_map_of as view_input_map
from fusegraph.passes.group_builder import GroupBuilder, Piece, Unfusable, group_name, kernel_name, place, reads_its_stores
from fusegraph.passes.prologue_rule import RECOMPUTE_BUDGET, PrologueRule, pointwise_ops
from fusegraph.passes.reduction_epilogue import pixel_reduction, row_statistics, segment_fold, segment_layernorm, segment_softmax
from fusegraph.passes.rewrite import rewrite_each
from fusegraph.passes.weighted_sum_epilogue import segment_weighted_sum


class _Epilogue:
    """Grows the epilogue of one anchor over the main module."""

    def __init__(self, module: Module, anchor: Instruction, builder: GroupBuilder) -> None:
        self.module = module
        self.anchor = anchor
        self.b = builder
        self.pos = {id(i): k for k, i in enumerate(module.instructions)}
        self.pieces: dict[int, list[Piece]] = {}
        self.members: list[Instruction] = []

    def depends_on_group(self, x: Instruction) -> bool:
        """Whether outside value `x` is computed from a group member (it would make a cycle)."""
        start = self.pos[id(self.anchor)]
        stack, seen = [x], set()
        while stack:
            ins = stack.pop()
            if id(ins) in self.pieces:
                return True
            if id(ins) in seen or self.pos.get(id(ins), -1) <= start:
                continue
            seen.add(id(ins))
            stack.extend(ins.inputs)
        return False

    def absorb(self, ins: Instruction) -> list[Piece] | None:
        if ins.shape.elements == 0 or any(self._only_stored(x) for x in ins.inputs):
            return None
        op = ins.op
        src = [self.pieces.get(id(x)) for x in ins.inputs]
        if op.kind == OpKind.VIEW and op.bijective and src[0] is not None:
            vm = view_input_map(ins)
            inv = vm.inverse() if vm is not None else None
            if inv is None:
                return None
            return [Piece(inv.after(p.map), p.domain, p.value) for p in src[0]]
        cut = op.ranges()
        if cut is not None and src[0] is not None:
            return self._slice(ins, cut, src[0])
        if op.kind == OpKind.POINTWISE:
            return self._pointwise(ins, src)
        if op.kind == OpKind.REDUCE and src[0] is not None:
            rules = [segment_softmax, segment_fold, segment_layernorm]
            held = [p.value for m in self.members for p in self.pieces[id(m)] if p.value.op.only_stored]
            if not held:  # one reduction across programs per kernel
                rules += [pixel_reduction, row_statistics]
            elif all(v.op.algorithm == "epilogue_row_stat" and v.inputs[0] is src[0][0].value for v in held):
                rules.append(row_statistics)  # another statistic of the same rows: the same rendezvous
            return next((got for rule in rules if (got := rule(self.anchor, ins, src[0], self.b)) is not None), None)
        if op.kind == OpKind.ANCHOR and src[0] is not None and not any(self.depends_on_group(x) for x in ins.inputs[1:]):
            return segment_weighted_sum(self.anchor, ins, src[0], self.b)
        if op.concatenates and all(s is not None for s in src):
            out: list[Piece] = []
            axis, offset = ins.op.attrs["axis"], 0
            for x, ps in zip(ins.inputs, src):
                emb = embed_map(x.shape.lens, ins.shape.lens, axis, offset)
                out += [Piece(emb.after(p.map), p.domain, p.value) for p in ps]  # type: ignore[union-attr]
                offset += x.shape.lens[axis]
            return out
        return None

    def _only_stored(self, x: Instruction) -> bool:
        """Whether member `x` is a sum over the anchor's pixels or its rows' statistics, which no
        element of the epilogue can read (each program holds a part of what they reduce)."""
        return any(p.value.op.only_stored for p in self.pieces.get(id(x), []))

    def _slice(self, ins: Instruction, cut: tuple[tuple[int, int, int], ...], pieces: list[Piece]) -> list[Piece] | None:
        out = []
        for p in pieces:
            exprs = list(p.map.exprs)
            domain = list(p.domain)
            empty = False
            for axis, start, end in cut:
                e = exprs[axis]
                lo, hi = bounds(e)
                if hi < start or lo >= end:
                    empty = True
                    break
                if lo < start or hi >= end:
                    domain.append((e, start, end))
                exprs[axis] = e - start
            if not empty:
                out.append(Piece(IndexMap(p.map.out_vars, exprs, ins.shape.lens), tuple(domain), p.value))
        return out or None

    def _pointwise(self, ins: Instruction, src: Sequence[list[Piece] | None]) -> list[Piece] | None:
        inside = [s for s in src if s is not None]
        keys = [[(p.map, p.domain) for p in s] for s in inside]
        if any(k != keys[0] for k in keys[1:]):
            return None  # operands reached from the anchor by different paths
        if any(self.depends_on_group(x) for x, s in zip(ins.inputs, src) if s is None):
            return None
        out = []
        # (not beside a layernorm its prologue computes, whose values and stores the prologue rule owns)
        self.b.inline = _never if self.b.computed else _SideInputs(self.module, ins)
        try:
            for k, p in enumerate(inside[0]):
                args = [s[k].value if s is not None else self.b.gather(x, p.map, p.domain)
                        for x, s in zip(ins.inputs, src)]
                out.append(Piece(p.map, p.domain, self.b.add(ins.op, args, ins.origin)))
        finally:
            self.b.inline = _never
        return out

    def grow(self, anchor_value: Instruction) -> "Grown":
        a = self.anchor
        self.pieces[id(a)] = [Piece(identity_map(a.shape.lens), (), anchor_value)]
        self.members = [a]
        for ins in self.module.instructions[self.pos[id(a)] + 1:]:
            if not any(id(x) in self.pieces for x in ins.inputs):
                continue
            got = self.absorb(ins)
            if got is not None:
                self.pieces[id(ins)] = got
                self.members.append(ins)
        return self._choose_outputs()

    def _choose_outputs(self) -> "Grown":
        """Every member but those cut off below; the latest is the group's value and each other
        member read outside the group (or returned) is stored too, as a further output. Where
        a further output would feed a concat, the group keeps one output: concat elimination
        writes a group's value into the concat's buffer, a further output would need a copy.

        A view, slice or concat member read outside is cut off with everything computed from
        it, unless it is the group's only stored value: storing it as well as a value it
        rearranges would write the same elements twice, while left outside it reads the
        stored value for free (a slice of merged siblings' output, a transposed copy). Where
        no further output remains, the single-output rule chooses (a view it allows, as the
        transpose attention reads its heads through, stays the group's value)."""
        users = self.module.users()
        returned = {id(r) for r in self.module.returns}
        kept = {id(m) for m in self.members}

        def read_outside(m: Instruction) -> bool:
            return id(m) in returned or any(id(u) not in kept for u in users[m])

        changed = True
        while changed:
            group = [m for m in self.members if id(m) in kept]
            # values written element by element: a reduction across programs (the statistics
            # of a view's rows) rearranges nothing, and the view may be stored beside it
            stored = [m for m in group if read_outside(m) and not self._only_stored(m)]
            latest = next(m for m in reversed(group) if not self._only_stored(m))
            cut = [m for m in stored if m.op.kind in (OpKind.VIEW, OpKind.MOVE) and m is not self.anchor
                   and (m is not latest or len(stored) > 1)]
            changed = bool(cut)
            for m in cut:
                kept -= self._descendants(m)
        group = [m for m in self.members if id(m) in kept]
        extras = [m for m in group[:-1] if read_outside(m)]
        if not extras:  # one stored value: the old rule's latest, which may be a view it allows
            return self._single_output()
        if any(u.op.concatenates for m in extras for u in users[m]):
            return self._single_output()  # a concat part is written in place only as a group's value
        single = self._single_output()
        if self._prologues_compute(single, [m for m in group if read_outside(m)]):
            return single
        out = group[-1]
        return Grown(out, self.pieces[id(out)], group, [(m, self.pieces[id(m)]) for m in extras])

    def _prologues_compute(self, single: "Grown", stored: list[Instruction]) -> bool:
        """Whether the one-output group `single` already gives the kernels their values: every
        member stored beyond it is pointwise and read outside only by products that would
        compute it in their prologue (`PrologueRule`) from `single`'s output. Storing it then
        saves no kernel and costs a write of every element."""
        inside = {id(m) for m in single.members}
        beyond = [m for m in stored if id(m) not in inside]
        if not beyond or any(m.op.kind != OpKind.POINTWISE for m in beyond):
            return False
        kept, through_views = {id(m) for m in self.members}, PrologueRule(self.module, self.anchor)
        for m in beyond:
            readers = through_views.readers(m)
            outside = [u for u in readers or [] if id(u) not in kept]
            if readers is None or not outside or not all(PrologueRule(self.module, u)(m) for u in outside):
                return False
        return True

    def _single_output(self) -> "Grown":
        """The latest member whose ancestors in the group are read only inside them, alone."""
        users = self.module.users()
        returned = {id(r) for r in self.module.returns}
        for out in reversed(self.members):
            closure = self._ancestors(out)
            if all(id(m) not in returned and all(id(u) in closure for u in users[m])
                   for m in self.members if id(m) in closure and m is not out):
                return Grown(out, self.pieces[id(out)], [m for m in self.members if id(m) in closure], [])
        raise AssertionError("the anchor alone is always a valid group")

    def _ancestors(self, out: Instruction) -> set[int]:
        closure, stack = set(), [out]
        while stack:
            ins = stack.pop()
            if id(ins) in closure or id(ins) not in self.pieces:
                continue
            closure.add(id(ins))
            stack.extend(ins.inputs)
        return closure

    def _descendants(self, m: Instruction) -> set[int]:
        """`m` and the members computed from it."""
        out = {id(m)}
        for ins in self.members:
            if any(id(x) in out for x in ins.inputs):
                out.add(id(ins))
        return out


@dataclass
class Grown:
    """A grown group: its value `out` (stored through `pieces`), its members in program order
    (the anchor first) and the further outputs, each a member and its pieces."""

    out: Instruction
    pieces: list[Piece]
    members: list[Instruction]
    extras: list[tuple[Instruction, list[Piece]]]


def anchor_group(module: Module, anchor: Instruction) -> tuple[Instruction, list[Instruction]]:
    """The output and the members (in program order, the anchor first) of the group that
    `FuseAnchors` would build for `anchor` in `module` as it stands; `module` is not changed.

    Rewrites that run before fusion ask this to learn which instructions would share a kernel
    with an anchor, from the same rule that fusion applies.
    """
    b = GroupBuilder("probe")
    try:
        if anchor.shape.elements == 0:
            raise Unfusable(f"empty tensor {anchor.shape}")
        value = b.add(anchor.op, [b.gather(x) for x in anchor.inputs], anchor.origin)
        grown = _Epilogue(module, anchor, b).grow(value)
    except Unfusable:
        return anchor, [anchor]
    return grown.out, grown.members


def part_anchor(module: Module, part: Instruction, pos: dict[int, int], groups: dict[int, set[int]]) -> Instruction | None:
    """The anchor whose fused group (as fusion would build it now) computes `part`: the
    nearest anchor above it (through views, pointwise ops and reductions; `pos` gives program
    positions), when the part is a member of its group; else None. `groups` caches each probed
    anchor's members' ids."""
    stack, seen, nearest = [part], set(), None
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x.op.kind == OpKind.ANCHOR:
            nearest = x if nearest is None or pos[id(x)] > pos[id(nearest)] else nearest
        elif x.op.kind in (OpKind.VIEW, OpKind.POINTWISE, OpKind.REDUCE):
            stack.extend(x.inputs)
    if nearest is None:
        return None
    if id(nearest) not in groups:
        groups[id(nearest)] = {id(m) for m in anchor_group(module, nearest)[1]}
    return nearest if id(part) in groups[id(nearest)] else None


def _never(ins: Instruction, at: IndexMap) -> bool:
    return False


class _SideInputs:
    """Which producers of an epilogue op's side inputs the kernel computes where it reads them:
    pointwise ops that nothing else reads (through views), at most `RECOMPUTE_BUDGET` of them
    per element. Their own kernel would write a tensor this kernel alone reads back (the
    normalized rows that `defer_norm` leaves for a residual add after a post-norm)."""

    def __init__(self, module: Module, reader: Instruction) -> None:
        self.module, self.reader = module, reader
        self.rule: PrologueRule | None = None  # its readers-through-views walk, made at the first pointwise side input
        self.inside = {id(reader)}

    def __call__(self, ins: Instruction, at: IndexMap) -> bool:
        if ins.op.kind != OpKind.POINTWISE or pointwise_ops(ins) > RECOMPUTE_BUDGET:
            return False
        if self.rule is None:
            self.rule = PrologueRule(self.module, self.reader)
        readers = self.rule.readers(ins)
        ok = readers is not None and all(id(u) in self.inside for u in readers)
        if ok:
            self.inside.add(id(ins))
        return ok


def _pointwise(ins: Instruction, at: IndexMap) -> bool:
    """Every pointwise producer, recomputed: a reduction or a movement op reads each element once."""
    return ins.op.kind == OpKind.POINTWISE


def _per_element(ins: Instruction, at: IndexMap) -> bool:
    """Pointwise producers and the movement ops that find each element on their own (a gather,
    a pad), recomputed: a reduction reads each element once, so a gathered row costs its load
    there as in a kernel of its own (BERT's embedding lookups in front of their sum's layernorm)."""
    return _pointwise(ins, at) or ins.op.finds_elements


class FuseAnchors:
    """One fused instruction per anchor, with its prologue (views, and for a product what
    `PrologueRule` accepts) and its invertible epilogue."""

    name = "fuse_anchors"
    kinds: tuple[OpKind, ...] = (OpKind.ANCHOR,)

    def apply(self, module: Module) -> bool:
        def try_fuse(anchor: Instruction) -> bool:
            if not self.wants(anchor) or anchor not in module.instructions or anchor.shape.elements == 0:
                return False
            try:
                self.fuse(module, anchor)
            except Unfusable:
                return False
            return True

        return rewrite_each(module, try_fuse, drop_dead=True)

    def wants(self, ins: Instruction) -> bool:
        return ins.op.kind in self.kinds

    def prologue(self, module: Module, anchor: Instruction) -> Callable[[Instruction, IndexMap], bool]:
        """Which producers of the anchor's first input its kernel computes (`prologue_rule.py`)."""
        return PrologueRule(module, anchor)

    def fuse(self, module: Module, anchor: Instruction) -> Instruction:
        rule = self.prologue(module, anchor)
        fused, g, extras = self._build(module, anchor, rule)
        stored = rule.stored if isinstance(rule, PrologueRule) else []
        if reads_its_stores(module, fused.inputs, stored):  # built again, its prologue storing nothing
            fused, g, extras = self._build(module, anchor, PrologueRule(module, anchor, may_store=False))
        place(module, fused, g.out, g.members, [m for m, _ in extras])
        return fused

    def _build(self, module: Module, anchor: Instruction, rule: Callable[[Instruction, IndexMap], bool]
               ) -> tuple[Instruction, Grown, list[tuple[Instruction, list[Piece]]]]:
        """The group's (unplaced) fused instruction, its growth and its further outputs: the
        epilogue's, then the values its prologue stores for other readers (`PrologueRule.stored`)."""
        b = GroupBuilder(group_name(module), rule)
        operands = []
        for k, x in enumerate(anchor.inputs):
            # the first input's producers by the prologue rule; an input the op reads once per
            # element (attention's mask) recomputed whole; weights and side inputs read as they are
            b.inline = rule if k == 0 else _pointwise if k in anchor.op.recomputed_inputs else _never
            operands.append(b.gather(x))
        b.inline = _never
        value = b.add(anchor.op, operands, anchor.origin)
        g = _Epilogue(module, anchor, b).grow(value)
        stored = rule.read_outside(rule.stored, g.members) if isinstance(rule, PrologueRule) else []
        extras = g.extras + [e for x in stored for e in _stored_rows(b, rule, g.members, x)]  # type: ignore[arg-type]
        return b.finish(g.out, g.pieces, kernel_name(b.inlined + g.members), extras), g, extras


def _stored_rows(b: GroupBuilder, rule: PrologueRule, members: list[Instruction], x: Instruction
                 ) -> list[tuple[Instruction, list[Piece]]]:
    """The further outputs for prologue value `x` that others read: `x` itself, or the values of
    the pointwise ops on it and constants that are all its outside readers
    (`PrologueRule.constant_tails`), computed at the index `x` is computed at."""
    piece = b.computed[id(x)]
    tails = rule.constant_tails(x, members)
    if tails is None:
        return [(x, [piece])]
    ops, ends = tails
    values = {id(x): piece.value}
    for u in ops:
        operands = [values[id(i)] if id(i) in values else b.gather(i, piece.map, piece.domain) for i in u.inputs]
        values[id(u)] = b.add(u.op, operands, u.origin)
    return [(u, [Piece(piece.map, piece.domain, values[id(u)])]) for u in ends]


class FuseReductions(FuseAnchors):
    """Reductions (reduce_*, softmax, layernorm, lrn) with a recomputed pointwise prologue and
    an invertible epilogue."""

    name = "fuse_reductions"
    kinds = (OpKind.REDUCE,)

    def prologue(self, module: Module, anchor: Instruction) -> Callable[[Instruction, IndexMap], bool]:
        return _per_element


class FuseMovement(FuseAnchors):
    """Data movement that is not a view (gather, pad, non-integer resize) with its prologue
    and epilogue; concat is left to concat elimination."""

    name = "fuse_movement"
    kinds = (OpKind.MOVE,)

    def prologue(self, module: Module, anchor: Instruction) -> Callable[[Instruction, IndexMap], bool]:
        return _pointwise

    def wants(self, ins: Instruction) -> bool:
        # movement with an index map (a resize that reads `o // k`) is a view: its reader loads through it
        if ins.op.concatenates or view_input_map(ins) is not None:
            return False
        return ins.op.kind in self.kinds
