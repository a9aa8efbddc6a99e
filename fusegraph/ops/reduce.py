"""Reductions and the normalizations built on them.

Reductions keep the reduced dimensions (as length 1), like MIGraphX: the importer adds a
squeeze view when ONNX asks for keepdims=0. Keeping the rank means a reduction's output and
its input share an index space up to the reduced axes, which reduction fusion relies on.
"""

from __future__ import annotations

from typing import Callable, ClassVar, Sequence

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.shape import Shape
from fusegraph.ops.base import Op, OpKind, Reduction, is_float, register, require


class ReduceOp(Op):
    kind = OpKind.REDUCE
    family = "reduction"
    algorithm = "fold"
    np_fn: Callable[..., np.ndarray]

    def __init__(self, axes: Sequence[int]) -> None:
        super().__init__(axes=tuple(sorted(int(a) for a in axes)))

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        require(all(0 <= a < x.ndim for a in self.axes), f"reduce axes {list(self.axes)} out of range for rank {x.ndim}")
        lens = [1 if i in self.axes else n for i, n in enumerate(x.lens)]
        return Shape.of(x.dtype, lens)

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        acc = np.float64 if is_float(x.dtype) else None
        out = type(self).np_fn(x.astype(acc) if acc else x, axis=self.axes, keepdims=True)
        return np.asarray(out).astype(x.dtype)

    def reduced_axes(self, rank: int) -> tuple[int, ...]:
        return tuple(self.axes)


def _define(name: str, fn: Callable[..., np.ndarray], reduction: Reduction) -> None:
    register(type("Reduce_" + name, (ReduceOp,), {"name": name, "np_fn": staticmethod(fn), "reduction": reduction}))


