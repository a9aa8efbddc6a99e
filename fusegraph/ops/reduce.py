"""Reductions and the normalizations built on them.

Reductions keep the reduced dimensions (as length 1), like MIGraphX: the importer adds a
squeeze view when ONNX asks for keepdims=0. Keeping the rank means a reduction's output and
its input share an index space up to the reduced axes, which reduction fusion relies on.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from fusegraph.ir.shape import Shape
from fusegraph.ops.base import Op, OpKind, register, require


class ReduceOp(Op):
    kind = OpKind.REDUCE
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
        acc = np.float64 if x.dtype.kind == "f" else None
        out = type(self).np_fn(x.astype(acc) if acc else x, axis=self.axes, keepdims=True)
        return np.asarray(out).astype(x.dtype)


def _define(name: str, fn: Callable[..., np.ndarray]) -> None:
    register(type("Reduce_" + name, (ReduceOp,), {"name": name, "np_fn": staticmethod(fn)}))


_define("reduce_sum", np.sum)
_define("reduce_mean", np.mean)
_define("reduce_max", np.max)
_define("reduce_min", np.min)
_define("reduce_prod", np.prod)


@register
class Softmax(Op):
    """Softmax over one axis (the importer reshapes for the opset<13 flattened form)."""

    name = "softmax"
    kind = OpKind.REDUCE

    def __init__(self, axis: int, log: bool = False) -> None:
        super().__init__(axis=int(axis), log=bool(log))

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
class LayerNorm(Op):
    """(x - mean) / sqrt(var + eps) * scale + bias over the axes from `axis` to the end.

    scale and bias arrive already broadcast to x's lens, so the op is pointwise in them.
    """

    name = "layernorm"
    kind = OpKind.REDUCE

    def __init__(self, axis: int, epsilon: float = 1e-5) -> None:
        super().__init__(axis=int(axis), epsilon=float(epsilon))

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        x, scale, bias = inputs
        require(0 <= self.axis < x.ndim, f"layernorm axis {self.axis} out of range for rank {x.ndim}")
        require(scale.lens == x.lens and bias.lens == x.lens, "scale and bias must be broadcast to the input's lens")
        return x.as_standard()

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        x, scale, bias = (a.astype(np.float64) for a in args)
        axes = tuple(range(self.axis, x.ndim))
        mean = x.mean(axis=axes, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
        return ((x - mean) / np.sqrt(var + self.epsilon) * scale + bias).astype(args[0].dtype)
