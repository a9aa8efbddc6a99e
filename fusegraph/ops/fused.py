"""The ops that fused groups are made of.

A fused instruction (`fused`) owns a sub-module. Inside it, `load` reads an input through an
index map (any chain of views collapsed into one map, gather style), pointwise ops and at
most one anchor compute, and `store` writes a value into the output buffer through an index
map (scatter style: the composed inverse of the views that follow the anchor, possibly into a
slice of a concat buffer). `load` and `store` may carry a domain: a list of
`(expr, lo, hi)` conditions on the iteration index, which is how the branches of a split
(each reading and writing only its part) are expressed.

The reference target runs these ops by evaluating the maps element by element, so every
test of a fused program checks the index maps themselves, not the original view ops.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.index_expr import Expr, Var, evaluate
from fusegraph.ir.index_map import IndexMap
from fusegraph.ir.shape import Shape
from fusegraph.ops.base import MemoryKind, Op, OpKind, is_float, register, require

Domain = tuple[tuple[Expr, int, int], ...]


def domain_text(domain: Domain) -> str:
    return " and ".join(f"{lo} <= {e} < {hi}" for e, lo, hi in domain)


def domain_mask(domain: Domain, grid: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    mask = np.ones(shape, dtype=bool)
    for e, lo, hi in domain:
        v = np.broadcast_to(np.asarray(evaluate(e, grid)), shape)
        mask &= (v >= lo) & (v < hi)
    return mask


def _grid(m: IndexMap) -> dict[str, np.ndarray]:
    idx = np.indices(m.out_lens, sparse=True) if m.out_rank else ()
    return {v.name: a for v, a in zip(m.out_vars, idx)}


def _mapped(m: IndexMap) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """The iteration grid of `m`'s domain and, for every domain index, the index it maps to."""
    grid = _grid(m)
    return grid, [np.broadcast_to(np.asarray(evaluate(e, grid), dtype=np.int64), m.out_lens) for e in m.exprs]


class MappedOp(Op):
    """An op addressing a buffer through an index map, on an optional domain."""

    def __init__(self, map: IndexMap, domain: Domain = ()) -> None:
        super().__init__()
        self.attrs = {"map": map, "domain": tuple(domain)}

    def attr_text(self) -> str:
        text = str(self.attrs["map"])
        return text + (f" if {domain_text(self.attrs['domain'])}" if self.attrs["domain"] else "")


@register
class Load(MappedOp):
    """Read input 0 at `map(i)` for every index i of the map's domain (zero outside `domain`)."""

    name = "load"
    kind = OpKind.MEMORY
    memory = MemoryKind.LOAD

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        m: IndexMap = self.attrs["map"]
        require(tuple(x.lens) == m.in_lens, f"map reads {list(m.in_lens)} but the input is {list(x.lens)}")
        return Shape.of(x.dtype, m.out_lens)

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        (x,) = args
        m: IndexMap = self.attrs["map"]
        shape = m.out_lens
        grid, idx = _mapped(m)
        if not self.attrs["domain"]:
            return x[tuple(idx)] if idx else np.broadcast_to(x, shape).copy()
        mask = domain_mask(self.attrs["domain"], grid, shape)
        out = np.zeros(shape, dtype=x.dtype)
        out[mask] = x[tuple(i[mask] for i in idx)]
        return out


@register
class Store(MappedOp):
    """Write input 1 (on the map's domain) into a copy of buffer input 0 at `map(i)`."""

    name = "store"
    kind = OpKind.MEMORY
    memory = MemoryKind.STORE

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        dest, value = inputs
        m: IndexMap = self.attrs["map"]
        require(tuple(value.lens) == m.out_lens, f"map is defined on {list(m.out_lens)} but the value is {list(value.lens)}")
        require(tuple(dest.lens) == m.in_lens, f"map writes {list(m.in_lens)} but the buffer is {list(dest.lens)}")
        require(dest.dtype == value.dtype, f"buffer type {dest.dtype} != value type {value.dtype}")
        return dest.as_standard()

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        dest, value = args
        m: IndexMap = self.attrs["map"]
        out = np.array(dest, copy=True)
        shape = m.out_lens
        grid, idx = _mapped(m)
        if not idx:  # a 0-d buffer: the domain is a single element
            out[...] = np.reshape(value, out.shape)
        elif self.attrs["domain"]:
            mask = domain_mask(self.attrs["domain"], grid, shape)
            out[tuple(i[mask] for i in idx)] = value[mask]
        else:
            out[tuple(idx)] = value
        return out