_define("reduce_sum", np.sum, Reduction(0.0, "add"))
_define("reduce_mean", np.mean, Reduction(0.0, "add", "div"))
def _extreme(fn: Callable[..., np.ndarray], largest: bool) -> Callable[..., np.ndarray]:
    """max/min that give ONNX's identity over an empty axis (-inf / +inf, the integer bounds,
    False / True) where NumPy raises."""

    def reduce(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
        if x.size:
            return fn(x, axis=axis, keepdims=keepdims)
        if x.dtype == np.bool_:
            identity: object = not largest
        elif is_float(x.dtype):
            identity = -np.inf if largest else np.inf
        else:
            identity = np.iinfo(x.dtype).min if largest else np.iinfo(x.dtype).max
        return np.full([1 if i in axis else n for i, n in enumerate(x.shape)], identity, x.dtype)

    return reduce


_define("reduce_max", _extreme(np.max, largest=True), Reduction(float("-inf"), "max"))
_define("reduce_min", _extreme(np.min, largest=False), Reduction(float("inf"), "min"))
_define("reduce_prod", np.prod, Reduction(1.0, "mul"))


@register
class ArgReduce(Op):
    """Index (int64) of the largest (`largest`) or smallest element along `axis`, kept as length 1.

    Ties go to the first index, or to the last with `select_last_index`, as ONNX specifies.
    """

    name = "arg_reduce"
    kind = OpKind.REDUCE
    family = "reduction"
    algorithm = "arg"

    def __init__(self, largest: bool, axis: int, select_last_index: bool = False) -> None:
        super().__init__(largest=bool(largest), axis=int(axis), select_last_index=bool(select_last_index))

    def reduced_axes(self, rank: int) -> tuple[int, ...]:
        return (self.axis,)

    def __str__(self) -> str:
        return f"{'argmax' if self.largest else 'argmin'}[axis={self.axis}{',last' if self.select_last_index else ''}]"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        from fusegraph.ir.dtypes import DType

        (x,) = inputs
        require(0 <= self.axis < x.ndim, f"axis {self.axis} out of range for rank {x.ndim}")
        require(x.lens[self.axis] > 0, "cannot take the arg max/min of an empty axis")
        return Shape.of(DType.int64, [1 if i == self.axis else n for i, n in enumerate(x.lens)])

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        fn = np.argmax if self.largest else np.argmin
        if self.select_last_index:
            idx = x.shape[self.axis] - 1 - fn(np.flip(x, self.axis), axis=self.axis, keepdims=True)
        else:
            idx = fn(x, axis=self.axis, keepdims=True)
        return idx.astype(np.int64)


@register
class Softmax(Op):
    """Softmax over one axis (the importer reshapes for the opset<13 flattened form)."""

    name = "softmax"
    kind = OpKind.REDUCE
    family = "reduction"
    algorithm = "softmax"

    def __init__(self, axis: int, log: bool = False) -> None:
        super().__init__(axis=int(axis), log=bool(log))

    def reduced_axes(self, rank: int) -> tuple[int, ...]:
        return (self.axis,)

    def __str__(self) -> str:
        return f"{'log' if self.log else ''}softmax[axis={self.axis}]"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        require(0 <= self.axis < x.ndim, f"softmax axis {self.axis} out of range for rank {x.ndim}")
        require(x.dtype.is_float, f"softmax needs a float input, got {x.dtype}")
        return x.as_standard()

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0].astype(np.float64)
        m = np.max(x, axis=self.axis, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(x - m)
        s = np.sum(e, axis=self.axis, keepdims=True)
        out = (x - m - np.log(s)) if self.log else e / s
        return out.astype(args[0].dtype)


@register
class SegmentSoftmax(Op):
    """Softmax (or log-softmax) over aligned runs of `length` elements along `axis`.

    The form a softmax takes inside an anchor's epilogue (`passes/reduction_epilogue.py`): the
    epilogue computes in the anchor's index space, where the softmax's axis is the channel
    index modulo `length` (a head of 64 in a 192-wide product), so each run lies in one tile
    of output channels and the kernel reduces it across the tile's columns."""

    name = "segment_softmax"
    kind = OpKind.REDUCE
    algorithm = "segment_softmax"
    in_epilogue = True

    def __init__(self, axis: int, length: int, log: bool = False) -> None:
        super().__init__(axis=int(axis), length=int(length), log=bool(log))

    def reduced_axes(self, rank: int) -> tuple[int, ...]:
        return (self.axis,)

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        require(0 <= self.axis < x.ndim, f"segment_softmax axis {self.axis} out of range for rank {x.ndim}")
        require(self.length > 0 and x.lens[self.axis] % self.length == 0,
                f"runs of {self.length} do not divide axis {self.axis} of {list(x.lens)}")
        require(x.dtype.is_float, f"softmax needs a float input, got {x.dtype}")
        return x.as_standard()

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        lens = list(x.shape)
        runs = lens[:self.axis] + [lens[self.axis] // self.length, self.length] + lens[self.axis + 1:]
        out = Softmax(self.axis + 1, self.log).reference([x.reshape(runs)])
        return out.reshape(lens)


@register
class SegmentReduce(Op):
    """A fold (sum, max, min; a mean when `finalize` is `div`) over aligned runs of `length`
    elements along `axis`, repeated along each run: a row reduction inside an anchor's
    epilogue in the anchor's index space, as `segment_softmax` is."""

    name = "segment_reduce"
    kind = OpKind.REDUCE
    algorithm = "segment_reduce"
    in_epilogue = True

    def __init__(self, axis: int, length: int, combine: str, finalize: str | None = None) -> None:
        super().__init__(axis=int(axis), length=int(length), combine=str(combine), finalize=finalize)

    def reduced_axes(self, rank: int) -> tuple[int, ...]:
        return (self.axis,)

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        require(0 <= self.axis < x.ndim and self.length > 0 and x.lens[self.axis] % self.length == 0,
                f"runs of {self.length} along axis {self.axis} do not divide {list(x.lens)}")
        require(self.combine in _FOLDS and self.finalize in (None, "div"), f"no segment fold {self.combine}/{self.finalize}")
        return x.as_standard()

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        lens = list(x.shape)
        runs = x.reshape(lens[:self.axis] + [lens[self.axis] // self.length, self.length] + lens[self.axis + 1:])
        folded = _FOLDS[self.combine](runs.astype(np.float64), axis=self.axis + 1, keepdims=True)
        if self.finalize == "div":
            folded = folded / self.length
        return np.broadcast_to(folded, runs.shape).reshape(lens).astype(x.dtype)


_FOLDS: dict[str, Callable[..., np.ndarray]] = {"add": np.sum, "max": np.max, "min": np.min}


@register
class SegmentLayerNorm(Op):
    """A layernorm (an RMS norm without `center`) over aligned runs of `length` elements along `axis` (and its affine, when
    scale and bias come as inputs broadcast to x's lens): a layernorm over channels inside an
    anchor's epilogue, in the anchor's index space, as `segment_softmax` is. The statistics are
    taken across the tile's columns in float32 (`templates/gemm_reduce.py`)."""

    name = "segment_layernorm"
    kind = OpKind.REDUCE
    algorithm = "segment_layernorm"
    in_epilogue = True

    def __init__(self, axis: int, length: int, epsilon: float, center: bool = True) -> None:
        super().__init__(axis=int(axis), length=int(length), epsilon=float(epsilon), center=bool(center))

    def reduced_axes(self, rank: int) -> tuple[int, ...]:
        return (self.axis,)

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        require(len(inputs) in (1, 3), f"segment_layernorm takes x or x, scale and bias, got {len(inputs)} inputs")
        x = inputs[0]
        require(0 <= self.axis < x.ndim and self.length > 0 and x.lens[self.axis] % self.length == 0,
                f"runs of {self.length} along axis {self.axis} do not divide {list(x.lens)}")
        require(all(p.lens == x.lens for p in inputs[1:]), "scale and bias must be broadcast to the input's lens")
        require(x.dtype.is_float, f"layernorm needs a float input, got {x.dtype}")
        return x.as_standard()

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        """The layernorm (or RMS norm) of each run, with the run as the last axis."""
        lens = list(args[0].shape)
        runs = lens[:self.axis] + [lens[self.axis] // self.length, self.length] + lens[self.axis + 1:]
        moved = [np.moveaxis(a.reshape(runs), self.axis + 1, -1) for a in args]
        norm = (LayerNorm if self.center else RMSNorm)(len(runs) - 1, self.epsilon)
        return np.moveaxis(norm.reference(moved), -1, self.axis + 1).reshape(lens)


@register
class EpilogueSum(Op):
    """The sum (or mean) over `axes`, repeated along them: a reduce_sum or reduce_mean inside
    a convolution's or a row product's epilogue (`passes/reduction_epilogue.py`), in the
    anchor's index space, where it reduces each sample's pixels per channel (the squeeze of a
    squeeze-and-excitation block; `reduction_epilogue.pixel_axes`). Only stored: the kernel's
    programs hold parts of the pixels, so the value exists once they have all added theirs."""

    name = "epilogue_sum"
    kind = OpKind.REDUCE
    algorithm = "epilogue_sum"
    in_epilogue = True
    only_stored = True

    def __init__(self, axes: Sequence[int], mean: bool) -> None:
        super().__init__(axes=tuple(sorted(int(a) for a in axes)), mean=bool(mean))

    def reduced_axes(self, rank: int) -> tuple[int, ...]:
        return tuple(self.axes)

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        require(all(0 <= a < x.ndim for a in self.axes), f"epilogue_sum axes {list(self.axes)} out of range for rank {x.ndim}")
        require(x.dtype.is_float, f"epilogue_sum needs a float input, got {x.dtype}")
        return x.as_standard()

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        fold = np.mean if self.mean else np.sum
        return np.broadcast_to(fold(x.astype(np.float64), axis=self.axes, keepdims=True), x.shape).astype(x.dtype)


@register
class LayerNorm(Op):
    """(x - mean) / sqrt(var + eps) * scale + bias over the axes from `axis` to the end.

    scale and bias arrive already broadcast to x's lens, so the op is pointwise in them; without
    them (one input) the op only normalizes, as it does once `fold_norm_affine` has moved a
    constant affine into the weights of the products that read it.
    """

    name = "layernorm"
    kind = OpKind.REDUCE
    family = "reduction"
    algorithm = "layernorm"
    center: ClassVar[bool] = True  # subtract the mean (an RMS norm does not)
    elementwise_inputs = (1, 2)  # scale and bias

    def __init__(self, axis: int, epsilon: float = 1e-5) -> None:
        super().__init__(axis=int(axis), epsilon=float(epsilon))

    def reduced_axes(self, rank: int) -> tuple[int, ...]:
        return tuple(range(self.axis, rank))

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        require(len(inputs) in (1, 3), f"layernorm takes x or x, scale and bias, got {len(inputs)} inputs")
        x = inputs[0]
        require(0 <= self.axis < x.ndim, f"layernorm axis {self.axis} out of range for rank {x.ndim}")
        require(all(p.lens == x.lens for p in inputs[1:]), "scale and bias must be broadcast to the input's lens")
        return x.as_standard()

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0].astype(np.float64)
        axes = tuple(range(self.axis, x.ndim))
        mean = x.mean(axis=axes, keepdims=True) if self.center else 0.0
        var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
        y = (x - mean) / np.sqrt(var + self.epsilon)
        if len(args) == 3:
            y = y * args[1].astype(np.float64) + args[2].astype(np.float64)
        return y.astype(args[0].dtype)


@register
class RMSNorm(LayerNorm):
    """x / sqrt(mean(x^2) + eps) * scale + bias over the axes from `axis` to the end: a
    layernorm that does not subtract the mean (ONNX's RMSNormalization, the norm of LLaMA-style
    decoders). It shares the layernorm's algorithm, so every place that fuses or lowers a
    layernorm (a product's prologue, an epilogue over channels, the reduction template, the
    affine folded into weights) takes it too, each reading `center`."""

    name = "rmsnorm"
    center = False


def _row_stat(x: np.ndarray, axes: tuple[int, ...], stat: str, epsilon: float, center: bool) -> np.ndarray:
    """The mean of x over `axes`, or 1 / sqrt(var + eps) (the mean square without `center`),
    kept as length 1, in float32 (float64 for float64 data)."""
    wide = x.astype(np.float64)
    mean = wide.mean(axis=axes, keepdims=True)
    if stat == "mean":
        out = mean
    else:
        deviation = wide - mean if center else wide
        out = 1.0 / np.sqrt((deviation * deviation).mean(axis=axes, keepdims=True) + epsilon)
    return out.astype(np.float64 if x.dtype == np.float64 else np.float32)


def _stat_dtype(x: Shape) -> DType:
    return DType.float64 if x.dtype == DType.float64 else DType.float32


@register
class RowRstd(Op):
    """1 / sqrt(var + eps) of x over the axes from `axis` to the end, kept as length 1 (the
    mean square without `center`, as an RMS norm takes it): a layernorm's statistics alone.

    `passes/defer_norm.py` moves a layernorm past the products that read it, which then read
    x as it is and scale their rows by this (and other readers normalize x with it and
    `row_mean`); its readers use it per row, so it is computed in float32 (float64 for float64
    data) whatever x's type, and converted where it is read.
    """

    name = "row_rstd"
    kind = OpKind.REDUCE
    family = "reduction"
    algorithm = "row_stat"
    stat: ClassVar[str] = "rstd"

    def __init__(self, axis: int, epsilon: float, center: bool = True) -> None:
        super().__init__(axis=int(axis), epsilon=float(epsilon), center=bool(center))

    def reduced_axes(self, rank: int) -> tuple[int, ...]:
        return tuple(range(self.axis, rank))

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        require(len(inputs) == 1, f"{self.name} takes one input, got {len(inputs)}")
        (x,) = inputs
        require(0 <= self.axis < x.ndim, f"{self.name} axis {self.axis} out of range for rank {x.ndim}")
        require(x.dtype.is_float, f"{self.name} needs a float input, got {x.dtype}")
        return Shape.of(_stat_dtype(x), [n if d < self.axis else 1 for d, n in enumerate(x.lens)])

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        return _row_stat(x, tuple(range(self.axis, x.ndim)), self.stat, self.attrs.get("epsilon", 0.0),
                         self.attrs.get("center", True))


@register
class RowMean(RowRstd):
    """The mean of x over the axes from `axis` to the end, kept as length 1, in float32: what a
    deferred layernorm's pointwise readers subtract (`row_rstd`'s twin, taken with it)."""

    name = "row_mean"
    stat = "mean"

    def __init__(self, axis: int) -> None:
        Op.__init__(self, axis=int(axis))


@register
class RowMoments(RowRstd):
    """A row's mean and 1 / sqrt(var + eps), both, over the axes from `axis` to the end: index 0
    and 1 along `axis` (the other reduced axes kept as length 1), in float32 (float64 for
    float64 data). The normalizations the importer spells out (GroupNorm, InstanceNorm) read
    both statistics; one kernel computes them in two passes over the row (the mean, then the
    squared deviations from it), where a mean and a variance of the deviations took a kernel
    each and read the row twice from memory. Its readers slice out the statistic they use."""

    name = "row_moments"
    algorithm = "row_moments"
    stat = "moments"

    def __init__(self, axis: int, epsilon: float) -> None:
        super().__init__(axis, epsilon, center=True)

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        rows = super().compute_shape(inputs)
        return Shape.of(rows.dtype, [2 if d == self.axis else n for d, n in enumerate(rows.lens)])

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        x, axes, eps = args[0], tuple(range(self.axis, args[0].ndim)), self.attrs["epsilon"]
        return np.concatenate([_row_stat(x, axes, "mean", eps, True), _row_stat(x, axes, "rstd", eps, True)], axis=self.axis)


@register
class EpilogueRowStat(Op):
    """`row_rstd` or `row_mean` (`stat`) over `axis`, repeated along it: a matrix product's
    epilogue taking the statistics of the rows it writes (`passes/reduction_epilogue.py`), in
    the anchor's index space, `axis` its output channels. Only stored: each program holds a
    tile of a row's columns, so the value exists once every column tile has added its part
    (`templates/gemm_reduce.py`)."""

    name = "epilogue_row_stat"
    kind = OpKind.REDUCE
    algorithm = "epilogue_row_stat"
    in_epilogue = True
    only_stored = True

    def __init__(self, axis: int, stat: str, epsilon: float = 0.0, center: bool = True) -> None:
        require(stat in ("mean", "rstd"), f"epilogue_row_stat computes mean or rstd, not {stat!r}")
        super().__init__(axis=int(axis), stat=str(stat), epsilon=float(epsilon), center=bool(center))

    def reduced_axes(self, rank: int) -> tuple[int, ...]:
        return (self.axis,)

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        require(0 <= self.axis < x.ndim, f"epilogue_row_stat axis {self.axis} out of range for rank {x.ndim}")
        require(x.dtype.is_float, f"epilogue_row_stat needs a float input, got {x.dtype}")
        return Shape.of(_stat_dtype(x), x.lens)

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        a = self.attrs
        return np.broadcast_to(_row_stat(x, (self.axis,), a["stat"], a["epsilon"], a["center"]), x.shape)
