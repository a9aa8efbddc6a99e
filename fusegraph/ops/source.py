"""Parameters and literals: the instructions that read nothing."""

from __future__ import annotations

from typing import Sequence

import numpy as np

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

    def __init__(self, value: np.ndarray) -> None:
        super().__init__()
        self.value = np.ascontiguousarray(value).reshape(np.shape(value))  # keeps 0-d values 0-d
        self.value.setflags(write=False)

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
        from fusegraph.ir.dtypes import DType

        return Shape.of(DType.from_numpy(self.value.dtype), self.value.shape)

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        return self.value


def _scalar_text(x: np.generic) -> str:
    if isinstance(x, (np.floating, float)):
        return f"{float(x):g}"
    return str(x.item() if hasattr(x, "item") else x)
