"""Ops without a parser that ONNX defines as functions are read as their function bodies.

Many newer ops (RotaryEmbedding, CenterCropPad, Attention, ...) come with a body of simpler
ops in their schema; onnx generates the `_expanded` node tests from those bodies. A node of
such an op is replaced, before the import, by its body's nodes for the model's opset, with
its inputs, outputs and attributes substituted and internal names prefixed by the node's name.
Bodies may use function ops in turn; those expand too. Each body node keeps the opset its
function was written for (`opsets`), which the importer reads it under. A parser always wins
over a body: expansion applies only to nodes no parser reads (an op type without a parser, or
a form its parser leaves to the body, `context.BODY_FORMS`).
"""

from __future__ import annotations

from typing import Callable

import onnx
from onnx import AttributeProto, FunctionProto, NodeProto, TypeProto

_MAX_DEPTH = 8  # bodies that use function ops in turn, nested at most this deep


def _function_body(node: NodeProto, opset: int, types: Callable[[str], TypeProto | None]) -> FunctionProto | None:
    """The body of `node`'s op at `opset` (context-dependent bodies built for its input types)."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        return None
    body = FunctionProto()
    plain = [v for v in schema.function_opset_versions if v <= opset]
    if plain:
        body.ParseFromString(schema.get_function_with_opset_version(max(plain)))
        return body
    dependent = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if not dependent:
        return None
    input_types = [types(name) if name else TypeProto() for name in node.input]
    if any(t is None for t in input_types):
        return None
    with_defaults = NodeProto()
    with_defaults.CopyFrom(node)
    present = {a.name for a in node.attribute}
    with_defaults.attribute.extend(a.default_value for name, a in schema.attributes.items()
                                   if name not in present and a.default_value.name)
    data = schema.get_context_dependent_function_with_opset_version(
        max(dependent), with_defaults.SerializeToString(), [t.SerializeToString() for t in input_types])
    body.ParseFromString(data)
    return body if body.node else None


def _instantiate(node: NodeProto, body: FunctionProto, defaults: dict[str, AttributeProto]) -> list[NodeProto]:
    """The body's nodes wired to `node`'s inputs, outputs and attributes."""
    prefix = f"{node.name}/"
    names = {formal: actual for formal, actual in zip(body.input, node.input)}
    names.update({formal: actual for formal, actual in zip(body.output, node.output) if actual})
    attrs = {**defaults, **{a.name: a for a in node.attribute}}

    def rename(x: str) -> str:
        return names.get(x, prefix + x) if x else ""

    out = []
    for k, inner in enumerate(body.node):
        n = NodeProto()
        n.CopyFrom(inner)
        n.name = f"{prefix}{inner.name or inner.op_type + '_' + str(k)}"
        n.ClearField("input")
        n.ClearField("output")
        n.ClearField("attribute")
        n.input.extend(rename(x) for x in inner.input)
        n.output.extend(rename(x) for x in inner.output)
        for a in inner.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name in attrs:
                    ref = AttributeProto()
                    ref.CopyFrom(attrs[a.ref_attr_name])
                    ref.name = a.name
                    n.attribute.append(ref)
            else:
                n.attribute.append(a)
                if a.type == AttributeProto.GRAPH:
                    _rename_graph(n.attribute[-1].g, rename)
        out.append(n)
    return out


def _rename_graph(graph: onnx.GraphProto, rename: Callable[[str], str]) -> None:
    """Rename every value of a body's subgraph (an If branch) as the body's own values are."""
    for value in (*graph.input, *graph.output):
        value.name = rename(value.name)
    for t in graph.initializer:
        t.name = rename(t.name)
    for n in graph.node:
        n.input[:] = [rename(x) for x in n.input]
        n.output[:] = [rename(x) for x in n.output]
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                _rename_graph(a.g, rename)


def _schema_defaults(node: NodeProto, opset: int) -> dict[str, AttributeProto]:
    schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    return {name: a.default_value for name, a in schema.attributes.items() if a.default_value.name}


def _body_opset(body: FunctionProto, fallback: int) -> int:
    return next((o.version for o in body.opset_import if o.domain in ("", "ai.onnx")), fallback)


def expand_functions(model: onnx.ModelProto, opset: int,
                     has_parser: Callable[[NodeProto], bool]) -> tuple[onnx.ModelProto, dict[str, int]]:
    """`model`, or a copy whose nodes no parser reads are their function bodies (see the
    module), and the opset of every node that came from a body, by node name. A node whose body
    needs an op that is neither parsed nor a function stays as it is (and is reported)."""
    if all(has_parser(n) or n.domain not in ("", "ai.onnx") for n in model.graph.node):
        return model, {}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    for k, node in enumerate(graph.node):
        node.name = node.name or f"{node.op_type}_{k}"
    types = _type_lookup(copy)
    opsets: dict[str, int] = {}

    def expand(node: NodeProto, node_opset: int, depth: int) -> list[NodeProto] | None:
        if has_parser(node):
            return [node]
        body = _function_body(node, node_opset, types) if depth < _MAX_DEPTH and node.domain in ("", "ai.onnx") else None
        if body is None:
            return None
        inner_opset = _body_opset(body, node_opset)
        out: list[NodeProto] = []
        for n in _instantiate(node, body, _schema_defaults(node, node_opset)):
            parts = expand(n, inner_opset, depth + 1)
            if parts is None:
                return None
            opsets.setdefault(n.name, inner_opset)
            out += parts
        return out

    nodes = []
    for node in graph.node:
        nodes += expand(node, opset, 0) or [node]
    del graph.node[:]
    graph.node.extend(nodes)
    return copy, opsets


def _type_lookup(model: onnx.ModelProto) -> Callable[[str], TypeProto | None]:
    """name -> its tensor type: declared where the graph declares it, else by shape inference
    (run once, on first need)."""
    graph = model.graph
    known = {v.name: v.type for v in (*graph.input, *graph.value_info, *graph.output)}
    for t in graph.initializer:
        known[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))
    inferred: dict[str, TypeProto] = {}

    def lookup(name: str) -> TypeProto | None:
        if name in known and known[name].tensor_type.elem_type:
            return known[name]
        if not inferred:
            try:
                done = onnx.shape_inference.infer_shapes(model)
                inferred.update({v.name: v.type for v in (*done.graph.value_info, *done.graph.output)})
            except Exception:  # noqa: BLE001  (a model inference cannot type keeps its nodes)
                pass
            inferred.setdefault("", TypeProto())
        return inferred.get(name)

    return lookup
