"""Find the parameter tensors of a model and (re)generate them.

Two kinds of model come through here:

* Stripped zoo graphs (YOLOv5s): tools/strip_weights.py removed the weights and listed them
  in metadata_props under `STRIPPED_KEY`; `restore_stripped` puts generated ones back.
* The "light" models shipped inside the onnx package (onnx/backend/test/data/light). Their large
  tensors were replaced upstream by `ConstantOfShape(value=0.02)` of a shape initializer, the small
  ones kept as trained values. Constant weights make every channel identical (all 1000 logits
  equal, a uniform softmax), which would hide layout bugs in a compiler and make outputs
  degenerate; mixing trained small tensors with fake large ones gives arbitrary scales. So
  `randomize_params` regenerates EVERY parameter slot (conv/gemm weight and bias, BN parameters,
  the caffe2-style per-channel Mul/Add after BN), turning each ConstantOfShape weight into an
  initializer. Everything else (shape tensors, unused blobs) is left alone.

Roles are found from the slot a tensor finally feeds, following single-consumer chains of
Reshape (with a constant shape) and Unsqueeze, because some light models reshape a flat weight
before a Gemm or unsqueeze a per-channel vector before a Mul.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import _weights

#: metadata_props key written by tools/strip_weights.py (keep the two in step).
STRIPPED_KEY = "fusegraph.stripped_weights"

_BN_KINDS = {1: "bn_scale", 2: "bn_bias", 3: "bn_mean", 4: "bn_var"}


@dataclass(frozen=True)
class ParamRecord:
    """One parameter tensor to generate: where it goes, its shape, kind and fan-in."""

    name: str
    dims: tuple[int, ...]
    kind: str
    fan_in: int | None = None
    dtype: str = "float32"
    gain: float = 1.0


def generate(rec: ParamRecord, model_seed: str) -> np.ndarray:
    return _weights.make(rec.kind, rec.dims, model_seed=model_seed, tensor_name=rec.name,
                         fan_in=rec.fan_in, gain=rec.gain, dtype=rec.dtype)


# --- stripped graphs -------------------------------------------------------------------------

def stripped_records(model: onnx.ModelProto) -> list[ParamRecord]:
    """The records tools/strip_weights.py left in the model's metadata (empty if none)."""
    for prop in model.metadata_props:
        if prop.key == STRIPPED_KEY:
            return [
                ParamRecord(name=r["name"], dims=tuple(r["dims"]), kind=r["kind"],
                            fan_in=r.get("fan_in"), dtype=r.get("dtype", "float32"),
                            gain=float(r.get("gain", 1.0)))
                for r in json.loads(prop.value)
            ]
    return []


def restore_stripped(model: onnx.ModelProto, model_seed: str) -> onnx.ModelProto:
    """Put generated weights back into a stripped graph, in place; drops the strip record."""
    records = stripped_records(model)
    present = {i.name for i in model.graph.initializer}
    for rec in records:
        if rec.name not in present:
            _add_initializer(model.graph, rec.name, generate(rec, model_seed))
    _drop_metadata(model, STRIPPED_KEY)
    return model


# --- light models: find and regenerate every parameter slot ----------------------------------

def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    out: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for idx, name in enumerate(node.input):
            if name:
                out.setdefault(name, []).append((node, idx))
    return out


def _reshape_target(shape: list[int], target: np.ndarray) -> list[int] | None:
    dims = [int(t) if int(t) != 0 else shape[i] for i, t in enumerate(target)]
    if dims.count(-1) == 1:
        known = math.prod(d for d in dims if d != -1)
        dims[dims.index(-1)] = math.prod(shape) // known if known else 0
    return dims if math.prod(dims) == math.prod(shape) else None


def _role(name: str, dims: list[int], graph: onnx.GraphProto, consts: dict[str, np.ndarray],
          consumers: dict[str, list[tuple[onnx.NodeProto, int]]]) -> tuple[str, int | None] | None:
    """(kind, fan_in) of the slot that tensor `name` of shape `dims` ends up in, or None."""
    shape = list(dims)
    for _ in range(8):  # follow at most a few views
        uses = consumers.get(name, [])
        if len(uses) != 1:
            return None
        node, idx = uses[0]
        op = node.op_type
        if op == "Conv" and idx == 1:
            return "conv_weight", math.prod(shape[1:])
        if op == "Conv" and idx == 2:
            return "conv_bias", None
        if op == "Gemm" and idx == 1:
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            return "gemm_weight", shape[1] if trans_b else shape[0]
        if op == "Gemm" and idx == 2:
            return "gemm_bias", None
        if op == "BatchNormalization" and idx in _BN_KINDS:
            return _BN_KINDS[idx], None
        if op == "Mul":
            return "channel_scale", None
        if op == "Add":
            return "channel_shift", None
        if op == "Reshape" and idx == 0 and node.input[1] in consts:
            new = _reshape_target(shape, consts[node.input[1]].ravel())
            if new is None:
                return None
            shape, name = new, node.output[0]
        elif op == "Unsqueeze" and idx == 0:
            axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
            if axes is None and len(node.input) > 1 and node.input[1] in consts:
                axes = [int(a) for a in consts[node.input[1]].ravel()]
            if axes is None:
                return None
            rank = len(shape) + len(axes)
            for ax in sorted(a % rank for a in axes):
                shape.insert(ax, 1)
            name = node.output[0]
        else:
            return None
    return None


