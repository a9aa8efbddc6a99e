"""Checks of an ONNX graph's structure before the importer builds anything from it.

A malformed file must be refused with a message naming the culprit, not crash a parser, allocate
terabytes for a huge declared dim or import into a silently wrong program. The checks here need
only the protobuf: names defined before use and no cycles, no duplicate graph inputs, outputs or
initializers, at least one output, tensor dims and sizes that match their data, known element
types, and nodes whose input counts and attribute types fit their ONNX schema.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import onnx

from fusegraph.errors import ParseError
from fusegraph.ir.shape import MAX_ELEMENTS
from fusegraph.onnx.context import MIN_OPSET, PARSERS, onnx_dtype

_STANDARD_DOMAINS = ("", "ai.onnx")


def validate_model(model: onnx.ModelProto, input_dims: Mapping[str, Sequence[int]] | None = None) -> None:
    """Raise a ParseError naming the first defect found; `input_dims` are the caller's overrides."""
    graph = model.graph
    _check_unique_names(graph)
    for t in graph.initializer:
        _check_initializer(t)
    initializers = {t.name for t in graph.initializer}
    for value_info in graph.input:
        if value_info.name not in initializers:
            _check_input(value_info, (input_dims or {}).get(value_info.name))
    _check_dataflow(graph)
    versions = {o.domain: o.version for o in model.opset_import}
    opset = versions.get("", versions.get("ai.onnx", 0))
    if not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        return  # the importer refuses the opset itself, a clearer message than any node's schema
    for k, node in enumerate(graph.node):
        if node.domain in _STANDARD_DOMAINS and node.op_type in PARSERS:  # the others are listed as unsupported
            _check_schema(node, _node_where(node, k), opset)


def check_elements(lens: Sequence[int], where: str) -> None:
    """Dims must be non-negative and their product at most MAX_ELEMENTS (checked on the protobuf's
    numbers, before any Shape or array is made)."""
    if any(d < 0 for d in lens):
        raise ParseError(f"{where}: negative dimension in {list(lens)}")
    if math.prod(lens) > MAX_ELEMENTS:
        raise ParseError(f"{where}: dims {list(lens)} give {math.prod(lens)} elements, more than the "
                         f"{MAX_ELEMENTS} fusegraph accepts in one tensor")


def _node_where(node: onnx.NodeProto, k: int) -> str:
    """The importer's name for a node (it names unnamed nodes OpType_k the same way)."""
    return f"node {node.name or f'{node.op_type}_{k}'!r} ({node.op_type})"


def _check_unique_names(graph: onnx.GraphProto) -> None:
    for what, items in (("graph input", graph.input), ("graph output", graph.output),
                        ("initializer", graph.initializer)):
        seen: set[str] = set()
        for item in items:
            if item.name in seen:
                raise ParseError(f"{what} {item.name!r} is listed twice")
            seen.add(item.name)
    if not graph.output:
        raise ParseError("the graph has no outputs")


# tensors ------------------------------------------------------------------------------------

#: The repeated field that holds a tensor's values when raw_data is not used, by element type.
_TYPED_FIELD = {onnx.TensorProto.FLOAT: "float_data", onnx.TensorProto.DOUBLE: "double_data",
                onnx.TensorProto.INT64: "int64_data"}


def _check_initializer(t: onnx.TensorProto) -> None:
    where = f"initializer {t.name!r}"
    dtype = onnx_dtype(t.data_type, where)
    dims = [int(d) for d in t.dims]
    check_elements(dims, where)
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return
    n = math.prod(dims)
    if t.HasField("raw_data"):
        size, want, unit = len(t.raw_data), n * np.dtype(dtype.numpy).itemsize, "bytes"
    else:
        size, want, unit = len(getattr(t, _TYPED_FIELD.get(t.data_type, "int32_data"))), n, "values"
    if size != want:
        raise ParseError(f"{where}: holds {size} {unit} of data but its dims {dims} need {want}")


