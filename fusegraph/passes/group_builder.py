"""Building the sub-module of a fused group and putting the group into the main module.

Shared by every fusion pass: reading an outside value through its view chain as one `load`
(gather style), recomputing inlined pointwise producers at the index they are read, and
replacing the group's members by one `fused` instruction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from fusegraph.ir.index_expr import bounds
from fusegraph.ir.index_map import IndexMap, identity_map
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import Op, OpKind, is_fused
from fusegraph.ops.base import input_map_of as view_input_map
from fusegraph.ops.fused import Allocate, Domain, Fused, FusedOutput, Load, Select, Store
from fusegraph.ops.source import add_param
from fusegraph.passes.dead_code import DeadCodeElimination


class Unfusable(Exception):
    """Raised while building a group that cannot be expressed (an empty tensor has no index
    map); the pass leaves the instruction as it is."""


@dataclass(frozen=True)
class Piece:
    """Part of a tensor computed by a group: its anchor-space index lands at `map(i)` on `domain`."""

    map: IndexMap
    domain: Domain
    value: Instruction  # in the sub-module


class GroupBuilder:
    """Accumulates one group's sub-module; outside instructions become its inputs."""

    def __init__(self, name: str, inline: Callable[[Instruction, IndexMap], bool] = lambda ins, at: False) -> None:
        self.sub = Module(name)
        self.inputs: list[Instruction] = []
        self._params: dict[int, Instruction] = {}
        self._loads: dict[tuple, Instruction] = {}
        self._gathers: dict[tuple, Instruction] = {}
        self.inline = inline
        self.inlined: list[Instruction] = []  # recomputed here; removed by DCE once unread
        # each inlined layernorm where it is first computed: the map from its index to the
        # layernorm's and its value, which a store of it for other readers writes
        self.computed: dict[int, Piece] = {}

    def param(self, outside: Instruction) -> Instruction:
        key = id(outside)
        if key not in self._params:
            self._params[key] = add_param(self.sub, f"x{len(self.inputs)}", outside.shape.as_standard())
            self.inputs.append(outside)
        return self._params[key]

    def add(self, op: Op, inputs: Sequence[Instruction], origin: str = "") -> Instruction:
        return self.sub.add(op, inputs, origin)

    def gather(self, ins: Instruction, m: IndexMap | None = None, domain: Domain = ()) -> Instruction:
        """The value of outside instruction `ins` at `m(i)` (identity when m is None).

        View chains fold into the map; producers `inline` accepts are recomputed here.
        """
        if ins.shape.elements == 0:
            raise Unfusable(f"empty tensor {ins.shape}")
        m = m if m is not None else identity_map(ins.shape.lens)
        key = (id(ins), m, domain)
        if key in self._gathers:
            return self._gathers[key]
        src, cur = ins, m
        while True:
            vm = view_input_map(src)
            if vm is None:
                break
            cur = vm.after(cur)
            src = src.inputs[0]
        if src.op.kind == OpKind.POINTWISE and self.inline(src, cur):
            value = self.add(src.op, [self.gather(x, cur, domain) for x in src.inputs], src.origin)
            self.inlined.append(src)
        elif src.op.concatenates and self.inline(src, cur):
            value = self._select(src, cur, domain)
            self.inlined.append(src)
        elif src.op.finds_elements and not domain and cur == identity_map(src.shape.lens) and self.inline(src, cur):
            # a gather or a pad read where it writes: it finds its elements itself, as in its own kernel
            value = self.add(src.op, [self.gather(x) for x in src.inputs], src.origin)
            self.inlined.append(src)
        elif src.op.algorithm == "layernorm" and self.inline(src, cur):
            # the rows keep their last axis whole (the rule checked): normalize over it here
            value = self.add(type(src.op)(cur.out_rank - 1, src.op.attrs["epsilon"]),
                             [self.gather(x, cur, domain) for x in src.inputs], src.origin)
            self.computed.setdefault(id(src), Piece(cur, domain, value))
            self.inlined.append(src)
        else:
            lkey = (id(src), cur, domain)
            if lkey not in self._loads:
                self._loads[lkey] = self.add(Load(cur, domain), [self.param(src)], src.origin)
            value = self._loads[lkey]
        self._gathers[key] = value
        return value

    def _select(self, concat: Instruction, m: IndexMap, domain: Domain) -> Instruction:
        """A concat read at `m(i)`: each part loaded where the index falls in its range along
        the axis (zero elsewhere), the parts combined by a select on the same ranges."""
        axis = concat.op.attrs["axis"]
        e, (lo, hi) = m.exprs[axis], bounds(m.exprs[axis])
        values, domains, start = [], [], 0
        for x in concat.inputs:
            n = x.shape.lens[axis]
            start, first = start + n, start
            if hi < first or lo >= start:
                continue  # never read at this map
            exprs = list(m.exprs)
            exprs[axis] = e - first
            cond = () if lo >= first and hi < start else ((e, first, start),)
            values.append(self.gather(x, IndexMap(m.out_vars, exprs, x.shape.lens), domain + cond))
            domains.append(cond)
        if len(values) == 1:
            return values[0]
        return self.add(Select(m.out_vars, domains[:-1]), values, concat.origin)

    def finish(self, out: Instruction, pieces: Sequence[Piece], kernel: str,
               extras: Sequence[tuple[Instruction, Sequence[Piece]]] = ()) -> Instruction:
        """Store the pieces into a fresh buffer of `out`'s shape, and each extra output's pieces
        into one of its own; return the (unplaced) fused instruction, whose value is `out`'s."""
        bufs = [self._stored(v, ps) for v, ps in [(out, pieces), *extras]]
        self.sub.set_returns(bufs, ["out"] + [f"out{k}" for k in range(1, len(bufs))])
        DeadCodeElimination().apply(self.sub)
        self._drop_unread_params()
        return Instruction(Fused(self.sub, kernel), self.inputs, bufs[0].shape, out.origin)

    def _stored(self, value: Instruction, pieces: Sequence[Piece]) -> Instruction:
        buf = self.add(Allocate(value.shape.dtype, value.shape.lens), [])
        for p in pieces:
            buf = self.add(Store(p.map, p.domain), [buf, p.value], value.origin)
        return buf

    def _drop_unread_params(self) -> None:
        """Forget inputs only tentatively read (by epilogue members that were not kept)."""
        read = {id(x) for ins in self.sub.instructions for x in ins.inputs}
        keep = []
        for outside, param in zip(list(self.inputs), [self._params[id(x)] for x in self.inputs]):
            if id(param) in read:
                keep.append(outside)
            else:
                self.sub.remove(param)
                del self._params[id(outside)]
        self.inputs = keep
        for k, outside in enumerate(keep):
            self._params[id(outside)].op.attrs["name"] = f"x{k}"


