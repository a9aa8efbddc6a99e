"""Tensor shapes with explicit strides.

A `Shape` carries the layout, not only the sizes: a transpose or a slice is a different view
of the same buffer, a broadcast has stride 0. The fusion passes and the GPU code generator
read these strides to address a producer's buffer directly instead of materializing a view.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from fusegraph.ir.dtypes import DType

#: The most elements one tensor may have: 2**31 (8 GiB of float32). A larger shape comes from a
#: corrupt or hostile model; refusing it when the shape is made keeps anything from allocating it.
MAX_ELEMENTS = 1 << 31


def standard_strides(lens: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides for `lens` (the last dimension is contiguous)."""
    strides = [1] * len(lens)
    for i in range(len(lens) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(int(lens[i + 1]), 1)
    return tuple(strides)


@dataclass(frozen=True)
class Shape:
    """dtype, lens and strides (in elements) of a tensor; an offset in elements for slices."""

    dtype: DType
    lens: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @staticmethod
    def of(dtype: DType, lens: Sequence[int], strides: Sequence[int] | None = None, offset: int = 0) -> "Shape":
        """A shape with row-major strides unless `strides` is given."""
        lens_t = tuple(int(x) for x in lens)
        if any(x < 0 for x in lens_t):
            raise ValueError(f"negative dimension in {list(lens_t)}")
        if math.prod(lens_t) > MAX_ELEMENTS:
            raise ValueError(f"{list(lens_t)} has {math.prod(lens_t)} elements, more than the {MAX_ELEMENTS} of one tensor")
        strides_t = standard_strides(lens_t) if strides is None else tuple(int(s) for s in strides)
        if len(strides_t) != len(lens_t):
            raise ValueError(f"lens {list(lens_t)} and strides {list(strides_t)} differ in rank")
        return Shape(dtype, lens_t, strides_t, int(offset))

    @property
    def ndim(self) -> int:
        return len(self.lens)

    @property
    def elements(self) -> int:
        return math.prod(self.lens)

    @property
    def bytes(self) -> int:
        """Bytes of the elements this shape addresses (a broadcast counts its real buffer)."""
        return self.element_space() * self.dtype.itemsize

    def element_space(self) -> int:
        """Number of elements of the underlying buffer this view spans, from offset 0."""
        if self.elements == 0:
            return 0
        return self.offset + 1 + sum((n - 1) * abs(s) for n, s in zip(self.lens, self.strides))

    def standard(self) -> bool:
        """Row-major and dense: a reader can use a flat index."""
        return self.offset == 0 and all(
            s == t or n == 1 for n, s, t in zip(self.lens, self.strides, standard_strides(self.lens))
        )

    def broadcasted(self) -> bool:
        return any(s == 0 and n > 1 for n, s in zip(self.lens, self.strides))

    def transposed(self) -> bool:
        """Dense but not row-major: a permutation of a standard layout."""
        if self.standard() or self.broadcasted():
            return False
        order = sorted(range(self.ndim), key=lambda i: -self.strides[i])
        return Shape.of(self.dtype, [self.lens[i] for i in order]).strides == tuple(
            self.strides[i] for i in order
        )

    def packed(self) -> bool:
        """Dense (no gaps, no overlap), in any dimension order."""
        return self.standard() or self.transposed()

    def with_dtype(self, dtype: DType) -> "Shape":
        return Shape(dtype, self.lens, self.strides, self.offset)

    def as_standard(self) -> "Shape":
        """The same dtype and lens in a fresh row-major buffer."""
        return Shape.of(self.dtype, self.lens)

    def __str__(self) -> str:
        text = f"{self.dtype}, {{{', '.join(map(str, self.lens))}}}, {{{', '.join(map(str, self.strides))}}}"
        return text + (f", offset={self.offset}" if self.offset else "")
