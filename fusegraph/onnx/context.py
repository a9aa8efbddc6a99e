"""The state of one ONNX import and the helpers every op parser uses.

Parsers stay a few lines each because the context does the common work: attribute access
with defaults, constant inputs (shape subgraphs are folded to literals as they are read),
NumPy-style broadcasting as explicit `multibroadcast` views, and error messages that name
the node at fault.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence, Union

import numpy as np
import onnx
from onnx import numpy_helper

from fusegraph.errors import DynamicValueError, FusegraphError, ParseError
from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import Op
from fusegraph.ops.constant_fold import fold, foldable, reads_nothing
from fusegraph.ops.source import add_literal

MIN_OPSET = 1  # the oldest default-domain opset the parsers read

ONNX_TO_DTYPE: dict[int, DType] = {
    onnx.TensorProto.FLOAT: DType.float32,
    onnx.TensorProto.FLOAT16: DType.float16,
    onnx.TensorProto.BFLOAT16: DType.bfloat16,
    onnx.TensorProto.DOUBLE: DType.float64,
    onnx.TensorProto.INT64: DType.int64,
    onnx.TensorProto.INT32: DType.int32,
    onnx.TensorProto.INT16: DType.int16,
    onnx.TensorProto.INT8: DType.int8,
    onnx.TensorProto.UINT8: DType.uint8,
    onnx.TensorProto.UINT16: DType.uint16,
    onnx.TensorProto.UINT32: DType.uint32,
    onnx.TensorProto.UINT64: DType.uint64,
    onnx.TensorProto.BOOL: DType.bool,
}

def onnx_dtype(code: int, where: str) -> DType:
    try:
        return ONNX_TO_DTYPE[code]
    except KeyError:
        name = onnx.TensorProto.DataType.Name(code) if code in onnx.TensorProto.DataType.values() else str(code)
        raise ParseError(f"{where}: element type {name} is not supported") from None


#: What an ONNX name holds during the import: a tensor is an instruction; a sequence, whose
#: structure must be known at import, is a list of them; an optional is its value or None (empty).
Value = Union[Instruction, list[Instruction], None]


class ImportContext:
    """Holds the module being built, the ONNX value names and the opset."""

    def __init__(self, module: Module, opset: int) -> None:
        self.module = module
        self.opset = opset
        self.values: dict[str, Value] = {}
        self.node: onnx.NodeProto | None = None

    # reading nodes and sub-graphs --------------------------------------------------
    def import_node(self, node: onnx.NodeProto) -> None:
        """Parse one node: its inputs from `values`, its outputs into them."""
        self.node = node
        args = []
        for name in node.input:
            if not name:
                args.append(None)
            elif name not in self.values:
                raise ParseError(f"{self.where}: input {name!r} is not produced by any earlier node or graph input")
            elif isinstance(self.values[name], list) and op_key(node) not in SEQUENCE_OPS:
                raise self.error(f"input {name!r} is a sequence; {node.op_type} takes tensors")
            else:
                args.append(self.values[name])
        try:
            result = PARSERS[op_key(node)](self, args)
        except FusegraphError:
            raise
        except (ValueError, TypeError, IndexError, AssertionError) as e:
            raise ParseError(f"{self.where}: {e or type(e).__name__}") from None
        outs = result if isinstance(result, list) else [result]  # a sequence output comes as [list]
        for name, value in zip(node.output, outs):
            if name:
                self.values[name] = value
        missing = [n for n in node.output[len(outs):] if n]
        if missing:
            raise ParseError(f"{self.where}: output(s) {', '.join(missing)} are not supported")

    def read_graph(self, graph: onnx.GraphProto, bindings: Sequence[Value], prefix: str) -> list[Value]:
        """The outputs of a sub-graph (a branch, a loop or map body) read in place.

        Its inputs are bound to `bindings`, its node names get `prefix`, and its own names are
        scoped to it: a body read once per element never sees the previous element's values.
        """
        outer, node = self.values, self.node
        self.values = {**outer, **{i.name: b for i, b in zip(graph.input, bindings)}}
        try:
            for t in graph.initializer:
                self.values[t.name] = self.literal(numpy_helper.to_array(t))
            for k, inner in enumerate(graph.node):
                copy = onnx.NodeProto()
                copy.CopyFrom(inner)
                copy.name = f"{prefix}/{inner.name or inner.op_type + '_' + str(k)}"
                self.import_node(copy)
            self.node = node
            missing = [o.name for o in graph.output if o.name not in self.values]
            if missing:
                raise self.error(f"sub-graph output(s) {', '.join(missing)} are not produced")
            return [self.values[o.name] for o in graph.output]
        finally:
            self.values, self.node = outer, node

    # naming the culprit ------------------------------------------------------------
    @property
    def where(self) -> str:
        n = self.node
        if n is None:
            return "model"
        return f"node {n.name or '(unnamed)'!r} ({n.op_type})"

    def error(self, message: str) -> ParseError:
        return ParseError(f"{self.where}: {message}")

    # attributes --------------------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        assert self.node is not None
        for a in self.node.attribute:
            if a.name == name:
                value = onnx.helper.get_attribute_value(a)
                if isinstance(value, bytes):
                    return value.decode()
                if isinstance(value, onnx.TensorProto):
                    return numpy_helper.to_array(value)
                if isinstance(value, list) and value and isinstance(value[0], bytes):
                    return [v.decode() for v in value]
                return value
        return default

    def has_attr(self, name: str) -> bool:
        assert self.node is not None
        return any(a.name == name for a in self.node.attribute)

    def check_attr(self, name: str, value: Any, allowed: Sequence[Any]) -> Any:
        if value not in allowed:
            raise self.error(f"attribute {name}={value!r} is not supported (supported: {', '.join(map(str, allowed))})")
        return value

    # constants ---------------------------------------------------------------------
    def const(self, ins: Instruction | None) -> np.ndarray | None:
        """The value of `ins` if it is a literal (after folding), else None."""
        if ins is not None and ins.op.name == "@literal":
            return ins.op.value  # type: ignore[attr-defined]
        return None

    def require_const(self, ins: Instruction | None, what: str) -> np.ndarray:
        """The value of `ins`, which sets a shape or an attribute and so must be known now.

        Otherwise a DynamicValueError names the graph inputs the value depends on.
        """
        value = self.const(ins)
        if value is None:
            raise DynamicValueError(f"{self.where}: {what} must be a constant (or computable from input shapes); "
                                    "fix the input dimensions with --input-dim", self.params_feeding(ins))
        return value

    def require_ints(self, ins: Instruction | None, what: str) -> list[int]:
        """The integers of a constant input (sizes, positions), flattened."""
        value = self.require_const(ins, what)
        if value.dtype.kind not in "iu":  # int() would truncate 2.5 to 2 without a word
            raise self.error(f"{what} must be integers, got {value.dtype.name} {value.reshape(-1).tolist()}")
        return [int(x) for x in value.reshape(-1)]

    @staticmethod
    def params_feeding(ins: Instruction | None) -> tuple[str, ...]:
        """Names of the graph inputs that `ins` depends on."""
        names: list[str] = []
        seen: set[int] = set()
        stack = [ins] if ins is not None else []
        while stack:
            x = stack.pop()
            if id(x) in seen:
                continue
            seen.add(id(x))
            if x.op.name == "@param":
                names.append(x.op.attrs["name"])
            stack.extend(x.inputs)
        return tuple(sorted(names))

    def literal(self, value: np.ndarray | float | int, dtype: DType | None = None) -> Instruction:
        return add_literal(self.module, value, dtype, origin=self.node.name if self.node else "")

    # building ----------------------------------------------------------------------
    def add(self, op: Op, inputs: Sequence[Instruction]) -> Instruction:
        """Append an instruction; fold it into a literal when all its inputs are literals or
        all are empty (no kernel can run on an empty tensor, and none needs to)."""
        origin = self.node.name if self.node is not None else ""
        ins = self.module.add(op, inputs, origin=origin)
        if foldable(ins) or reads_nothing(ins):
            try:
                return fold(self.module, ins)
            except (ValueError, IndexError) as e:
                raise self.error(str(e)) from None
        return ins

    def broadcast(self, *xs: Instruction) -> list[Instruction]:
        """Broadcast operands to their common lens (NumPy rules) with explicit views."""
        from fusegraph.ops.views import MultiBroadcast

        try:
            lens = tuple(np.broadcast_shapes(*(x.shape.lens for x in xs)))
        except ValueError:
            raise self.error("operands cannot be broadcast together: " +
                             ", ".join(str(list(x.shape.lens)) for x in xs)) from None
        return [x if x.shape.lens == lens else self.add(MultiBroadcast(lens), [x]) for x in xs]

    def legacy_broadcast(self, a: Instruction, b: Instruction) -> Instruction:
        """B lined up against A the way opsets before 7 broadcast it.

        There `broadcast=1, axis=k` matched B's dims to A's dims k, k+1, ...; NumPy rules align
        trailing dims instead, so B gets length-1 dims after it to reach A's end. Without `axis`
        the old rule matched the trailing dims, which NumPy rules already do, and a one-element B
        broadcasts anywhere.
        """
        from fusegraph.ops.views import Unsqueeze

        if self.opset >= 7 or not self.attr("broadcast", 0) or not self.has_attr("axis") or b.shape.elements == 1:
            return b
        axis = self.axis(self.attr("axis"), a.shape.ndim, "broadcast axis")
        tail = a.shape.ndim - axis - b.shape.ndim
        if tail < 0 or a.shape.lens[axis:axis + b.shape.ndim] != b.shape.lens:
            raise self.error(f"B {list(b.shape.lens)} does not match A {list(a.shape.lens)} from axis {axis}")
        return self.add(Unsqueeze(range(b.shape.ndim, b.shape.ndim + tail)), [b]) if tail else b

    def convert(self, x: Instruction, dtype: DType) -> Instruction:
        from fusegraph.ops.pointwise import Convert

        return x if x.shape.dtype == dtype else self.add(Convert(dtype), [x])

    def axis(self, axis: int, rank: int, what: str = "axis") -> int:
        if not -rank <= axis < rank:
            raise self.error(f"{what} {axis} out of range for rank {rank}")
        return axis + rank if axis < 0 else axis

    def axes(self, axes: Sequence[int], rank: int) -> list[int]:
        out = [self.axis(int(a), rank, "axis") for a in axes]
        if len(set(out)) != len(out):
            raise self.error(f"repeated axis in {list(axes)}")
        return out


#: A parser returns its one output, or a list of its outputs (a sequence output inside that list).
Parser = Callable[[ImportContext, list[Any]], Any]

#: ONNX op type -> parser. Filled by `fusegraph.onnx.parsers`.
PARSERS: dict[str, Parser] = {}

#: ONNX op type -> which of its nodes the parser leaves to the op's function body (forms the
#: parser does not map, such as attention with a softcap); see `onnx/functions.py`.
BODY_FORMS: dict[str, Callable[[onnx.NodeProto], bool]] = {}


def op_key(node: onnx.NodeProto) -> str:
    """The parser registry's name of a node's op: its type, prefixed by any non-standard domain
    (`com.microsoft.Attention` is not ONNX's `Attention`)."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def parses(node: onnx.NodeProto) -> bool:
    """Whether a parser reads `node` itself (else its function body, if ONNX defines one, is read)."""
    key = op_key(node)
    return key in PARSERS and not (key in BODY_FORMS and BODY_FORMS[key](node))


#: ONNX op types whose parsers take sequences (lists) among their inputs; any other op given a
#: sequence is refused by name (`ImportContext.import_node`).
SEQUENCE_OPS: set[str] = set()


def onnx_op(*op_types: str, sequences: bool = False) -> Callable[[Parser], Parser]:
    """Decorator registering a parser for one or more ONNX op types (`sequences`: it reads
    sequence inputs)."""

    def deco(fn: Parser) -> Parser:
        for t in op_types:
            if t in PARSERS:
                raise ValueError(f"parser for {t} registered twice")
            PARSERS[t] = fn
            if sequences:
                SEQUENCE_OPS.add(t)
        return fn

    return deco


def prod(xs: Sequence[int]) -> int:
    return math.prod(int(x) for x in xs)
