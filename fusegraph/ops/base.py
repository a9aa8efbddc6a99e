"""The operator base class, its traits and the registry.

Every operator is defined once, here in `ops/`: its name, attributes, shape inference, NumPy
reference and its traits. Passes, the memory plan and code generation ask an op for a trait,
never for its name, so a new op is one class here (plus its ONNX parser and, for a GPU
template, its spelling there):

* `kind`: how fusion treats it. Pointwise ops fuse with each other, views become index maps,
  anchors (convolution, dot, pooling) take a prologue and an epilogue, reductions fuse with a
  recomputed pointwise prologue, data movement runs on its own; `MEMORY` ops (load, store,
  allocate, select) exist only inside fused groups.
* `family`: which GPU template family lowers it (`gemm`, `window`, `movement`, `reduction`,
  `attention`); empty for ops no template lowers by themselves. `template_family(input shapes)`
  may name a narrower one for some shapes (`depthwise` for a convolution with one input
  channel per group).
* `short_name`: how fused kernel names spell it (`conv` for convolution).
* views: `input_map` (output index -> the input index it reads), `bijective`, `keeps_order`,
  `broadcasts`, `axis_permutation` (transpose), `ranges` (a unit-step slice).
* pointwise: `converts_type` (convert), `right_identity` (add, sub: 0; mul, div: 1).
* anchors: `channel_axis`, `weight_input`, `weight_channel_axis`, `spatial_window`,
  `k_is_last_axis`, `recomputed_inputs` (attention's mask: computed where it is read, once per
  score).
* `concatenates` (concat): its inputs lie end to end along its `axis`; `finds_elements` (the
  other movement ops: gathers, pads): each output element found from its own index, so a group
  can compute it wherever it reads it.
* reductions: `reduced_axes`, `algorithm` and, for plain folds, `reduction`: identity, combine
  and finalize as target-neutral scalar ops; `in_epilogue` for a reduction that an anchor's
  epilogue computes (over runs of its output channels, or over each sample's pixels), and
  `only_stored` for one whose programs each hold a part (a sum over pixels, rows' statistics
  over column tiles), which the epilogue stores but cannot read;
  `elementwise_inputs` (layernorm's scale and bias: read at the op's own output index).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import numpy as np

from fusegraph.ir.dtypes import is_bfloat16
from fusegraph.ir.shape import Shape

if TYPE_CHECKING:
    from fusegraph.ir.index_map import IndexMap
    from fusegraph.ir.program import Instruction


class OpKind(enum.Enum):
    """How fusion treats an op."""

    PARAM = "param"  # a program input
    LITERAL = "literal"  # a constant tensor
    POINTWISE = "pointwise"  # out[i] = f(in0[i], in1[i], ...), all inputs of the output's lens
    VIEW = "view"  # reindexing without arithmetic: reshape, transpose, broadcast, slice, ...
    REDUCE = "reduce"  # reductions and the ops built on them (softmax, layernorm, lrn): fused with a recomputed prologue
    ANCHOR = "anchor"  # convolution, dot, pooling: compute-heavy ops that host fused epilogues
    MOVE = "move"  # data movement that is not a view: concat, gather, pad, resize
    MEMORY = "memory"  # inside fused groups only: load, store, allocate, select (see `Op.memory`)
    FUSED = "fused"  # a fused group with a sub-module
    OUTPUT = "output"  # a further value stored by a fused group (`fused_output`), after its first

    @property
    def is_source(self) -> bool:
        """Parameters and literals: instructions that read nothing and compute nothing."""
        return self in (OpKind.PARAM, OpKind.LITERAL)


class MemoryKind(enum.Enum):
    """What a MEMORY op does inside a fused group."""

    LOAD = "load"  # read an input through an index map
    STORE = "store"  # write a value into a buffer through an index map
    ALLOCATE = "allocate"  # a fresh output buffer
    SELECT = "select"  # one of its values, chosen by conditions on the index (a concat read in a kernel)


@dataclass(frozen=True)
class Reduction:
    """A reduction that folds its elements with one binary pointwise op.

    `identity` is the fold's start value, `combine` the name of the pointwise op that folds two
    partial results, `finalize` (if any) the name of a binary pointwise op applied to the
    result and the number of reduced elements (`div` for a mean). Targets spell these ops.
    """

    identity: float
    combine: str
    finalize: str | None = None


class Op:
    """An operator with attributes.

    Subclasses set `name` and `kind` and implement `compute_shape` and `reference`. Attributes are
    normalized to hashable values (tuples, not lists) so ops compare and hash by value, which the
    passes use to find identical instructions.
    """

    name: ClassVar[str] = ""
    kind: ClassVar[OpKind] = OpKind.POINTWISE
    family: ClassVar[str] = ""  # the GPU template family that lowers it; "" if none does
    memory: ClassVar[MemoryKind | None] = None  # for MEMORY ops
    short_name: ClassVar[str] = ""  # its part of a fused kernel's name; `name` when empty
    # views
    bijective: ClassVar[bool] = False  # the input map is invertible (reshape, transpose, ...)
    keeps_order: ClassVar[bool] = False  # changes lens only: row-major element order is kept
    broadcasts: ClassVar[bool] = False  # NumPy-style broadcast: adds leading dims, repeats size-1 dims
    # pointwise
    converts_type: ClassVar[bool] = False  # its value is its input's in another element type
    # anchors
    weight_input: ClassVar[int | None] = None  # which input holds the weights
    recomputed_inputs: ClassVar[tuple[int, ...]] = ()  # inputs whose pointwise producers its group recomputes
    spatial_window: ClassVar[bool] = False  # slides a window (padding, stride, dilation) over [N, C, *spatial]
    k_is_last_axis: ClassVar[bool] = False  # a product summing over its first input's last axis (a matrix product)
    # data movement
    concatenates: ClassVar[bool] = False  # lays its inputs end to end along its `axis` attribute
    # reductions
    algorithm: ClassVar[str] = ""  # how the reduction template computes it: fold, softmax, layernorm, arg
    reduction: ClassVar[Reduction | None] = None  # for algorithm "fold"
    in_epilogue: ClassVar[bool] = False  # a reduction computed inside an anchor's epilogue (segment_softmax, epilogue_sum)
    # an epilogue reduction whose value exists only once every program has added its part (a
    # sum over pixels, row statistics over column tiles): stored, never read inside the kernel
    only_stored: ClassVar[bool] = False
    elementwise_inputs: ClassVar[tuple[int, ...]] = ()  # inputs read element by element at the output's index
    # its algebraic role, for rewrites that move constants or recognize masks without naming ops:
    # "sum", "product", "quotient" (a / b), "select" (cond ? a : b), "nan_test"; "" for the rest
    algebra: ClassVar[str] = ""

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

    def input_map(self, in_lens: Sequence[int], out_lens: Sequence[int]) -> "IndexMap | None":
        """For a view: the map from an output index to the input index it reads; else None."""
        return None

    def axis_permutation(self) -> tuple[int, ...] | None:
        """For a view that only permutes axes: output axis i is input axis perm[i]; else None.

        Two such views in a row compose into one permutation."""
        return None

    def ranges(self) -> tuple[tuple[int, int, int], ...] | None:
        """For a view that reads one box of its input with unit steps: (axis, start, end) of
        each axis it cuts; else None. An epilogue splits at such a view, by domain."""
        return None

    @property
    def finds_elements(self) -> bool:
        """A movement op other than a concat (a gather, a pad): it finds each output element from
        that element's index alone, so a reduction's kernel computes it where it reads it."""
        return self.family == "movement" and not self.concatenates

    def template_family(self, inputs: Sequence[Shape]) -> str:
        """The GPU template family that lowers this op on inputs of these shapes: `family`,
        unless the shapes make a narrower template the better one (a depthwise convolution)."""
        return self.family

    def channel_axis(self, rank: int) -> int:
        """For an anchor: the axis of its output channels in an output of rank `rank`."""
        raise NotImplementedError(f"{self.name} has no channel axis")

    def weight_channel_axis(self, rank: int) -> int:
        """For an anchor with weights: the axis of output channels in a weight of rank `rank`."""
        raise NotImplementedError(f"{self.name} has no weights")

    def reduced_axes(self, rank: int) -> tuple[int, ...]:
        """For a reduction: the axes of an input of rank `rank` it reduces over."""
        raise NotImplementedError(f"{self.name} reduces nothing")

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


def input_map_of(ins: "Instruction") -> "IndexMap | None":
    """The map from an index of `ins`'s output to the index of its input it reads, or None
    when `ins` is not a view (or has an empty dimension, which needs no map)."""
    if ins.shape.elements == 0 or not ins.inputs or ins.inputs[0].shape.elements == 0:
        return None
    return ins.op.input_map(ins.inputs[0].shape.lens, ins.shape.lens)


def view_source(ins: "Instruction") -> "Instruction":
    """The instruction a chain of views (`ins` itself when it is no view) starts from."""
    while input_map_of(ins) is not None:
        ins = ins.inputs[0]
    return ins


def is_param(ins: "Instruction") -> bool:
    return ins.op.kind == OpKind.PARAM


def is_literal(ins: "Instruction") -> bool:
    return ins.op.kind == OpKind.LITERAL


def is_fused(ins: "Instruction") -> bool:
    return ins.op.kind == OpKind.FUSED


def is_fused_output(ins: "Instruction") -> bool:
    return ins.op.kind == OpKind.OUTPUT


def is_load(ins: "Instruction") -> bool:
    return ins.op.memory == MemoryKind.LOAD


def is_store(ins: "Instruction") -> bool:
    return ins.op.memory == MemoryKind.STORE


def is_allocate(ins: "Instruction") -> bool:
    return ins.op.memory == MemoryKind.ALLOCATE


def is_select(ins: "Instruction") -> bool:
    return ins.op.memory == MemoryKind.SELECT


def is_float(dtype: np.dtype | type) -> bool:
    """Whether a NumPy dtype is floating point, bfloat16 included (ml_dtypes gives it kind 'V', not 'f')."""
    dt = np.dtype(dtype)
    return dt.kind == "f" or is_bfloat16(dt)


def require(cond: bool, message: str | Callable[[], str]) -> None:
    """Raise a ValueError with `message` unless `cond`; shape inference uses it for its checks.

    The module that adds the instruction turns the ValueError into a ShapeError naming the node.
    """
    if not cond:
        raise ValueError(message() if callable(message) else message)
