"""The operator base class and registry.

Every operator is defined once, here in `ops/`: its name, attributes, shape inference, NumPy
reference and kind. The kind is what the fusion passes reason about: pointwise ops fuse with
each other, views become index maps, anchors (convolution, dot, pooling) take a prologue and
an epilogue, reductions fuse with their pointwise neighbours, data movement runs on its own.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, ClassVar, Sequence

import ml_dtypes
import numpy as np

from fusegraph.ir.shape import Shape


class OpKind(enum.Enum):
    SOURCE = "source"  # parameters and literals
    POINTWISE = "pointwise"  # out[i] = f(in0[i], in1[i], ...), all inputs of the output's lens
    VIEW = "view"  # reindexing without arithmetic: reshape, transpose, broadcast, slice, ...
    REDUCE = "reduce"  # reductions and the ops built on them: reduce_*, softmax, layernorm
    ANCHOR = "anchor"  # convolution, dot, pooling: compute-heavy ops that host fused epilogues
    MOVE = "move"  # data movement that is not a view: concat, gather, pad, resize
    FUSED = "fused"  # a fused group with a sub-module


class Op:
    """An operator with attributes.

    Subclasses set `name` and `kind` and implement `compute_shape` and `reference`. Attributes are
    normalized to hashable values (tuples, not lists) so ops compare and hash by value, which the
    passes use to find identical instructions.
    """

    name: ClassVar[str] = ""
    kind: ClassVar[OpKind] = OpKind.POINTWISE

    def __init__(self, **attrs: Any) -> None:
        self.attrs: dict[str, Any] = {k: _freeze(v) for k, v in attrs.items()}

    def __getattr__(self, item: str) -> Any:
        attrs = self.__dict__.get("attrs")
        if attrs is not None and item in attrs:
            return attrs[item]
        raise AttributeError(f"{type(self).__name__} has no attribute {item!r}")

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        raise NotImplementedError

    def reference(self, args: Sequence[np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def attr_text(self) -> str:
        """Attributes as printed between brackets, MIGraphX style: `padding={1,1},stride={1,1}`."""
        return ",".join(f"{k}={_fmt(v)}" for k, v in self.attrs.items())

    def __str__(self) -> str:
        text = self.attr_text()
        return f"{self.name}[{text}]" if text else self.name

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.attrs == other.attrs  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self.attrs.items()))))


def _freeze(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.generic):
        return v.item()
    return v


def _fmt(v: Any) -> str:
    if isinstance(v, tuple):
        return "{" + ",".join(_fmt(x) for x in v) + "}"
    if isinstance(v, float):
        return repr(v)
    return str(v)


REGISTRY: dict[str, type[Op]] = {}


def register(cls: type[Op]) -> type[Op]:
    """Class decorator: make an op constructible by name (`make_op("convolution", ...)`)."""
    if cls.name in REGISTRY:
        raise ValueError(f"op {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def make_op(name: str, **attrs: Any) -> Op:
    try:
        cls = REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None
    return cls(**attrs)


def is_float(dtype: np.dtype | type) -> bool:
    """Whether a NumPy dtype is floating point, bfloat16 included (ml_dtypes gives it kind 'V', not 'f')."""
    dt = np.dtype(dtype)
    return dt.kind == "f" or dt == ml_dtypes.bfloat16


def require(cond: bool, message: str | Callable[[], str]) -> None:
    """Raise a ValueError with `message` unless `cond`; shape inference uses it for its checks.

    The module that adds the instruction turns the ValueError into a ShapeError naming the node.
    """
    if not cond:
        raise ValueError(message() if callable(message) else message)