def kernel_name(members: Sequence[Instruction]) -> str:
    """`conv_add_sigmoid_mul`-style name: the members' op names in order, each once."""
    seen: list[str] = []
    for ins in members:
        name = ins.op.short_name or ins.op.name
        if not ins.op.kind.is_source and ins.op.kind != OpKind.MEMORY and name not in seen:
            seen.append(name)
    return "_".join(seen) or "copy"


def place(module: Module, fused: Instruction, output: Instruction, members: Sequence[Instruction],
          extras: Sequence[Instruction] = ()) -> None:
    """Put `fused` where `output` was, make `output`'s readers read it and each of `extras`'
    readers its `fused_output`, and drop the members. With extras the module is sorted again:
    a reader of an extra output may come before `output`."""
    fused.module = module
    module.insert_before(output, fused)
    module.replace_uses(output, fused)
    for k, extra in enumerate(extras, start=1):
        selector = module.make(FusedOutput(fused.op.module, k), [fused], extra.origin)
        module.insert_before(output, selector)
        module.replace_uses(extra, selector)
    gone = {id(m) for m in members}
    module.instructions = [i for i in module.instructions if id(i) not in gone or i is fused]
    if extras:
        module.sort()


def reads_its_stores(module: Module, inputs: Sequence[Instruction], stored: Sequence[Instruction]) -> bool:
    """Whether a group reading `inputs` would read one of the values `stored` that it writes
    for other readers (values it computes from its inputs, not from its anchor: a prologue's
    layernorm), or a value computed from one: placed, the group would wait for itself."""
    if not stored:
        return False
    pos = {id(i): k for k, i in enumerate(module.instructions)}
    targets = {id(x) for x in stored}
    first = min(pos[id(x)] for x in stored)
    stack, seen = list(inputs), set()
    while stack:
        x = stack.pop()
        if id(x) in targets:
            return True
        if id(x) in seen or pos.get(id(x), -1) <= first:
            continue
        seen.add(id(x))
        stack.extend(x.inputs)
    return False


def group_name(module: Module) -> str:
    """A name for the next group's sub-module: `fused` and the number of groups so far."""
    return f"fused{sum(1 for i in module.instructions if is_fused(i))}"