def _check_input(value_info: onnx.ValueInfoProto, override: Sequence[int] | None) -> None:
    where = f"input {value_info.name!r}"
    t = value_info.type
    while t.WhichOneof("value") in ("optional_type", "sequence_type"):  # their tensors are bound in onnx/structure.py
        t, override = getattr(t, t.WhichOneof("value")).elem_type, None
    if not t.HasField("tensor_type"):
        raise ParseError(f"{where}: only tensor, sequence and optional inputs are supported")
    tt = t.tensor_type
    onnx_dtype(tt.elem_type, where)
    if override is not None:
        check_elements([int(d) for d in override], f"{where} (--input-dim)")
        return
    declared = [d.dim_value for d in tt.shape.dim if d.HasField("dim_value")]
    check_elements(declared, where)


# dataflow -----------------------------------------------------------------------------------

def _check_dataflow(graph: onnx.GraphProto) -> None:
    """Every node input defined by an earlier node, a graph input or an initializer; each value
    defined once; every graph output defined."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    producer = {}
    for k, node in enumerate(graph.node):
        for name in node.output:
            if name in defined or name in producer:
                raise ParseError(f"{_node_where(node, k)}: output {name!r} is already defined "
                                 f"{'by another node' if name in producer else 'as a graph input or initializer'}")
            if name:
                producer[name] = k
    for k, node in enumerate(graph.node):
        for name in node.input:
            if name and name not in defined:
                raise ParseError(f"{_node_where(node, k)}: {_undefined(graph, producer, k, name)}")
        defined.update(n for n in node.output if n)
    for out in graph.output:
        if out.name not in defined:
            raise ParseError(f"graph output {out.name!r} is not produced by any node")


def _undefined(graph: onnx.GraphProto, producer: Mapping[str, int], k: int, name: str) -> str:
    """Why node k cannot read `name`: nothing makes it, it comes from a cycle, or from a later node."""
    if name not in producer:
        return f"input {name!r} is not produced by any node, graph input or initializer"
    path = _path_back(graph, producer, producer[name], k)
    if path is not None:
        names = [_node_where(graph.node[j], j) for j in [k] + path]
        return f"input {name!r} comes from a cycle: {' <- '.join(names)}"
    j = producer[name]
    return f"input {name!r} is produced by a later {_node_where(graph.node[j], j)}; nodes must be in topological order"


def _path_back(graph: onnx.GraphProto, producer: Mapping[str, int], start: int, target: int) -> list[int] | None:
    """Node indices from `start` back through the producers of its inputs to `target`, if any."""
    stack, seen = [(start, [start])], set()
    while stack:
        j, path = stack.pop()
        if j == target:
            return path
        if j in seen:
            continue
        seen.add(j)
        stack.extend((producer[n], path + [producer[n]]) for n in graph.node[j].input if n in producer)
    return None


# schemas ------------------------------------------------------------------------------------

def _check_schema(node: onnx.NodeProto, where: str, opset: int) -> None:
    """Input and output counts and attribute types the op's schema (at the model's opset) allows."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return  # an op unknown at this opset: the supported-op check names it
    given = len(node.input)
    if given > schema.max_input:
        raise ParseError(f"{where}: has {given} inputs, but {node.op_type} takes at most {schema.max_input}")
    for i, param in enumerate(schema.inputs):
        if param.option == onnx.defs.OpSchema.FormalParameterOption.Single and (i >= given or not node.input[i]):
            raise ParseError(f"{where}: required input {i} ({param.name}) is missing")
    if len(node.output) > schema.max_output:
        raise ParseError(f"{where}: has {len(node.output)} outputs, but {node.op_type} gives at most {schema.max_output}")
    for a in node.attribute:
        spec = schema.attributes.get(a.name)
        if spec is None:
            continue
        want = onnx.AttributeProto.AttributeType.Name(int(spec.type))
        if a.type != int(spec.type):
            got = onnx.AttributeProto.AttributeType.Name(a.type) if a.type in onnx.AttributeProto.AttributeType.values() \
                else str(a.type)
            raise ParseError(f"{where}: attribute {a.name} must be of type {want}, got {got}")
