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


def weight_roles(graph: onnx.GraphProto) -> dict[str, tuple[str, onnx.NodeProto]]:
    """Map each initializer that feeds a weight slot to (kind, consuming node).

    Raises ValueError when one tensor feeds two different kinds of slot (it could not be
    regenerated with a single distribution) or is also read by a non-weight slot (then it is
    not just a parameter, and stripping it would change the model's meaning).
    """
    inits = {i.name for i in graph.initializer}
    roles: dict[str, tuple[str, onnx.NodeProto]] = {}
    other_uses: set[str] = set()
    for node in graph.node:
        for idx, name in enumerate(node.input):
            if name not in inits:
                continue
            kind = None
            if node.op_type == "Conv" and idx == 1:
                kind = "conv_weight"
            elif node.op_type == "Conv" and idx == 2:
                kind = "conv_bias"
            elif node.op_type == "BatchNormalization" and idx in _BN_KINDS:
                kind = _BN_KINDS[idx]
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


def strip(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return a copy of `model` without its weight initializers, recorded in metadata_props."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    roles = weight_roles(graph)
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
        if kind == "conv_weight":
            # Conv weight is [C_out, C_in/group, k...]: fan_in is per output channel.
            rec["fan_in"] = int(math.prod(init.dims[1:]))
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
