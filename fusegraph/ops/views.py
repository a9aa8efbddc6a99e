"""View operators: reindexing without arithmetic.

A view never computes a value; it changes which element of its input an output index reads.
Their output shapes carry the resulting strides (a transpose permutes them, a broadcast puts
0, a slice keeps them and moves the offset), and the fusion passes turn chains of views into
index maps. Each view records its attributes in normalized form (non-negative axes, explicit
dims) so equal views compare equal.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from fusegraph.ir.index_map import (IndexMap, broadcast_map, flatten_map, reshape_map, slice_map, squeeze_map,
                                    transpose_map, unsqueeze_map)
from fusegraph.ir.shape import Shape
from fusegraph.ops.base import Op, OpKind, register, require


class ViewOp(Op):
    """A view: its output aliases its input's buffer; `input_map` says which element it reads."""

    kind = OpKind.VIEW
    falls_back_to_copy: bool = False  # its shape rule gives a copy's strides when no view fits
    aliases_input: bool = True  # its shape's strides address its input's buffer (no copy is needed)


def view_strides(lens: Sequence[int], strides: Sequence[int], new_lens: Sequence[int]) -> tuple[int, ...] | None:
    """Strides that let `new_lens` alias a buffer laid out as (lens, strides), or None.

    Walks both shapes from the innermost dimension, matching runs of old dimensions that are
    contiguous with each other against runs of new dimensions of the same element count.
    """
    if math.prod(lens) == 0 or len(lens) == 0:
        return None
    out = [0] * len(new_lens)
    view_d = len(new_lens) - 1
    base = strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(lens) - 1, -1, -1):
        tensor_numel *= lens[d]
        if d == 0 or (lens[d - 1] != 1 and strides[d - 1] != tensor_numel * base):
            while view_d >= 0 and (view_numel < tensor_numel or new_lens[view_d] == 1):
                out[view_d] = view_numel * base
                view_numel *= new_lens[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                base = strides[d - 1]
                tensor_numel = view_numel = 1
    if view_d != -1:
        return None
    return tuple(out)


@register
class Reshape(ViewOp):
    name = "reshape"
    bijective = True
    keeps_order = True
    falls_back_to_copy = True

    def __init__(self, dims: Sequence[int]) -> None:
        super().__init__(dims=tuple(int(d) for d in dims))

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        dims = self.dims
        require(all(d >= 0 for d in dims), f"dims must be explicit and non-negative, got {list(dims)}")
        require(math.prod(dims) == x.elements, f"cannot reshape {x.elements} elements to {list(dims)}")
        if x.standard():
            return Shape.of(x.dtype, dims)
        strides = view_strides(x.lens, x.strides, dims)
        if strides is None:
            return Shape.of(x.dtype, dims)  # not expressible as a view: the reader gets a copy
        return Shape.of(x.dtype, dims, strides, x.offset)

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        return args[0].reshape(self.dims)

    def input_map(self, in_lens: Sequence[int], out_lens: Sequence[int]) -> IndexMap:
        return reshape_map(in_lens, out_lens)


@register
class Transpose(ViewOp):
    name = "transpose"
    bijective = True

    def __init__(self, permutation: Sequence[int]) -> None:
        super().__init__(permutation=tuple(int(p) for p in permutation))

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        perm = self.permutation
        require(sorted(perm) == list(range(x.ndim)), f"permutation {list(perm)} is not a permutation of rank {x.ndim}")
        return Shape.of(x.dtype, [x.lens[p] for p in perm], [x.strides[p] for p in perm], x.offset)

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        return np.transpose(args[0], self.permutation)

    def input_map(self, in_lens: Sequence[int], out_lens: Sequence[int]) -> IndexMap:
        return transpose_map(in_lens, self.permutation)

    def axis_permutation(self) -> tuple[int, ...]:
        return self.permutation


@register
class MultiBroadcast(ViewOp):
    """NumPy-style broadcast to `out_lens`: leading dims are added, size-1 dims repeat (stride 0)."""

    name = "multibroadcast"
    short_name = "broadcast"
    broadcasts = True

    def __init__(self, out_lens: Sequence[int]) -> None:
        super().__init__(out_lens=tuple(int(d) for d in out_lens))

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        out = self.out_lens
        require(len(out) >= x.ndim, f"cannot broadcast rank {x.ndim} to rank {len(out)}")
        lead = len(out) - x.ndim
        strides = [0] * lead
        for n, s, o in zip(x.lens, x.strides, out[lead:]):
            require(n == o or n == 1, f"cannot broadcast {list(x.lens)} to {list(out)}")
            strides.append(s if n == o and n != 1 else 0)
        return Shape.of(x.dtype, out, strides, x.offset)

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        return np.broadcast_to(args[0], self.out_lens)

    def input_map(self, in_lens: Sequence[int], out_lens: Sequence[int]) -> IndexMap:
        return broadcast_map(in_lens, out_lens)


@register
class Slice(ViewOp):
    """Elements start, start+step, ... (before end) along each listed axis; bounds normalized at build."""

    name = "slice"

    def __init__(self, axes: Sequence[int], starts: Sequence[int], ends: Sequence[int], steps: Sequence[int] | None = None) -> None:
        steps = tuple(int(s) for s in steps) if steps is not None else (1,) * len(axes)
        super().__init__(axes=tuple(int(a) for a in axes), starts=tuple(int(s) for s in starts),
                         ends=tuple(int(e) for e in ends), steps=steps)

    @staticmethod
    def normalized(lens: Sequence[int], axes: Sequence[int], starts: Sequence[int], ends: Sequence[int],
                   steps: Sequence[int] | None = None) -> "Slice":
        """Build a slice from ONNX-style bounds (negative, out of range) clamped like NumPy."""
        steps = list(steps) if steps is not None else [1] * len(axes)
        r = len(lens)
        na, ns, ne, nst = [], [], [], []
        for a, s, e, st in zip(axes, starts, ends, steps):
            a = a + r if a < 0 else a
            require(0 <= a < r, f"slice axis {a} out of range for rank {r}")
            require(st != 0, "slice step cannot be 0")
            s2, e2, st2 = slice(int(s), int(e), int(st)).indices(int(lens[a]))
            na.append(a); ns.append(s2); ne.append(e2); nst.append(st2)
        return Slice(na, ns, ne, nst)

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        lens, strides, offset = list(x.lens), list(x.strides), x.offset
        for a, s, e, st in zip(self.axes, self.starts, self.ends, self.steps):
            require(0 <= a < x.ndim, f"slice axis {a} out of range for rank {x.ndim}")
            n = len(range(s, e, st))
            require(n == 0 or (0 <= s < x.lens[a] and 0 <= s + (n - 1) * st < x.lens[a]),
                    f"slice [{s}:{e}:{st}] out of bounds on axis {a} of length {x.lens[a]}")
            offset += s * strides[a] if n else 0
            lens[a] = n
            strides[a] = strides[a] * st
        return Shape.of(x.dtype, lens, strides, offset)

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        idx = [slice(None)] * args[0].ndim
        for a, s, e, st in zip(self.axes, self.starts, self.ends, self.steps):
            idx[a] = slice(s, e if e >= 0 else None, st)
        return args[0][tuple(idx)]

    def input_map(self, in_lens: Sequence[int], out_lens: Sequence[int]) -> IndexMap:
        return slice_map(in_lens, self.starts, self.ends, self.axes, self.steps)

    def ranges(self) -> tuple[tuple[int, int, int], ...] | None:
        if any(s != 1 for s in self.steps):
            return None
        return tuple(zip(self.axes, self.starts, self.ends))


@register
class Squeeze(ViewOp):
    name = "squeeze"
    bijective = True
    keeps_order = True

    def __init__(self, axes: Sequence[int]) -> None:
        super().__init__(axes=tuple(sorted(int(a) for a in axes)))

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        for a in self.axes:
            require(0 <= a < x.ndim and x.lens[a] == 1, f"cannot squeeze axis {a} of {list(x.lens)}")
        keep = [i for i in range(x.ndim) if i not in self.axes]
        return Shape.of(x.dtype, [x.lens[i] for i in keep], [x.strides[i] for i in keep], x.offset)

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        return np.squeeze(args[0], axis=self.axes) if self.axes else args[0]

    def input_map(self, in_lens: Sequence[int], out_lens: Sequence[int]) -> IndexMap:
        return squeeze_map(in_lens, self.axes)


@register
class Unsqueeze(ViewOp):
    name = "unsqueeze"
    bijective = True
    keeps_order = True

    def __init__(self, axes: Sequence[int]) -> None:
        super().__init__(axes=tuple(sorted(int(a) for a in axes)))

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        r = x.ndim + len(self.axes)
        require(all(0 <= a < r for a in self.axes) and len(set(self.axes)) == len(self.axes),
                f"bad unsqueeze axes {list(self.axes)} for output rank {r}")
        lens, strides = list(x.lens), list(x.strides)
        for a in self.axes:
            inner = strides[a] * lens[a] if a < len(lens) else 1
            lens.insert(a, 1)
            strides.insert(a, inner)
        return Shape.of(x.dtype, lens, strides, x.offset)

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        return np.expand_dims(args[0], self.axes) if self.axes else args[0]

    def input_map(self, in_lens: Sequence[int], out_lens: Sequence[int]) -> IndexMap:
        return unsqueeze_map(in_lens, self.axes)


@register
class Flatten(ViewOp):
    """ONNX Flatten: dims before `axis` and from `axis` on each become one dimension."""

    name = "flatten"
    bijective = True
    keeps_order = True
    falls_back_to_copy = True

    def __init__(self, axis: int = 1) -> None:
        super().__init__(axis=int(axis))

    def out_lens(self, lens: Sequence[int]) -> tuple[int, int]:
        return (math.prod(lens[: self.axis]), math.prod(lens[self.axis:]))

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        require(0 <= self.axis <= x.ndim, f"flatten axis {self.axis} out of range for rank {x.ndim}")
        return Reshape(self.out_lens(x.lens)).compute_shape([x])

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        return args[0].reshape(self.out_lens(args[0].shape))

    def input_map(self, in_lens: Sequence[int], out_lens: Sequence[int]) -> IndexMap:
        return flatten_map(in_lens, self.axis)


class _BlockRearrange(ViewOp):
    """Moves b x b pixel blocks between the channel and the spatial axes of [N, C, H, W].

    Both directions are a reshape, a transpose and a reshape: the input map is their
    composition, bijective, so a kernel reads through it and an epilogue stores through its
    inverse, and no rearranged tensor is ever written. The result is not a strided view of
    its input, so its shape is the standard one of a copy.
    """

    bijective = True
    aliases_input = False

    def __init__(self, blocksize: int, mode: str = "DCR") -> None:
        super().__init__(blocksize=int(blocksize), mode=mode)

    def steps(self, lens: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
        """(the first reshape's lens, the transpose's permutation, the output lens)."""
        raise NotImplementedError

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        require(x.ndim == 4, f"{self.name} needs [N, C, H, W], got rank {x.ndim}")
        require(self.blocksize >= 1, f"blocksize must be positive, got {self.blocksize}")
        require(self.mode in ("DCR", "CRD"), f"unknown mode {self.mode!r}")
        return Shape.of(x.dtype, self.steps(x.lens)[2])

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        first, perm, out = self.steps(args[0].shape)
        return np.transpose(args[0].reshape(first), perm).reshape(out)

    def input_map(self, in_lens: Sequence[int], out_lens: Sequence[int]) -> IndexMap:
        first, perm, out = self.steps(in_lens)
        moved = [first[p] for p in perm]
        return reshape_map(in_lens, first).after(transpose_map(first, perm).after(reshape_map(moved, out)))


@register
class DepthToSpace(_BlockRearrange):
    """ONNX DepthToSpace: [N, C, H, W] -> [N, C/b², H*b, W*b]; DCR takes the block offset from
    the leading channels, CRD from the trailing ones."""

    name = "depth_to_space"

    def steps(self, lens: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
        n, c, h, w = lens
        b = self.blocksize
        require(c % (b * b) == 0, f"channels {c} not divisible by blocksize² {b * b}")
        out = [n, c // (b * b), h * b, w * b]
        if self.mode == "DCR":
            return [n, b, b, c // (b * b), h, w], [0, 3, 4, 1, 5, 2], out
        return [n, c // (b * b), b, b, h, w], [0, 1, 4, 2, 5, 3], out


@register
class SpaceToDepth(_BlockRearrange):
    """ONNX SpaceToDepth: [N, C, H, W] -> [N, C*b², H/b, W/b], the inverse of DepthToSpace in
    the same mode (DCR puts the block offset in the leading channels, CRD in the trailing)."""

    name = "space_to_depth"

    def steps(self, lens: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
        n, c, h, w = lens
        b = self.blocksize
        require(h % b == 0 and w % b == 0, f"spatial size {h}x{w} not divisible by blocksize {b}")
        perm = [0, 3, 5, 1, 2, 4] if self.mode == "DCR" else [0, 1, 3, 5, 2, 4]
        return [n, c, h // b, b, w // b, b], perm, [n, c * b * b, h // b, w // b]