@register
class Select(Op):
    """Input k at the indices where its conditions hold (the first such input), the last input
    elsewhere: a concat read inside a kernel, each part loaded under its own domain.

    `vars` name the dimensions of the value (the index the conditions are written over), so
    the select can be evaluated at any index the kernel reads it at.
    """

    name = "select"
    kind = OpKind.MEMORY
    memory = MemoryKind.SELECT

    def __init__(self, vars: Sequence[Var], domains: Sequence[Domain]) -> None:
        super().__init__()
        self.attrs = {"vars": tuple(vars), "domains": tuple(tuple(d) for d in domains)}

    def attr_text(self) -> str:
        return "; ".join(domain_text(d) for d in self.attrs["domains"])

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        lens = tuple(v.extent for v in self.attrs["vars"])
        require(len(inputs) == len(self.attrs["domains"]) + 1, "select needs one more value than conditions")
        require(all(x.lens == lens and x.dtype == inputs[0].dtype for x in inputs),
                f"select values must all be {list(lens)} of one type")
        return inputs[0].as_standard()

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        shape = args[0].shape
        idx = np.indices(shape, sparse=True) if shape else ()
        grid = {v.name: a for v, a in zip(self.attrs["vars"], idx)}
        out = np.array(args[-1], copy=True)
        for value, domain in reversed(list(zip(args, self.attrs["domains"]))):
            mask = domain_mask(domain, grid, shape)
            out[mask] = value[mask]
        return out


@register
class Allocate(Op):
    """A fresh buffer. The reference fills it with NaN (or the lowest value) so a store
    that misses an element shows up in every comparison."""

    name = "allocate"
    kind = OpKind.MEMORY
    memory = MemoryKind.ALLOCATE

    def __init__(self, dtype: DType, lens: Sequence[int]) -> None:
        super().__init__(dtype=dtype, lens=tuple(int(n) for n in lens))

    def attr_text(self) -> str:
        return f"{self.dtype},{{{','.join(map(str, self.lens))}}}"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        return Shape.of(self.dtype, self.lens)

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        dt = self.dtype.numpy
        fill: Any = np.nan if is_float(dt) else (np.iinfo(dt).min if dt.kind in "iu" else True)
        return np.full(self.lens, fill, dtype=dt)


@register
class Fused(Op):
    """A fused group: its sub-module's parameters are the instruction's inputs, in order.

    It has no `reference` of its own: each target runs the sub-module its own way (the ref
    target evaluates it instruction by instruction, the gpu target generates one kernel)."""

    name = "fused"
    kind = OpKind.FUSED

    def __init__(self, module: Any, kernel: str) -> None:
        super().__init__()
        self.module = module
        self.attrs = {"kernel": kernel, "module": module.name}

    def __str__(self) -> str:
        return f"{self.attrs['kernel']}[module={self.attrs['module']}]"

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        params = list(self.module.params.values())
        require(len(params) == len(inputs), f"{len(inputs)} inputs for a group of {len(params)} parameters")
        for p, s in zip(params, inputs):
            require(p.shape.lens == s.lens and p.shape.dtype == s.dtype,
                    f"parameter {p.op.attrs['name']} is {p.shape}, given {s}")
        return self.module.returns[0].shape


@register
class FusedOutput(Op):
    """The `index`-th value (1, 2, ...) that a fused group stores, read from the group's
    instruction (input 0); the group's own value is its first (index 0). A group stores every
    member value read outside it, each into a buffer of its own, so a value needed elsewhere
    (a residual and its activation) does not split the group.

    Like `fused` it has no `reference`: the ref target takes the value from its run of the
    group's sub-module."""

    name = "fused_output"
    kind = OpKind.OUTPUT

    def __init__(self, module: Any, index: int) -> None:
        super().__init__(index=int(index))
        self.group = module  # the group's sub-module (not `module`: that would list it twice)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        returns = self.group.returns
        require(len(inputs) == 1, "a fused_output reads one fused group")
        require(0 < self.index < len(returns), f"group {self.group.name} stores no output {self.index}")
        return returns[self.index].shape
