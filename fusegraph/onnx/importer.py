"""ONNX graph -> fusegraph Program.

Unsupported ops are all reported at once, before anything is built, so a user sees the whole
list of what a model needs; ops without a parser that ONNX defines as functions are read as
their bodies (`functions.py`). Input dimensions can be fixed by name (`--input-dim`); with all
shapes known, shape subgraphs fold to literals as the nodes are read.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import onnx
from onnx import numpy_helper

from fusegraph.errors import ParseError, UnsupportedOpError
from fusegraph.ir.program import Instruction, Program
from fusegraph.onnx import parsers  # noqa: F401  (registers the parsers)
from fusegraph.onnx.context import MIN_OPSET, PARSERS, ImportContext, Value, onnx_dtype, onnx_op, op_key, parses
from fusegraph.onnx.functions import expand_functions
from fusegraph.onnx.validate import validate_model
from fusegraph.onnx.loader import load_model
from fusegraph.onnx.structure import bind_input, is_element_of, output_returns
from fusegraph.ops.source import add_literal


def supported_onnx_ops() -> list[str]:
    return sorted(PARSERS)


def parse_onnx(source: "str | os.PathLike[str] | bytes | onnx.ModelProto",
               input_dims: Mapping[str, Sequence[int] | None] | None = None) -> Program:
    """Read an ONNX model (path, bytes, ModelProto or zoo name) into a Program.

    `input_dims` fixes the dimensions of named inputs, overriding what the model declares;
    dimensions the model leaves symbolic and that are not given default to 1, with a warning.
    """
    model = load_model(source)
    validate_model(model, input_dims)
    try:
        opset = _opset(model)
    except ParseError:
        _check_supported(model.graph)  # unsupported ops are reported first
        raise
    model, body_opsets = expand_functions(model, opset, parses)
    graph = model.graph
    _check_supported(graph)
    program = Program()
    module = program.main
    ctx = ImportContext(module, opset)
    dims = dict(input_dims or {})
    initializers = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    for value_info in inputs:
        ctx.values[value_info.name] = bind_input(module, value_info.name, value_info.type, dims)
    unknown = sorted(k for k in dims if not any(k == i.name or is_element_of(k, i.name) for i in inputs))
    if unknown:
        raise ParseError(f"--input-dim names unknown input(s) {', '.join(map(repr, unknown))}; "
                         f"the model's inputs are: {', '.join(i.name for i in inputs)}")
    for t in graph.initializer:
        try:
            array = numpy_helper.to_array(t)
        except Exception as e:
            raise ParseError(f"initializer {t.name!r}: cannot read its data ({e})") from None
        onnx_dtype(t.data_type, f"initializer {t.name!r}")
        ctx.values[t.name] = add_literal(module, array, origin=t.name)
    for k, node in enumerate(graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{k}"
        ctx.opset = body_opsets.get(node.name, opset)
        ctx.import_node(node)
    ctx.node = None
    returns: list[tuple[str, Instruction]] = []
    structure: dict[str, int | None] = {}
    for out in graph.output:
        if out.name not in ctx.values:
            raise ParseError(f"graph output {out.name!r} is not produced by any node")
        returns += output_returns(out.name, ctx.values[out.name], out.type, structure)
    module.set_returns([r for _, r in returns], [n for n, _ in returns])
    module.remove_dead_code()
    if structure:
        program.meta["structured_outputs"] = structure
    program.meta.update(opset=opset, producer=f"{model.producer_name} {model.producer_version}".strip())
    ranges = next((p.value for p in model.metadata_props if p.key == "fusegraph.input_ranges"), None)
    if ranges:  # the integer inputs' value ranges (see driver/inputs.input_ranges)
        program.meta["input_ranges"] = ranges
    return program


@onnx_op("If")
def parse_if(ctx: ImportContext, ins: list[Instruction | None]) -> list[Value]:
    """An If whose condition is known at import is the branch it takes, read in place."""
    node = ctx.node
    assert node is not None
    cond = ctx.require_const(ins[0], "the If condition").reshape(-1)
    if cond.size != 1:
        raise ctx.error(f"the condition must hold one value, got {cond.size}")
    branch = ctx.attr("then_branch" if bool(cond[0]) else "else_branch")
    if not isinstance(branch, onnx.GraphProto):
        raise ctx.error("missing attribute then_branch or else_branch")
    return ctx.read_graph(branch, [], node.name)


def _opset(model: onnx.ModelProto) -> int:
    versions = {o.domain: o.version for o in model.opset_import}
    opset = versions.get("", versions.get("ai.onnx", 0))
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise ParseError(f"model uses opset {opset}; fusegraph reads opsets {MIN_OPSET} to {newest}")
    return opset


def _branch_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The graph's nodes and those of its sub-graphs (If branches, loop and map bodies), which
    are read in place."""
    out = []
    for node in graph.node:
        out.append(node)
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                out += _branch_nodes(a.g)
    return out


def _check_supported(graph: onnx.GraphProto) -> None:
    bad: dict[str, list[str]] = {}
    for k, node in enumerate(_branch_nodes(graph)):
        op = op_key(node)
        if op not in PARSERS:
            bad.setdefault(op, []).append(node.name or f"{node.op_type}_{k}")
    if bad:
        lines = [f"  {op}: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''} ({len(names)} node{'s' * (len(names) > 1)})"
                 for op, names in sorted(bad.items())]
        raise UnsupportedOpError(f"{sum(map(len, bad.values()))} node(s) use unsupported ops:\n" + "\n".join(lines))
