"""Data movement that is not a view: concat, gather, pad, resize, plus LRN.

These read their inputs at data-dependent or piecewise positions. The fusion passes can
still remove a concat (producers write into their slice of its buffer); the rest run as
kernels of their own.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from fusegraph.ir.index_expr import Const, Expr
from fusegraph.ir.index_map import IndexMap, reshape_map
from fusegraph.ir.shape import Shape
from fusegraph.ops.base import Op, OpKind, register, require


@register
class Concat(Op):
    name = "concat"
    kind = OpKind.MOVE
    family = "movement"
    concatenates = True

    def __init__(self, axis: int) -> None:
        super().__init__(axis=int(axis))

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        require(len(inputs) >= 1, "concat needs at least one input")
        first = inputs[0]
        a = self.axis
        require(0 <= a < first.ndim, f"concat axis {a} out of range for rank {first.ndim}")
        for s in inputs[1:]:
            require(s.ndim == first.ndim and all(x == y for i, (x, y) in enumerate(zip(s.lens, first.lens)) if i != a),
                    f"inputs {list(first.lens)} and {list(s.lens)} differ off the concat axis {a}")
            require(s.dtype == first.dtype, f"input types differ: {first.dtype} vs {s.dtype}")
        lens = list(first.lens)
        lens[a] = sum(s.lens[a] for s in inputs)
        return Shape.of(first.dtype, lens)

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        return np.concatenate(args, axis=self.axis)


@register
class Gather(Op):
    """ONNX Gather: out[..., idx..., ...] = data[..., indices[idx], ...] along `axis`."""

    name = "gather"
    kind = OpKind.MOVE
    family = "movement"

    def __init__(self, axis: int) -> None:
        super().__init__(axis=int(axis))

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        data, idx = inputs
        a = self.axis
        require(0 <= a < data.ndim, f"gather axis {a} out of range for rank {data.ndim}")
        require(idx.dtype.is_integer, f"indices must be integers, got {idx.dtype}")
        return Shape.of(data.dtype, [*data.lens[:a], *idx.lens, *data.lens[a + 1:]])

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        data, idx = args
        n = data.shape[self.axis]
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"gather index out of range [{-n}, {n})")
        return np.take(data, np.where(idx < 0, idx + n, idx), axis=self.axis)


@register
class Pad(Op):
    """Pad with a constant, by reflection or by repeating the edge; pads are begins then ends."""

    name = "pad"
    kind = OpKind.MOVE
    family = "movement"

    def __init__(self, pads: Sequence[int], mode: str = "constant", value: float = 0.0) -> None:
        super().__init__(pads=tuple(int(p) for p in pads), mode=mode, value=float(value))

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        r = x.ndim
        require(len(self.pads) == 2 * r, f"pads has {len(self.pads)} values for rank {r}")
        require(self.mode in ("constant", "reflect", "edge", "wrap"), f"unknown pad mode {self.mode!r}")
        lens = [n + self.pads[i] + self.pads[i + r] for i, n in enumerate(x.lens)]
        require(all(n >= 0 for n in lens), f"negative output size {lens}")
        return Shape.of(x.dtype, lens)

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        (x,) = args
        r = x.ndim
        # negative pads crop
        crop = tuple(slice(max(0, -self.pads[i]), x.shape[i] - max(0, -self.pads[i + r])) for i in range(r))
        x = x[crop]
        pads = [(max(0, self.pads[i]), max(0, self.pads[i + r])) for i in range(r)]
        if self.mode == "constant":
            return np.pad(x, pads, mode="constant", constant_values=np.array(self.value).astype(x.dtype))
        return np.pad(x, pads, mode=self.mode)


@register
class Resize(Op):
    """Nearest, (multi)linear or cubic resize of every axis to `out_lens`.

    `scales` are the factors the coordinate transform uses (ONNX uses the given scales, not
    out/in, when scales were given), one per axis. `roi` ((start, end) per axis, as fractions of
    the input) is read by the tf_crop_and_resize transform, which writes `extrapolation_value`
    where a coordinate falls outside the input. `antialias` widens a linear or cubic filter by
    the inverse of a downscaling factor, so every input element contributes.
    """

    name = "resize"
    kind = OpKind.MOVE

    def __init__(self, out_lens: Sequence[int], scales: Sequence[float], mode: str = "nearest",
                 coordinate_transformation_mode: str = "half_pixel", nearest_mode: str = "round_prefer_floor",
                 cubic_coeff_a: float = -0.75, exclude_outside: bool = False, antialias: bool = False,
                 roi: Sequence[tuple[float, float]] = (), extrapolation_value: float = 0.0) -> None:
        super().__init__(out_lens=tuple(int(x) for x in out_lens), scales=tuple(float(s) for s in scales), mode=mode,
                         coordinate_transformation_mode=coordinate_transformation_mode, nearest_mode=nearest_mode,
                         cubic_coeff_a=float(cubic_coeff_a), exclude_outside=bool(exclude_outside),
                         antialias=bool(antialias), roi=tuple((float(a), float(b)) for a, b in roi),
                         extrapolation_value=float(extrapolation_value))

    def attr_text(self) -> str:
        text = f"mode={self.mode},out_lens={{{','.join(map(str, self.out_lens))}}}"
        text += f",coordinate_transformation_mode={self.coordinate_transformation_mode}"
        text += ",antialias=1" if self.antialias else ""
        return text + (f",nearest_mode={self.nearest_mode}" if self.mode == "nearest" else "")

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        require(len(self.out_lens) == x.ndim, f"resize needs {x.ndim} output sizes, got {len(self.out_lens)}")
        require(self.mode in ("nearest", "linear", "cubic"), f"unknown resize mode {self.mode!r}")
        require(self.coordinate_transformation_mode != "tf_crop_and_resize" or len(self.roi) == x.ndim,
                f"tf_crop_and_resize needs a roi for each of the {x.ndim} axes, got {len(self.roi)}")
        return Shape.of(x.dtype, self.out_lens)

    def source_coords(self, axis: int, in_len: int) -> np.ndarray:
        """For each output position along `axis`, the (fractional) input coordinate it maps to."""
        out_len = self.out_lens[axis]
        scale = self.scales[axis]
        o = np.arange(out_len, dtype=np.float64)
        mode = self.coordinate_transformation_mode
        if mode == "half_pixel":
            return (o + 0.5) / scale - 0.5
        if mode == "pytorch_half_pixel":
            return (o + 0.5) / scale - 0.5 if out_len > 1 else np.zeros_like(o)
        if mode == "align_corners":
            # ONNX (and ONNX Runtime) use the unrounded resized length in_len * scale here;
            # ONNX Runtime's antialiased resize uses the output's length
            resized = out_len if self.antialias else in_len * scale
            return o * (in_len - 1) / (resized - 1) if resized != 1 else np.zeros_like(o)
        if mode == "asymmetric":
            return o / scale
        if mode == "half_pixel_symmetric":
            adj = out_len / (in_len * scale)
            center = in_len / 2
            offset = center * (1 - adj)
            return offset + (o + 0.5) / scale - 0.5
        if mode == "tf_crop_and_resize":
            # in float32 and in ONNX Runtime's order: whether a coordinate at the input's edge
            # lands inside (and so is not extrapolated) depends on the rounding
            lo, hi = np.float32(self.roi[axis][0]), np.float32(self.roi[axis][1])
            last = np.float32(in_len - 1)
            if out_len == 1:
                return np.full(1, (lo + hi) * np.float32(0.5) * last, np.float64)
            of = o.astype(np.float32)
            return (lo * last + of * (hi - lo) * last / np.float32(out_len - 1)).astype(np.float64)
        raise ValueError(f"unsupported coordinate_transformation_mode {mode!r}")

    def resizes(self, axis: int, in_len: int) -> bool:
        """Whether the output along `axis` differs from the input (else the axis is copied)."""
        crops = self.coordinate_transformation_mode == "tf_crop_and_resize" and self.roi[axis] != (0.0, 1.0)
        return self.out_lens[axis] != in_len or self.scales[axis] != 1.0 or crops

    def outside(self, axis: int, in_len: int) -> np.ndarray | None:
        """Which output positions along `axis` read outside the input and so take
        `extrapolation_value` (tf_crop_and_resize only; None for the other transforms)."""
        if self.coordinate_transformation_mode != "tf_crop_and_resize":
            return None
        c = self.source_coords(axis, in_len)
        return (c < 0) | (c > in_len - 1)

    def nearest_index(self, c: np.ndarray, n: int) -> np.ndarray:
        """The input index a nearest resize reads at each source coordinate `c` along an axis of `n`."""
        m = self.nearest_mode
        if m == "round_prefer_floor":
            i = np.where(c - np.floor(c) == 0.5, np.floor(c), np.round(c))
        elif m == "round_prefer_ceil":
            i = np.where(c - np.floor(c) == 0.5, np.ceil(c), np.round(c))
        elif m == "floor":
            i = np.floor(c)
        elif m == "ceil":
            i = np.ceil(c)
        else:
            raise ValueError(f"unsupported nearest_mode {m!r}")
        return np.clip(i, 0, n - 1).astype(np.int64)

    def input_map(self, in_lens: Sequence[int], out_lens: Sequence[int]) -> IndexMap | None:
        """A nearest-neighbour resize by integer factors reads input index `o // k`: a view.
        Other resizes compute (or extrapolate), and have no map."""
        if self.mode != "nearest" or self.coordinate_transformation_mode == "tf_crop_and_resize":
            return None
        vars_ = reshape_map(out_lens, out_lens).out_vars
        exprs: list[Expr] = []
        for axis, (n, o) in enumerate(zip(in_lens, out_lens)):
            picks = self.nearest_index(self.source_coords(axis, n), n) if self.resizes(axis, n) else np.arange(n)
            if o % n == 0 and np.array_equal(picks, np.arange(o) // (o // n)):
                exprs.append(vars_[axis] // (o // n))
            elif n == 1:
                exprs.append(Const(0))
            else:
                return None
        return IndexMap(vars_, exprs, in_lens)

    def _filter(self, d: np.ndarray) -> np.ndarray:
        """The linear (support 1) or cubic (support 2, coefficient a) kernel at distances `d`."""
        ad = np.abs(d)
        if self.mode == "linear":
            return np.maximum(0.0, 1 - ad)
        a = self.cubic_coeff_a
        return np.where(ad <= 1, ((a + 2) * ad - (a + 3)) * ad * ad + 1,
                        np.where(ad < 2, ((a * ad - 5 * a) * ad + 8 * a) * ad - 4 * a, 0.0))

    def taps(self, axis: int, n: int) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """(input index, weight) of each tap, per output position along `axis`: one unweighted
        tap (nearest), else the filter's window around each source coordinate, its weights
        normalized to sum to one and its indices clamped to the input (edge padding)."""
        c = self.source_coords(axis, n)
        if self.mode == "nearest":
            return [(self.nearest_index(c, n), None)]
        scale = min(self.scales[axis], 1.0) if self.antialias else 1.0
        support = 1 if self.mode == "linear" else 2
        start = math.floor(-support / scale) + 1
        idx = np.floor(c).astype(np.int64)[:, None] + np.arange(start, 2 - start)[None, :]
        w = self._filter((idx - c[:, None]) * scale)
        if self.exclude_outside:
            w = np.where((idx >= 0) & (idx < n), w, 0.0)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)  # no tap inside: a crop's extrapolated position
        idx = np.clip(idx, 0, n - 1)
        return [(idx[:, k], w[:, k]) for k in range(idx.shape[1])]

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        y = x.astype(np.float64) if self.mode != "nearest" else x
        for axis in range(x.ndim):
            n = x.shape[axis]
            if not self.resizes(axis, n):
                continue
            shape = [-1 if d == axis else 1 for d in range(x.ndim)]
            parts = [np.take(y, i, axis=axis) * (1 if w is None else w.reshape(shape)) for i, w in self.taps(axis, n)]
            y = sum(parts[1:], parts[0])
        for axis in range(x.ndim):
            out = self.outside(axis, x.shape[axis])
            if out is not None:
                y = np.where(out.reshape([-1 if d == axis else 1 for d in range(x.ndim)]), self.extrapolation_value, y)
        return np.asarray(y).astype(x.dtype)


@register
class LRN(Op):
    """Local response normalization across channels: x / (bias + alpha/size * sum(x^2))^beta."""

    name = "lrn"
    kind = OpKind.REDUCE
    family = "window"

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> None:
        super().__init__(size=int(size), alpha=float(alpha), beta=float(beta), bias=float(bias))

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        require(x.ndim >= 3, f"LRN needs [N, C, ...], got rank {x.ndim}")
        return x.as_standard()

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0].astype(np.float64)
        c = x.shape[1]
        sq = x * x
        lo, hi = (self.size - 1) // 2, math.ceil((self.size - 1) / 2)
        pad = np.pad(sq, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
        s = sum(pad[:, i:i + c] for i in range(self.size))
        return (x / (self.bias + self.alpha / self.size * s) ** self.beta).astype(args[0].dtype)