def param_records(model: onnx.ModelProto) -> list[ParamRecord]:
    """Every float tensor (initializer or ConstantOfShape of a constant shape) in a parameter slot."""
    graph = model.graph
    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    consumers = _consumers(graph)
    records = []
    candidates: list[tuple[str, list[int], str]] = []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in consts:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            dtype = helper.tensor_dtype_to_np_dtype(value.data_type).name if value is not None else "float32"
            candidates.append((node.output[0], [int(d) for d in consts[node.input[0]]], dtype))
    for init in graph.initializer:
        if init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE):
            candidates.append((init.name, list(init.dims),
                               helper.tensor_dtype_to_np_dtype(init.data_type).name))
    for name, dims, dtype in candidates:
        role = _role(name, dims, graph, consts, consumers)
        if role is not None:
            records.append(ParamRecord(name=name, dims=tuple(dims), kind=role[0], fan_in=role[1], dtype=dtype))
    return records


def randomize_params(model: onnx.ModelProto, model_seed: str,
                     gains: dict[str, float] | None = None) -> onnx.ModelProto:
    """Regenerate every parameter of `model` in place (see the module docstring)."""
    graph = model.graph
    gains = gains or {}
    records = {r.name: r for r in param_records(model)}
    arrays = {}
    for name, rec in records.items():
        if name in gains:
            rec = ParamRecord(rec.name, rec.dims, rec.kind, rec.fan_in, rec.dtype, gains[name])
        arrays[name] = generate(rec, model_seed)

    # Initializers that are parameters: new values, same name and place.
    for init in graph.initializer:
        if init.name in arrays:
            _fill_tensor(init, init.name, arrays.pop(init.name))

    # ConstantOfShape parameters: drop the node, the value becomes an initializer.
    shape_inputs = []
    nodes = []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.output[0] in arrays:
            shape_inputs.append((node.input[0], node.output[0]))
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    still_used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    dead = {shape: out for shape, out in shape_inputs if shape not in still_used}
    for idx in reversed(range(len(graph.initializer))):  # in place: no copy of the big tensors
        if graph.initializer[idx].name in dead:
            del graph.initializer[idx]
    for _, out in shape_inputs:
        _add_initializer(graph, out, arrays[out])

    # IR < 4 lists every initializer as a graph input too: the new weight takes the place of the
    # shape tensor it replaces, so the input list stays in the same order.
    listed = {i.name for i in graph.input}
    if dead.keys() & listed or model.ir_version < 4:
        new_inputs = []
        for inp in graph.input:
            if inp.name in dead:
                out = dead[inp.name]
                arr = arrays[out]
                new_inputs.append(helper.make_tensor_value_info(
                    out, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
            else:
                new_inputs.append(inp)
        have = {i.name for i in new_inputs}
        if model.ir_version < 4:
            for _, out in shape_inputs:
                if out not in have:
                    arr = arrays[out]
                    new_inputs.append(helper.make_tensor_value_info(
                        out, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
        del graph.input[:]
        graph.input.extend(new_inputs)
    return model


def _fill_tensor(tensor: onnx.TensorProto, name: str, arr: np.ndarray) -> None:
    """Write `arr` into `tensor` as raw little-endian data (one copy; from_array + append make three)."""
    tensor.Clear()
    tensor.name = name
    tensor.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
    tensor.dims.extend(arr.shape)
    tensor.raw_data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def _add_initializer(graph: onnx.GraphProto, name: str, arr: np.ndarray) -> None:
    _fill_tensor(graph.initializer.add(), name, arr)


def _drop_metadata(model: onnx.ModelProto, key: str) -> None:
    props = [p for p in model.metadata_props if p.key != key]
    del model.metadata_props[:]
    model.metadata_props.extend(props)
