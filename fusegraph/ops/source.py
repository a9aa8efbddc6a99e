"""Parameters and literals: the instructions that read nothing.

Their shapes are given, not inferred, so they are built here (`make_param`, `make_literal`)
rather than by `Module.add`: the IR below knows no op, and these helpers put the op in.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction, Module
from fusegraph.ir.shape import Shape
from fusegraph.ops.base import Op, OpKind, register


@register
class Param(Op):
    """A program input, bound by name at run time."""

    name = "@param"
    kind = OpKind.PARAM

    def __str__(self) -> str:
        return f"@param:{self.attrs['name']}"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        raise ValueError("a parameter's shape is given, not inferred")


@register
class Literal(Op):
    """A constant tensor (weights, shape tensors, grids). Compared by identity, hashed by shape."""

    name = "@literal"
    kind = OpKind.LITERAL

    def __init__(self, value: np.ndarray, wide: np.ndarray | None = None) -> None:
        super().__init__()
        self.value = np.ascontiguousarray(value).reshape(np.shape(value))  # keeps 0-d values 0-d
        self.value.setflags(write=False)
        # the float32 values a half-precision literal was narrowed from (`passes/to_half.py`): folds
        # that compute new weights from it (a layernorm's scale into a product's weights) round once
        self.wide = wide

    def __str__(self) -> str:
        v = self.value
        if v.size <= 8:
            flat = ", ".join(_scalar_text(x) for x in v.reshape(-1))
            return f"@literal{{{flat}}}"
        return "@literal"

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        return Shape.of(DType.from_numpy(self.value.dtype), self.value.shape)

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        return self.value


def _scalar_text(x: np.generic) -> str:
    if isinstance(x, (np.floating, float)):
        return f"{float(x):g}"
    return str(x.item() if hasattr(x, "item") else x)


def make_param(name: str, shape: Shape) -> Instruction:
    """A parameter instruction, not yet placed in a module."""
    return Instruction(Param(name=name), [], shape, name)


def add_param(module: Module, name: str, shape: Shape) -> Instruction:
    return module.append(make_param(name, shape))


def make_literal(value: np.ndarray | float | int, dtype: DType | None = None, origin: str = "") -> Instruction:
    """A literal instruction, not yet placed in a module."""
    arr = np.asarray(value, dtype=dtype.numpy if dtype else None)
    return Instruction(Literal(arr), [], Shape.of(DType.from_numpy(arr.dtype), arr.shape), origin)


def add_literal(module: Module, value: np.ndarray | float | int, dtype: DType | None = None,
                origin: str = "") -> Instruction:
    return module.append(make_literal(value, dtype, origin))
