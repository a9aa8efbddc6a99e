"""Instructions, modules and programs.

A `Module` is an ordered list of instructions in SSA form: every instruction names the
instructions it reads. Parameters and literals are instructions too (ops `@param` and
`@literal`), so a pass sees the whole dataflow in one list. A fused group is an instruction
whose op holds a sub-module; the `Program` owns the main module and all sub-modules.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol, Sequence

from fusegraph.errors import ShapeError
from fusegraph.ir.shape import Shape


class OpLike(Protocol):
    """What the IR itself asks of an op. The ops layer above (fusegraph.ops.base.Op) adds kinds,
    traits and references; the IR stays below it, so it names only this much."""

    name: str
    attrs: dict[str, Any]

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape: ...


class Instruction:
    """One op applied to earlier instructions; `origin` is the ONNX node it came from."""

    __slots__ = ("op", "inputs", "shape", "origin", "module")

    def __init__(self, op: OpLike, inputs: Sequence["Instruction"], shape: Shape, origin: str = "") -> None:
        self.op = op
        self.inputs: list[Instruction] = list(inputs)
        self.shape = shape
        self.origin = origin
        self.module: Module | None = None

    @property
    def name(self) -> str:
        return self.op.name

    def __repr__(self) -> str:
        return f"<Instruction {self.op} {self.shape}>"


class Module:
    """An ordered list of instructions with named parameters and a return list."""

    def __init__(self, name: str = "main") -> None:
        self.name = name
        self.instructions: list[Instruction] = []
        self.returns: list[Instruction] = []
        self.return_names: list[str] = []

    # building -------------------------------------------------------------------------
    def add(self, op: OpLike, inputs: Sequence[Instruction] = (), origin: str = "") -> Instruction:
        """Append `op(inputs)`, inferring its shape; a shape error names the instruction's origin."""
        ins = self.make(op, inputs, origin)
        self.append(ins)
        return ins

    def make(self, op: OpLike, inputs: Sequence[Instruction] = (), origin: str = "") -> Instruction:
        """Build an instruction (shape inferred) without placing it in the module yet."""
        try:
            shape = op.compute_shape([i.shape for i in inputs])
        except (ValueError, IndexError, TypeError) as e:
            where = f"node {origin!r} " if origin else ""
            shapes = "; ".join(str(i.shape) for i in inputs)
            raise ShapeError(f"{where}({op}): {e} [inputs: {shapes}]") from None
        return Instruction(op, inputs, shape, origin)

    def insert_before(self, anchor: Instruction, ins: Instruction) -> Instruction:
        ins.module = self
        self.instructions.insert(self.instructions.index(anchor), ins)
        return ins

    def set_returns(self, returns: Sequence[Instruction], names: Sequence[str] | None = None) -> None:
        self.returns = list(returns)
        self.return_names = list(names) if names is not None else [f"output_{i}" for i in range(len(returns))]

    def append(self, ins: Instruction) -> Instruction:
        """Place a built instruction (`make`, or a parameter or literal from ops/source.py) last."""
        ins.module = self
        self.instructions.append(ins)
        return ins

    # queries ------------------------------------------------------------------------
    @property
    def params(self) -> dict[str, Instruction]:
        return {i.op.attrs["name"]: i for i in self.instructions if i.op.name == "@param"}

    def users(self) -> dict[Instruction, list[Instruction]]:
        """For each instruction, the instructions that read it (in order, with repeats)."""
        out: dict[Instruction, list[Instruction]] = {i: [] for i in self.instructions}
        for ins in self.instructions:
            for x in ins.inputs:
                out.setdefault(x, []).append(ins)
        return out

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.instructions)

    def __len__(self) -> int:
        return len(self.instructions)

    # rewriting ----------------------------------------------------------------------
    def replace_uses(self, old: Instruction, new: Instruction) -> None:
        """Make every reader of `old` (and the return list) read `new` instead."""
        for ins in self.instructions:
            if old in ins.inputs:
                ins.inputs = [new if x is old else x for x in ins.inputs]
        self.returns = [new if x is old else x for x in self.returns]

    def remove(self, ins: Instruction) -> None:
        self.instructions.remove(ins)

    def remove_dead_code(self) -> bool:
        """Drop the instructions nothing returned depends on; True when some were dropped.

        Parameters stay even when unused, since they are the module's interface. The importer
        and the dead-code pass share this, so it lives with the data it prunes.
        """
        live = {id(i) for i in self.instructions if i.op.name == "@param"}
        stack = list(self.returns)
        while stack:
            ins = stack.pop()
            if id(ins) in live:
                continue
            live.add(id(ins))
            stack.extend(ins.inputs)
        before = len(self.instructions)
        self.instructions = [i for i in self.instructions if id(i) in live]
        return len(self.instructions) != before

    def replace(self, old: Instruction, new: Instruction) -> None:
        """Put `new` in `old`'s place: readers (and returns) of `old` read `new`, `old` is removed.

        `new` is inserted before `old` unless it is already in the module.
        """
        if new.module is not self or new not in self.instructions:
            self.insert_before(old, new)
        self.replace_uses(old, new)
        self.remove(old)

    def sort(self) -> None:
        """Restore a topological order (stable: keeps the current order where it is valid)."""
        placed: set[int] = set()
        order: list[Instruction] = []
        members = {id(i) for i in self.instructions}

        def visit(root: Instruction) -> None:
            stack: list[tuple[Instruction, int]] = [(root, 0)]
            while stack:
                ins, k = stack.pop()
                if id(ins) in placed:
                    continue
                if k < len(ins.inputs):
                    stack.append((ins, k + 1))
                    dep = ins.inputs[k]
                    if id(dep) in members and id(dep) not in placed:
                        stack.append((dep, 0))
                else:
                    placed.add(id(ins))
                    order.append(ins)

        for ins in list(self.instructions):
            visit(ins)
        self.instructions = order

    def __str__(self) -> str:
        from fusegraph.ir.printer import format_module

        return format_module(self)


class Program:
    """A main module plus the sub-modules of fused groups (`fusegraph.api` compiles and runs it)."""

    def __init__(self, main: Module | None = None) -> None:
        self.main = main if main is not None else Module("main")
        self.meta: dict[str, Any] = {}

    def modules(self) -> list[Module]:
        """The main module, then every sub-module reachable from it, depth first."""
        out: list[Module] = []

        def walk(m: Module) -> None:
            out.append(m)
            for ins in m.instructions:
                sub = getattr(ins.op, "module", None)
                if isinstance(sub, Module):
                    walk(sub)

        walk(self.main)
        return out

    @property
    def input_shapes(self) -> dict[str, Shape]:
        return {k: v.shape for k, v in self.main.params.items()}

    @property
    def output_names(self) -> list[str]:
        return list(self.main.return_names)

    def __str__(self) -> str:
        from fusegraph.ir.printer import format_program

        return format_program(self)
