"""ONNX graph -> fusegraph Program.

Unsupported ops are all reported at once, before anything is built, so a user sees the whole
list of what a model needs; ops without a parser that ONNX defines as functions are read as
their bodies (`functions.py`). Input dimensions can be fixed by name (`--input-dim`); with all
shapes known, shape subgraphs fold to literals as the nodes are read.
"""

from __future__ import annotations

import os
import warnings
from typing import Mapping, Sequence

import onnx
from onnx import numpy_helper

from fusegraph.errors import FusegraphError, ParseError, UnsupportedOpError
from fusegraph.ir.program import Instruction, Program
from fusegraph.ir.shape import Shape
from fusegraph.onnx import parsers  # noqa: F401  (registers the parsers)
from fusegraph.onnx.context import MIN_OPSET, PARSERS, ImportContext, onnx_dtype, onnx_op, op_key, parses
from fusegraph.onnx.functions import expand_functions
from fusegraph.onnx.validate import validate_model
from fusegraph.onnx.loader import load_model
from fusegraph.ops.source import add_literal, add_param



def supported_onnx_ops() -> list[str]:
    return sorted(PARSERS)


def parse_onnx(source: "str | os.PathLike[str] | bytes | onnx.ModelProto",
               input_dims: Mapping[str, Sequence[int]] | None = None) -> Program:
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
    unknown = sorted(set(dims) - {i.name for i in inputs})
    if unknown:
        raise ParseError(f"--input-dim names unknown input(s) {', '.join(map(repr, unknown))}; "
                         f"the model's inputs are: {', '.join(i.name for i in inputs)}")
    for value_info in inputs:
        ctx.values[value_info.name] = add_param(module, value_info.name, _input_shape(value_info, dims.get(value_info.name)))
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
        _import_node(ctx, node)
    ctx.node = None
    returns = []
    for out in graph.output:
        if out.name not in ctx.values:
            raise ParseError(f"graph output {out.name!r} is not produced by any node")
        returns.append(ctx.values[out.name])
    module.set_returns(returns, [o.name for o in graph.output])
    module.remove_dead_code()
    program.meta.update(opset=opset, producer=f"{model.producer_name} {model.producer_version}".strip())
    ranges = next((p.value for p in model.metadata_props if p.key == "fusegraph.input_ranges"), None)
    if ranges:  # the integer inputs' value ranges (see driver/inputs.input_ranges)
        program.meta["input_ranges"] = ranges
    return program


def _import_node(ctx: ImportContext, node: onnx.NodeProto) -> None:
    """Parse one node: its inputs from `ctx.values`, its outputs into them."""
    ctx.node = node
    args = []
    for name in node.input:
        if not name:
            args.append(None)
        elif name not in ctx.values:
            raise ParseError(f"{ctx.where}: input {name!r} is not produced by any earlier node or graph input")
        else:
            args.append(ctx.values[name])
    try:
        result = PARSERS[op_key(node)](ctx, args)
    except FusegraphError:
        raise
    except (ValueError, TypeError, IndexError, AssertionError) as e:
        raise ParseError(f"{ctx.where}: {e or type(e).__name__}") from None
    outs = result if isinstance(result, list) else [result]
    for name, ins in zip(node.output, outs):
        if name:
            ctx.values[name] = ins
    missing = [n for n in node.output[len(outs):] if n]
    if missing:
        raise ParseError(f"{ctx.where}: output(s) {', '.join(missing)} are not supported")


@onnx_op("If")
def parse_if(ctx: ImportContext, ins: list[Instruction | None]) -> list[Instruction]:
    """An If whose condition is known at import is the branch it takes, read in place."""
    node = ctx.node
    assert node is not None
    cond = ctx.require_const(ins[0], "the If condition").reshape(-1)
    if cond.size != 1:
        raise ctx.error(f"the condition must hold one value, got {cond.size}")
    branch = ctx.attr("then_branch" if bool(cond[0]) else "else_branch")
    if not isinstance(branch, onnx.GraphProto):
        raise ctx.error("missing attribute then_branch or else_branch")
    for t in branch.initializer:
        ctx.values[t.name] = ctx.literal(numpy_helper.to_array(t))
    for k, inner in enumerate(branch.node):
        inner.name = f"{node.name}/{inner.name or inner.op_type + '_' + str(k)}"
        _import_node(ctx, inner)
    ctx.node = node
    missing = [o.name for o in branch.output if o.name not in ctx.values]
    if missing:
        raise ctx.error(f"branch output(s) {', '.join(missing)} are not produced")
    return [ctx.values[o.name] for o in branch.output]


def _opset(model: onnx.ModelProto) -> int:
    versions = {o.domain: o.version for o in model.opset_import}
    opset = versions.get("", versions.get("ai.onnx", 0))
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise ParseError(f"model uses opset {opset}; fusegraph reads opsets {MIN_OPSET} to {newest}")
    return opset


def _branch_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The graph's nodes and those of every If branch in it, which are read in place."""
    out = []
    for node in graph.node:
        out.append(node)
        if node.op_type == "If" and node.domain in ("", "ai.onnx"):
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


def _input_shape(value_info: onnx.ValueInfoProto, override: Sequence[int] | None) -> Shape:
    name = value_info.name
    tt = value_info.type.tensor_type
    if not value_info.type.HasField("tensor_type"):
        raise ParseError(f"input {name!r}: only tensor inputs are supported")
    dtype = onnx_dtype(tt.elem_type, f"input {name!r}")
    declared = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    if override is not None:
        lens = [int(d) for d in override]
        if tt.HasField("shape") and len(lens) != len(declared):
            raise ParseError(f"input {name!r}: --input-dim gives rank {len(lens)} but the model declares rank {len(declared)}")
        if any(d < 0 for d in lens):  # 0 is allowed: an empty tensor
            raise ParseError(f"input {name!r}: dimensions must be non-negative, got {lens}")
        return Shape.of(dtype, lens)
    if any(d is None or d <= 0 for d in declared):
        fixed = [d if d and d > 0 else 1 for d in declared]
        warnings.warn(f"input {name!r} has symbolic dimensions; using {fixed} (set them with --input-dim)", stacklevel=3)
        return Shape.of(dtype, fixed)
    return Shape.of(dtype, declared)  # type: ignore[arg-type]
