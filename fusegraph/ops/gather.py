"""Gathers whose positions come from an index tensor element by element: GatherElements and
GatherND.

Like Gather (ops/movement.py) they are data movement: each output element reads one data
element at an index read at run time. Constant indices on constant data fold away at import.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fusegraph.ir.shape import Shape
from fusegraph.ops.base import Op, OpKind, register, require


def _wrapped(idx: np.ndarray, n: int | np.ndarray, what: str) -> np.ndarray:
    """Indices with negatives counted from the end; out of range raises IndexError."""
    if idx.size and (np.any(idx < -n) or np.any(idx >= n)):
        raise IndexError(f"{what} index out of range")
    return np.where(idx < 0, idx + n, idx).astype(np.int64)


@register
class GatherElements(Op):
    """out[i] = data[i with axis replaced by indices[i]]; indices and output share one shape."""

    name = "gather_elements"
    kind = OpKind.MOVE
    family = "movement"

    def __init__(self, axis: int) -> None:
        super().__init__(axis=int(axis))

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        data, idx = inputs
        a = self.axis
        require(0 <= a < data.ndim, f"axis {a} out of range for rank {data.ndim}")
        require(idx.dtype.is_integer, f"indices must be integers, got {idx.dtype}")
        require(idx.ndim == data.ndim, f"indices have rank {idx.ndim}, data rank {data.ndim}")
        require(all(i <= d for k, (i, d) in enumerate(zip(idx.lens, data.lens)) if k != a),
                f"indices {list(idx.lens)} exceed data {list(data.lens)} off axis {a}")
        return Shape.of(data.dtype, idx.lens)

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        data, idx = args
        idx = _wrapped(idx, data.shape[self.axis], "gather_elements")
        box = tuple(slice(0, n) if k != self.axis else slice(None) for k, n in enumerate(idx.shape))
        return np.take_along_axis(data[box], idx, axis=self.axis)


@register
class GatherND(Op):
    """out[b, q] = data[b, indices[b, q, :]] with `batch_dims` leading dims b shared."""

    name = "gather_nd"
    kind = OpKind.MOVE
    family = "movement"

    def __init__(self, batch_dims: int = 0) -> None:
        super().__init__(batch_dims=int(batch_dims))

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        data, idx = inputs
        b = self.batch_dims
        require(idx.dtype.is_integer, f"indices must be integers, got {idx.dtype}")
        require(idx.ndim >= 1 and 0 <= b < min(idx.ndim, data.ndim), f"batch_dims {b} out of range")
        k = idx.lens[-1]
        require(b + k <= data.ndim, f"index tuples of {k} exceed data rank {data.ndim} after {b} batch dims")
        require(idx.lens[:b] == data.lens[:b], f"batch dims differ: {list(idx.lens[:b])} vs {list(data.lens[:b])}")
        return Shape.of(data.dtype, [*idx.lens[:-1], *data.lens[b + k:]])

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        data, idx = args
        b = self.batch_dims
        k = idx.shape[-1]
        lens = np.array(data.shape[b:b + k])
        idx = _wrapped(idx, lens, "gather_nd")
        batch = int(np.prod(data.shape[:b], dtype=np.int64))
        flat_data = data.reshape((batch, *data.shape[b:]))
        flat_idx = idx.reshape((batch, -1, k))
        rows = [flat_data[j][tuple(flat_idx[j].T)] for j in range(batch)]
        out_lens = (*idx.shape[:-1], *data.shape[b + k:])
        return np.stack(rows).reshape(out_lens) if rows else np.zeros(out_lens, data.dtype)
