"""Writes the body of one Triton kernel from a fused sub-module.

Every value of a fused group lives in an index space: the anchor's output, an anchor's input,
or the group's iteration space. A template decides how the kernel walks a space (a flat block
of elements, an (m, n) tile of a matrix product, a loop over a window) and asks the writer for
a value at an index given as expressions over the template's own variables. The writer emits
the loads (addresses from the composed index maps, simplified by the index algebra, and masks
from the tile bounds and the domains), the pointwise ops (spelled by scalar_ops.py) and the
stores. Because addresses are built symbolically, an identity read over a flat block comes
out as `x0 + xo` and a scattered store as `34000 * (rn // 85) + 85 * rm + rn % 85`.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.index_expr import Expr, Sum, Var, bounds, free_vars, substitute, to_source
from fusegraph.ir.index_map import linear_offset
from fusegraph.ir.program import Instruction, Module
from fusegraph.ir.shape import Shape
from fusegraph.ops.base import OpKind, is_allocate, is_load, is_param, is_select, is_store
from fusegraph.targets.gpu.errors import CodegenError
from fusegraph.targets.gpu.scalar_ops import TRITON_TYPES, Operands, compute_type, literal, pointwise

Index = tuple[Expr, ...]


@dataclass
class KernelInputs:
    """The fused instruction's inputs as the kernel sees them.

    `shapes` address each input inside its buffer (the strides and offset of the outside
    value, which may be a slice or transpose of a larger buffer); `names` are the pointer
    arguments, shared by inputs that are views of one buffer so that a kernel reading one
    slice of a buffer and writing another gets that buffer once. `out` addresses the fresh
    output buffer (None: its standard layout). `constants` holds the value of each input that
    is a floating-point literal with one value (a scale, an exponent, or one broadcast by
    constant folding): the kernel writes it as a number instead of loading it in every lane.
    `further` addresses the buffers of the group's further outputs (`out1`, `out2`, ...).
    `literals` holds the value of each input that is a literal, in its logical layout, for
    templates whose code depends on the weights' values (a deferred normalization need not
    sum columns of W that sum to zero: `gemm_prologue.columns_vanish`).
    """

    shapes: list[Shape]
    names: list[str]
    out: Shape | None = None
    constants: dict[int, float] = field(default_factory=dict)
    further: list[Shape] = field(default_factory=list)
    literals: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass
class Tile:
    """How a template walks one index space.

    `names` gives the Triton code of each kernel variable (`rm` -> `rm[:, None]`), `bounds`
    the mask that keeps each variable in range (None when the tile never overruns it).
    Values are remembered per tile, so a value read twice is loaded once.
    """

    names: dict[str, str]
    bounds: dict[str, str | None]
    memo: dict = field(default_factory=dict)

    def code(self, e: Expr) -> str:
        """Source of `e` on this tile, its sum's terms grouped by the tile axes they use.

        Each group is added up on its own broadcast shape ([BM, 1], [1, BK] or a scalar) and
        only the sums of groups run on the whole tile: an im2col address with five terms then
        costs one add per element instead of four, which decides the speed of a convolution
        whose input is gathered element by element.
        """
        groups = self._groups(e)
        if len(groups) < 2:
            return to_source(e, self.names)
        return "(" + " + ".join(to_source(g, self.names) for g in groups) + ")"

    def range_conds(self, e: Expr, lo: int, hi: int) -> list[str]:
        """Masks keeping `e` in [lo, hi), leaving out a side its bounds already guarantee.

        The comparison stays on the whole sum (`a + b >= lo`, not `b >= lo - a`): Triton then
        sees the mask constant along contiguous runs and pipelines a gathered operand with
        asynchronous copies (a strided convolution's gathered input, two elements per copy).

        A condition on no tile axis (a GEMM epilogue's column block, `pid_n < 2`, where a
        store's domain follows the run a tile holds) is made a one-element tensor: Triton's
        interpreter rejects a mask that joins a tensor and such a scalar with `&`.
        """
        blo, bhi = bounds(e)
        scalar = not any(v.name in self.bounds for v in free_vars(e))
        out = []
        if blo < lo:
            out.append(f"({self.code(e)} >= {lo})")
        if bhi >= hi:
            out.append(f"({self.code(e)} < {hi})")
        return [f"(tl.full([1], 1, tl.int1) & {c})" for c in out] if scalar else out

    def _groups(self, e: Expr) -> list[Expr]:
        """The terms of a sum grouped by the tile axes they use, one-axis groups first (the
        constant and scalar terms join the first); a single group when there is nothing to split."""
        if not isinstance(e, Sum):
            return [e]
        by_axes: dict[frozenset[str], list[tuple[Expr, int]]] = {}
        for atom, coeff in e.terms:
            axes = frozenset(v.name for v in free_vars(atom) if v.name in self.bounds)
            by_axes.setdefault(axes, []).append((atom, coeff))
        scalars = by_axes.pop(frozenset(), [])
        keys = sorted(by_axes, key=lambda k: (len(k), sorted(k)))
        if len(keys) < 2:
            return [e]
        groups = [by_axes[k] for k in keys]
        groups[0] = groups[0] + scalars
        return [Sum(e.const if i == 0 else 0, g) for i, g in enumerate(groups)]

    @property
    def dims(self) -> set[str]:
        """The variables that index the tile (others are data-dependent indices)."""
        return set(self.bounds)

    def conjunction(self, conds: list[str]) -> str:
        """`conds` joined with `&`, those over the same tile axes first among themselves.

        Conditions over one axis are [BM, 1] or [1, BN] vectors: combined first, they cost a
        vector op each, and only the groups' combination runs on the whole tile. Tile-shaped
        groups come before scalar ones (a scalar on the left of `&` trips the interpreter).
        """
        groups: dict[frozenset[str], list[str]] = {}
        for c in _dedupe(conds):
            groups.setdefault(frozenset(v for v in self.bounds if self.names[v] in c), []).append(c)
        order = sorted(groups, key=lambda axes: (not axes, len(axes), sorted(axes)))
        return " & ".join(groups[a][0] if len(groups[a]) == 1 else f"({' & '.join(groups[a])})" for a in order)

    def mask_for(self, used: set[str]) -> list[str]:
        return [m for v, m in self.bounds.items() if v in used and m is not None]

    def zero_for(self, missing: set[str]) -> str:
        """A term adding no value but giving an expression the tile's full shape."""
        return "".join(f" + 0 * {self.names[v]}" for v in sorted(missing))


class KernelWriter:
    """Lines of one kernel; values are emitted on demand, depth first."""

    def __init__(self, module: Module, inputs: "KernelInputs",
                 anchor_values: dict[int, Callable[[Tile, Index], str]] | None = None) -> None:
        self.module = module
        self.params = list(module.params.values())
        if len(inputs.shapes) != len(self.params):
            raise CodegenError(f"{len(inputs.shapes)} argument shapes for {len(self.params)} parameters")
        self.inputs = inputs
        self.args = {id(p): (n, s) for p, n, s in zip(self.params, inputs.names, inputs.shapes)}
        self.out_shape: Shape | None = None
        # each fresh buffer the group stores into: its argument name and standard shape
        self.outputs = {id(KernelWriter.root_buffer(r)): (f"out{k}" if k else "out", r.shape)
                        for k, r in enumerate(module.returns)}
        self.further_used: set[str] = set()
        self.lines: list[str] = []
        self.indent = 1
        self.count = 0
        # values the template computes itself (an anchor's accumulator), by instruction
        self.anchor_values = anchor_values or {}
        self.raw_loads: set[int] = set()  # loads that keep their storage type (matrix operands)
        # the template's code for a reduction inside its epilogue (`in_epilogue` ops), if it has one
        self.tile_reduction: Callable[[Instruction, Tile, Index, tuple[str, ...]], str] | None = None
        self.constant_of: dict[str, float] = {}  # emitted names of inlined constants -> value

    # -- plumbing ----------------------------------------------------------------------
    def arg_list(self) -> list[str]:
        """The kernel's pointer arguments: one per input buffer, then `out` if it has one, then
        the further outputs' `out1`, `out2`, ..."""
        further = [f"out{k}" for k in range(1, len(self.module.returns)) if f"out{k}" in self.further_used]
        return _dedupe(list(self.inputs.names)) + (["out"] if self.out_shape is not None else []) + further

    def fresh(self, base: str = "v") -> str:
        self.count += 1
        return f"{base}{self.count}"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    @contextmanager
    def block(self, header: str) -> Iterator[None]:
        """Emit `header` (a `for`, `if` or `else:` line) and indent what is emitted inside."""
        self.emit(header)
        self.indent += 1
        try:
            yield
        finally:
            self.indent -= 1

    @contextmanager
    def apart(self) -> Iterator[list[str]]:
        """Emit into a list of lines of its own (yielded), at the body's first indent, and then
        go on with the body's lines: code a template places elsewhere (before a kernel's wait)."""
        body, indent = self.lines, self.indent
        self.lines, self.indent = [], 1
        try:
            yield self.lines
        finally:
            self.lines, self.indent = body, indent

    def let(self, code: str, base: str = "v") -> str:
        name = self.fresh(base)
        self.emit(f"{name} = {code}")
        return name

    def buffer(self, ins: Instruction) -> tuple[str, Shape]:
        """Kernel argument and addressing of the buffer behind a param or the output allocation."""
        if is_param(ins):
            return self.args[id(ins)]
        if is_allocate(ins):
            name, shape = self.outputs[id(ins)]
            if name != "out":
                self.further_used.add(name)
                return name, self.inputs.further[int(name[3:]) - 1] if self.inputs.further else shape
            self.out_shape = self.inputs.out or ins.shape
            return "out", self.out_shape
        raise CodegenError(f"cannot address {ins.op.name} as a buffer")

    # -- values ------------------------------------------------------------------------
    def value(self, ins: Instruction, tile: Tile, index: Index, mask: tuple[str, ...] = ()) -> str:
        """Code of `ins`'s value at `index` (expressions over the tile's variables)."""
        key = (id(ins), index, mask)
        if key in tile.memo:
            return tile.memo[key]
        if id(ins) in self.anchor_values:
            code = self.anchor_values[id(ins)](tile, index)
        elif is_load(ins):
            code = self._load(ins, tile, index, mask)
        elif ins.op.kind == OpKind.POINTWISE:
            code = self._pointwise(ins, tile, index, mask)
        elif is_select(ins):
            code = self._select(ins, tile, index, mask)
        elif ins.op.in_epilogue and self.tile_reduction is not None:
            code = self.tile_reduction(ins, tile, index, mask)
        else:
            raise CodegenError(f"no GPU code for {ins.op.name} inside fused module {self.module.name}")
        tile.memo[key] = code
        return code

    def _load(self, ins: Instruction, tile: Tile, index: Index, mask: tuple[str, ...]) -> str:
        source = ins.inputs[0]
        if is_param(source) and id(ins) not in self.raw_loads:
            k = self.params.index(source)
            if k in self.inputs.constants:
                value = self.inputs.constants[k]
                name = self.let(f"tl.full([], {literal(float(value))}, {TRITON_TYPES[compute_type(ins.shape.dtype)]})", "c")
                self.constant_of[name] = value
                return name
        ptr, conds = self.pointer(ins, tile, index, mask)
        if conds:
            code = f"tl.load({ptr}, mask={tile.conjunction(conds)}, other=0)"
        else:
            code = f"tl.load({ptr})"
        dtype = ins.shape.dtype
        if compute_type(dtype) != dtype and id(ins) not in self.raw_loads:
            code += f".to({TRITON_TYPES[compute_type(dtype)]})"
        return self.let(code, "ld")

    def address(self, ins: Instruction, index: Index) -> Expr:
        """The element offset a load reads at `index`, inside its buffer (its argument's)."""
        shape = self.buffer(ins.inputs[0])[1]
        return linear_offset(ins.op.attrs["map"].apply(index, check=False), shape.strides, shape.offset)

    def pointer(self, ins: Instruction, tile: Tile, index: Index, mask: tuple[str, ...] = ()) -> tuple[str, list[str]]:
        """The pointers a load reads on `tile` and the conditions of the lanes that read."""
        arg = self.buffer(ins.inputs[0])[0]
        addr = self.address(ins, index)
        dconds, dvars = self.domain_conds(ins, tile, index)
        addr_vars = self._vars_of([addr]) & tile.dims
        # a product's operand (a raw load) is zero past every bound of its tile, also along a dim
        # its address ignores (k of length 1): the padding lanes would otherwise add it again
        whole = bool(mask) or id(ins) in self.raw_loads
        used = addr_vars | dvars | (tile.dims if whole else set())
        # tile-shaped conditions first: a scalar condition on the left of `&` breaks the interpreter
        conds = tile.mask_for(used) + dconds + list(mask)
        return f"{arg} + {tile.code(addr)}{tile.zero_for(used - addr_vars)}", conds

    def domain_conds(self, ins: Instruction, tile: Tile, index: Index) -> tuple[list[str], set[str]]:
        """Conditions of a load's or store's domain at `index`, and the tile variables they use;
        a condition the index ranges already guarantee is left out."""
        conds: list[str] = []
        used: set[str] = set()
        for x, lo, hi in self.domain_ranges(ins, index):
            conds += tile.range_conds(x, lo, hi)
            used |= self._vars_of([x]) & tile.dims
        return conds, used

    @staticmethod
    def domain_ranges(ins: Instruction, index: Index) -> list[tuple[Expr, int, int]]:
        """The (expression, lo, hi) ranges of a load's or store's domain at `index` that the
        index ranges do not already guarantee."""
        m = ins.op.attrs["map"]
        mapping = {v.name: x for v, x in zip(m.out_vars, index)}
        out = []
        for e, lo, hi in ins.op.attrs["domain"]:
            x = substitute(e, mapping, check=False)
            blo, bhi = bounds(x)
            if blo < lo or bhi >= hi:
                out.append((x, lo, hi))
        return out

    def _pointwise(self, ins: Instruction, tile: Tile, index: Index, mask: tuple[str, ...]) -> str:
        codes = tuple(self.value(x, tile, index, mask) for x in ins.inputs)
        out = ins.shape.dtype
        first = ins.inputs[0].shape.dtype if ins.inputs else out
        return self.let(pointwise(ins.op, Operands(codes, first, out, self.constant_of)))

    def _select(self, ins: Instruction, tile: Tile, index: Index, mask: tuple[str, ...]) -> str:
        """Each value where its ranges hold, the last elsewhere: a concat read in the kernel
        (its parts' loads are masked by the same ranges, so none reads outside its part)."""
        mapping = {v.name: x for v, x in zip(ins.op.attrs["vars"], index)}
        values = [self.value(x, tile, index, mask) for x in ins.inputs]
        code = values[-1]
        for v, domain in reversed(list(zip(values, ins.op.attrs["domains"]))):
            conds = [c for e, lo, hi in domain for c in tile.range_conds(substitute(e, mapping, check=False), lo, hi)]
            code = self.let(f"tl.where({tile.conjunction(conds)}, {v}, {code})") if conds else v
        return code

    # -- stores ------------------------------------------------------------------------
    def store(self, ins: Instruction, tile: Tile, index: Index, mask: tuple[str, ...] = ()) -> None:
        """Emit `ins` (a store) and the stores it is chained to. Consecutive stores to the same
        addresses under different domains (the pieces of a concat that one kernel writes, as
        the detection head's xy, wh and class columns) become one store of a selected value."""
        common = tile.mask_for(tile.dims)
        for ptr, group in itertools.groupby(self._store_parts(ins, tile, index), key=lambda p: p[0]):
            parts = list(group)
            _, value, conds, _ = parts[0]
            if len(parts) > 1:  # later stores win where domains overlap, as they would in sequence
                for _, v, c, _ in parts[1:]:
                    value = f"tl.where({_all(c)}, {v}, {value})"
                ranges = [r for _, _, _, r in parts]
                conds = [] if _cover(ranges) else [f"({' | '.join(f'({_all(c)})' for _, _, c, _ in parts)})"]
            dtype = self.buffer(self.root_buffer(ins))[1].dtype  # selected first, converted once
            value = f"{value}.to({TRITON_TYPES[dtype]})" if dtype != DType.bool else f"({value} != 0)"
            # `mask` (split-k's last program) guards the store only: the values' loads keep the
            # shapes of their own indices (a bias row is read once per column, not per element)
            mask_code = tile.conjunction(common + conds + list(mask))
            self.emit(f"tl.store({ptr}, {value}, mask={mask_code})" if mask_code else f"tl.store({ptr}, {value})")

    def _store_parts(self, ins: Instruction, tile: Tile,
                     index: Index) -> list[tuple[str, str, list[str], list[tuple[Expr, int, int]]]]:
        """(pointer, value, conditions beyond the tile's bounds, their ranges) of each store of
        a chain, in order."""
        dest = ins.inputs[0]
        parts = self._store_parts(dest, tile, index) if is_store(dest) else []
        ranges = self.domain_ranges(ins, index)
        if not all(_may_meet(x, lo, hi) for x, lo, hi in ranges):
            return parts  # its domain holds no element of this index: nothing to store here
        arg, shape = self.buffer(self.root_buffer(dest))
        m = ins.op.attrs["map"]
        idx = m.apply(index, check=False)
        addr = linear_offset(idx, shape.strides, shape.offset)
        dconds = [c for x, lo, hi in ranges for c in tile.range_conds(x, lo, hi)]
        value = self.value(ins.inputs[1], tile, index)
        ptr = f"{arg} + {tile.code(addr)}{tile.zero_for(tile.dims - self._vars_of([addr]))}"
        parts.append((ptr, value, dconds, ranges))
        return parts

    @staticmethod
    def root_buffer(ins: Instruction) -> Instruction:
        while is_store(ins):
            ins = ins.inputs[0]
        return ins

    # -- helpers -----------------------------------------------------------------------
    @staticmethod
    def _vars_of(exprs: list[Expr]) -> set[str]:
        out: set[str] = set()
        for e in exprs:
            out |= {v.name for v in free_vars(e)}
        return out


def _dedupe(items: list[str]) -> list[str]:
    seen: list[str] = []
    for x in items:
        if x not in seen:
            seen.append(x)
    return seen


def _cover(ranges: list[list[tuple[Expr, int, int]]]) -> bool:
    """Whether stores with these domains (one range each, on one expression) together cover
    every value the expression takes: a concat's pieces written by one kernel, whose union
    needs no mask of its own."""
    if any(len(r) != 1 for r in ranges) or len({r[0][0] for r in ranges}) != 1:
        return False
    x = ranges[0][0][0]
    reach, top = bounds(x)
    for _, lo, hi in sorted((r[0] for r in ranges), key=lambda r: (r[1], r[2])):
        if lo > reach:
            return False
        reach = max(reach, hi)
    return reach > top


def _all(conds: list[str]) -> str:
    return " & ".join(_dedupe(conds)) or "True"


def var(name: str, extent: int) -> Var:
    return Var(name, max(1, int(extent)))


def _may_meet(x: Expr, lo: int, hi: int) -> bool:
    """Whether `x` can fall in [lo, hi) over its variables' ranges."""
    least, most = bounds(x)
    return lo <= most and least < hi
