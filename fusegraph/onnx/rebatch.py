"""Re-batching an ONNX model exported for batch 1, or with a symbolic batch dimension.

fusegraph compiles for fixed shapes, so a model runs `batch` samples at once only once its
batch dimension is that number everywhere it is written down: the graph's inputs and outputs,
and the Reshape targets an exporter wrote with the traced batch of 1 as a literal (YOLOv5's head
reshapes to [1, 3, 85, 80, 80]; Swin's window partitions assemble theirs by a Concat that starts
with the literal [1]), and the values that join the batch without coming from it: a
vision transformer's class token, expanded to the traced batch of 1 and concatenated with the
patch tokens, is broadcast to the batch before its Concat. The batch dimension is the first one
of every input whose first dimension is 1 or symbolic, as MIGraphX's `--batch` takes it.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from fusegraph.errors import ArgumentError


def batched_inputs(model: onnx.ModelProto) -> list[str]:
    """The graph inputs whose first dimension is 1 or symbolic: those `with_batch` re-batches."""
    initializers = {t.name for t in model.graph.initializer}
    return [v.name for v in model.graph.input if v.name not in initializers and _batchable(v)]


def with_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """A copy of `model` that runs `batch` samples; an ArgumentError when no input has a batch
    dimension of 1 or a symbolic one."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ArgumentError(f"batch must be a positive integer, got {batch!r}")
    names = batched_inputs(model)
    if not names:
        shown = ", ".join(f"{v.name} {_dims(v)}" for v in model.graph.input)
        raise ArgumentError(f"batch={batch}: no input has a first dimension of 1 or a symbolic one to re-batch "
                            f"(the inputs: {shown or 'none'})")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    for value in graph.input:
        if value.name in names:
            _set_first(value, batch)
    for value in graph.output:
        if _batchable(value):
            _set_first(value, batch)
    del graph.value_info[:]  # intermediate shapes recorded at batch 1 would now be wrong
    taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output} | {v.name for v in graph.input}
    dependent = _dependent(graph, set(names))
    _rebatch_reshapes(graph, dependent, batch, taken)
    _broadcast_concat_inputs(graph, dependent, lambda: _ranks(model), batch, taken)
    return out


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    """The rank ONNX's shape inference finds for each value of the model it can, inferred on
    the graph without its weights' data (a copy of BERT-base's weights alone takes seconds)."""
    weights = [onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in model.graph.initializer]
    graph = onnx.helper.make_graph(model.graph.node, "ranks", [*model.graph.input, *weights], model.graph.output)
    try:
        inferred = onnx.shape_inference.infer_shapes(
            onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)).graph
    except Exception:  # noqa: BLE001 - a model the checker refuses: the importer reports its faults
        inferred = graph
    return {v.name: len(v.type.tensor_type.shape.dim) for v in [*inferred.value_info, *inferred.input, *inferred.output]
            if v.type.tensor_type.HasField("shape")}


def _dependent(graph: onnx.GraphProto, batched: set[str]) -> set[str]:
    """The values computed from the batched inputs (the graph's nodes are in dataflow order)."""
    dependent = set(batched)
    for node in graph.node:
        if any(i in dependent for i in node.input):
            dependent.update(node.output)
    return dependent


def _rebatch_reshapes(graph: onnx.GraphProto, dependent: set[str], batch: int, taken: set[str]) -> None:
    """Give `batch` to each Reshape target that starts with a literal 1 and reshapes a value
    computed from a batched input (a reshape of weights keeps its 1): a constant target, or one
    an exporter assembles by a Concat whose first part is the constant [1] and whose others
    come from shapes (Swin's window partitions). The new first dimension is a fresh
    initializer, so a constant shared with other nodes is left as it was."""
    constants = {t.name: t for t in graph.initializer}
    constants.update({n.output[0]: n.attribute[0].t for n in graph.node
                      if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    for node in graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2 or node.input[0] not in dependent:
            continue
        holder, slot = node, 1  # the node input that holds the target's first part
        concat = producer.get(node.input[1])
        if node.input[1] not in constants:
            if concat is None or concat.op_type != "Concat" or readers.get(node.input[1], 0) != 1 or not concat.input:
                continue
            holder, slot = concat, 0
        if holder.input[slot] not in constants:
            continue
        dims = numpy_helper.to_array(constants[holder.input[slot]]).copy()
        if dims.ndim != 1 or not dims.size or dims[0] != 1 or (holder is concat and dims.size != 1):
            continue
        dims[0] = batch
        name = _fresh(f"{holder.input[slot]}_batch{batch}", taken)
        graph.initializer.append(numpy_helper.from_array(dims, name))
        holder.input[slot] = name


def _broadcast_concat_inputs(graph: onnx.GraphProto, dependent: set[str], ranks_of: Callable[[], dict[str, int]],
                             batch: int, taken: set[str]) -> None:
    """Broadcast to `batch` each input of a Concat (along another axis than the batch's) that
    does not come from the batched inputs but is concatenated with one that does: a class token
    joining its patch tokens. Its first dimension is the traced batch's 1, since the Concat
    held at that batch. The ranks (`ranks_of`) are inferred only for a model that has such a Concat."""
    mixed = [n for n in graph.node if n.op_type == "Concat" and {i in dependent for i in n.input} == {True, False}]
    if not mixed:
        return
    ranks = ranks_of()
    nodes = list(graph.node)
    del graph.node[:]
    for node in nodes:
        if any(node is n for n in mixed):
            rank = max((ranks.get(i, 0) for i in node.input), default=0)
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            for k, name in enumerate(node.input):
                if rank and axis % rank and name not in dependent:
                    target = _fresh(f"{name}_batch{batch}_shape", taken)
                    graph.initializer.append(numpy_helper.from_array(np.array([batch] + [1] * (rank - 1), np.int64), target))
                    expanded = _fresh(f"{name}_batch{batch}", taken)
                    graph.node.append(onnx.helper.make_node("Expand", [name, target], [expanded],
                                                            name=_fresh(f"{node.name}_broadcast{k}", taken)))
                    node.input[k] = expanded
        graph.node.append(node)


def _fresh(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    taken.add(out)
    return out


def _batchable(value: onnx.ValueInfoProto) -> bool:
    dims = value.type.tensor_type.shape.dim
    if not value.type.tensor_type.HasField("shape") or not dims:
        return False
    first = dims[0]
    return not first.HasField("dim_value") or first.dim_value in (0, 1)


def _set_first(value: onnx.ValueInfoProto, batch: int) -> None:
    first = value.type.tensor_type.shape.dim[0]
    first.Clear()
    first.dim_value = batch


def _dims(value: onnx.ValueInfoProto) -> list[object]:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in value.type.tensor_type.shape.dim]
