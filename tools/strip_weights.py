"""Strip the trainable weights out of an ONNX model so that it can ship as a small file.

Why: the model zoo (`fusegraph.zoo`) ships real model *graphs* (YOLOv5s exported from the
`yolov5` package) inside the repository, but the weights are random anyway (nothing may be
downloaded) and would make each file tens of megabytes. So the large parameter tensors are
removed and described in the model's `metadata_props`; `fusegraph.zoo.load` regenerates them
deterministically. Everything else (shape tensors, YOLO grids and anchor grids, scalars) stays
verbatim, because those values carry meaning that random numbers would destroy.

What counts as a weight, by the slot it feeds:
  Conv input 1                 -> conv_weight  (recorded with its fan_in = C_in/group * kH * kW)
  Conv input 2                 -> conv_bias
  BatchNormalization input 1-4 -> bn_scale, bn_bias, bn_mean, bn_var
  Gemm input 1 / 2             -> gemm_weight (fan_in from transB) / gemm_bias
  MatMul input 1, a matrix     -> gemm_weight  (fan_in = its first dimension: x @ W, W [in, out])
  Add of a vector to a MatMul whose weight is stripped -> gemm_bias (nn.Linear on 3-D input)
  LayerNormalization input 1/2 -> norm_scale, norm_bias
  Gather input 0, indices not constant -> embedding (a lookup table read by token ids)
  Mul by a non-scalar tensor   -> channel_scale, only with `layer_scales=True` (ConvNeXt's
                                  layer scale; elsewhere such a Mul may carry meaning, e.g. strides)
Tensors named in `keep` stay verbatim (a fixed-valued weight such as YOLOv8's DFL arange conv).
Everything not in a weight slot stays too: position tables, class tokens, relative position
biases and attention masks keep the values the export gave them.

The record is a JSON list under metadata key `STRIPPED_KEY`, one object per tensor:
  {"name": ..., "dims": [...], "dtype": "float32", "kind": "conv_weight", "fan_in": 27}

Only needs `onnx` and `numpy`; usable from the project's venv and from the export venv alike:
    python tools/strip_weights.py full.onnx stripped.onnx
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import onnx
from onnx import helper

#: metadata_props key holding the JSON list of stripped tensors (fusegraph.zoo reads it).
STRIPPED_KEY = "fusegraph.stripped_weights"

_BN_KINDS = {1: "bn_scale", 2: "bn_bias", 3: "bn_mean", 4: "bn_var"}


def _slot_kind(node: onnx.NodeProto, idx: int, dims: dict[str, list[int]], matmul_outs: set[str],
               layer_scales: bool) -> str | None:
    """The parameter kind of input `idx` of `node` (an initializer), or None for a non-weight slot."""
    op, name = node.op_type, node.input[idx]
    if op == "Conv" and idx in (1, 2):
        return "conv_weight" if idx == 1 else "conv_bias"
    if op == "BatchNormalization" and idx in _BN_KINDS:
        return _BN_KINDS[idx]
    if op == "Gemm" and idx in (1, 2):
        return "gemm_weight" if idx == 1 else "gemm_bias"
    if op == "MatMul" and idx == 1 and len(dims[name]) == 2:
        return "gemm_weight"
    if op == "Add" and len(dims[name]) == 1 and node.input[1 - idx] in matmul_outs:
        return "gemm_bias"
    if op == "LayerNormalization" and idx in (1, 2):
        return "norm_scale" if idx == 1 else "norm_bias"
    if op == "Gather" and idx == 0 and node.input[1] not in dims:
        return "embedding"
    if op == "Mul" and layer_scales and math.prod(dims[name]) > 1:
        return "channel_scale"
    return None


def _fan_in(kind: str, node: onnx.NodeProto, dims: list[int]) -> int | None:
    """Inputs per output of a weight: Conv [C_out, C_in/group, k...], Gemm by transB, MatMul [in, out]."""
    if kind == "conv_weight":
        return int(math.prod(dims[1:]))
    if kind == "gemm_weight":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0) if node.op_type == "Gemm" else 0
        return int(dims[1] if trans_b else dims[0])
    return None


def weight_roles(graph: onnx.GraphProto, keep: frozenset[str] = frozenset(),
                 layer_scales: bool = False) -> dict[str, tuple[str, onnx.NodeProto]]:
    """Map each float initializer that feeds a weight slot to (kind, consuming node).

    Raises ValueError when one tensor feeds two different kinds of slot (it could not be
    regenerated with a single distribution) or is also read by a non-weight slot (then it is
    not just a parameter, and stripping it would change the model's meaning).
    """
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
    dims = {i.name: list(i.dims) for i in graph.initializer}
    inits = {i.name for i in graph.initializer if i.data_type in floats and i.name not in keep}
    matmul_outs = {n.output[0] for n in graph.node
                   if n.op_type == "MatMul" and n.input[1] in inits and len(dims[n.input[1]]) == 2}
    roles: dict[str, tuple[str, onnx.NodeProto]] = {}
    other_uses: set[str] = set()
    for node in graph.node:
        for idx, name in enumerate(node.input):
            if name not in inits:
                continue
            kind = _slot_kind(node, idx, dims, matmul_outs, layer_scales)
            if kind is None:
                other_uses.add(name)
                continue
            if name in roles and roles[name][0] != kind:
                raise ValueError(f"initializer {name!r} feeds both {roles[name][0]} and {kind}")
            roles[name] = (kind, node)
    clash = sorted(other_uses & roles.keys())
    if clash:
        raise ValueError(f"initializers used both as weights and otherwise: {clash}")
    return roles


def strip(model: onnx.ModelProto, keep: frozenset[str] = frozenset(),
          layer_scales: bool = False) -> onnx.ModelProto:
    """Return a copy of `model` without its weight initializers, recorded in metadata_props."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    roles = weight_roles(graph, keep, layer_scales)
    records = []
    kept = []
    for init in graph.initializer:
        if init.name not in roles:
            kept.append(init)
            continue
        kind, node = roles[init.name]
        rec: dict[str, object] = {
            "name": init.name,
            "dims": list(init.dims),
            "dtype": helper.tensor_dtype_to_np_dtype(init.data_type).name,
            "kind": kind,
        }
        fan_in = _fan_in(kind, node, list(init.dims))
        if fan_in is not None:
            rec["fan_in"] = fan_in
        records.append(rec)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    # Older IR versions also list initializers as graph inputs; drop those entries too.
    stripped = {r["name"] for r in records}
    inputs = [i for i in graph.input if i.name not in stripped]
    del graph.input[:]
    graph.input.extend(inputs)
    props = [p for p in out.metadata_props if p.key != STRIPPED_KEY]
    del out.metadata_props[:]
    out.metadata_props.extend(props)
    out.metadata_props.add(key=STRIPPED_KEY, value=json.dumps(records, separators=(",", ":")))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    args = ap.parse_args(argv)
    model = onnx.load(args.src)
    stripped = strip(model)
    onnx.save(stripped, args.dst)
    n = len(json.loads(next(p.value for p in stripped.metadata_props if p.key == STRIPPED_KEY)))
    print(f"{args.dst}: stripped {n} tensors, {stripped.ByteSize()} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
