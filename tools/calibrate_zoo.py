"""Calibrate the weight scale of the zoo models (LSUV style) and store the gains next to them.

Why: random conv weights with a fixed scale either die out or blow up through a deep SiLU net
(YOLOv5s: N(0, 1/fan_in) leaves RMS 0.01 after 60 convs and every confidence at 0.500; gain 1.7
gives RMS 1e3 and saturated outputs), and ReLU nets with BN and residual sums drift too. So each
conv/gemm weight gets its own gain: layer by layer in graph order, run the model on a fixed
random input and divide the gain by the standard deviation of that layer's output (exact in one
step, since the layer's output is linear in its own weight, up to a tiny bias). Every
pre-activation of the calibrated model then has unit scale.

The gains depend on the generated weights, hence on `fusegraph.zoo._weights` and the seeds: rerun
this after changing either, and after tools/export_yolov5.py. Where they go:
  YOLOv5s graphs   a "gain" field in each conv_weight record of the file's strip metadata
  light models     fusegraph/zoo/models/light_calibration.json  {model: {tensor: gain}}
A batch variant NAME-bN of a zoo model NAME takes NAME's gains (see `batch_variant_gains`):
calibrate NAME first.

Needs onnxruntime: run with the project's venv,
    .venv/bin/python tools/calibrate_zoo.py [NAME ...]      (default: every zoo model)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fusegraph import zoo  # noqa: E402
from fusegraph.zoo import _params  # noqa: E402

INPUT_SEED = 0
SIG_DIGITS = 6  # gains are stored rounded; the stored numbers are what load() uses


def _final_consumer(graph: onnx.GraphProto, name: str) -> onnx.NodeProto:
    """The Conv/Gemm/MatMul a weight feeds, through the Reshape/Unsqueeze chain `_params` also follows."""
    for _ in range(8):
        uses = [n for n in graph.node if name in n.input]
        assert len(uses) == 1, (name, [n.op_type for n in uses])
        node = uses[0]
        if node.op_type in ("Conv", "Gemm", "MatMul"):
            return node
        name = node.output[0]
    raise AssertionError(f"no Conv/Gemm/MatMul behind {name}")


def _unit_gain_model(name: str) -> tuple[onnx.ModelProto, list[str]]:
    """The zoo model with all gains 1, and the names of its conv/gemm weights in graph order."""
    model = zoo._read(name)
    if zoo._entry(name).light:
        weights = [r.name for r in _params.param_records(model) if r.kind.endswith("_weight")]
        _params.randomize_params(model, model_seed=name, gains={})
    else:
        for prop in model.metadata_props:
            if prop.key == _params.STRIPPED_KEY:
                recs = json.loads(prop.value)
                for r in recs:
                    r.pop("gain", None)
                prop.value = json.dumps(recs, separators=(",", ":"))
        weights = [r.name for r in _params.stripped_records(model) if r.kind.endswith("_weight")]
        _params.restore_stripped(model, model_seed=name)
    order = {n.output[0]: i for i, n in enumerate(model.graph.node)}
    weights.sort(key=lambda w: order[_final_consumer(model.graph, w).output[0]])
    return model, weights


def _data_feeds(model: onnx.ModelProto, weights: set[str]) -> dict[str, np.ndarray]:
    """Fixed inputs: images U(0, 1); integer inputs (token ids, masks) within the range the
    model's metadata declares (`fusegraph.input_ranges`), else [0, 10)."""
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    ranges = json.loads(next((p.value for p in model.metadata_props if p.key == "fusegraph.input_ranges"), "{}"))
    rng = np.random.default_rng(INPUT_SEED)
    out = {}
    for inp in graph.input:
        if inp.name in inits or inp.name in weights:
            continue
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        if inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            out[inp.name] = rng.random(shape, dtype=np.float32)
        else:
            lo, hi = ranges.get(inp.name, (0, 10))
            dtype = helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
            out[inp.name] = rng.integers(lo, hi, shape).astype(dtype)
    return out


def calibrate(name: str, verbose: bool = True) -> dict[str, float]:
    """LSUV gains for every conv/gemm weight of zoo model `name`."""
    t0 = time.time()
    model, weights = _unit_gain_model(name)
    graph = model.graph
    wset = set(weights)
    base = {i.name: numpy_helper.to_array(i) for i in graph.initializer if i.name in wset}
    # Feed the weights as inputs, so one session serves every trial (no rebuild per layer).
    keep = [i for i in graph.initializer if i.name not in wset]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    listed = {i.name for i in graph.input}
    for w in weights:
        if w not in listed:
            graph.input.append(helper.make_tensor_value_info(w, onnx.TensorProto.FLOAT, list(base[w].shape)))
    layer_out = {w: _final_consumer(graph, w).output[0] for w in weights}
    existing = {o.name for o in graph.output}
    for w in weights:
        if layer_out[w] not in existing:
            graph.output.append(helper.make_tensor_value_info(layer_out[w], onnx.TensorProto.FLOAT, None))
            existing.add(layer_out[w])
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    data = _data_feeds(model, wset)
    gains = {w: 1.0 for w in weights}

    def feeds() -> dict[str, np.ndarray]:
        f = dict(data)
        f.update({w: base[w] * np.float32(gains[w]) for w in weights})
        return f

    for w in weights:
        (y,) = sess.run([layer_out[w]], feeds())
        std = float(y.std())
        if not np.isfinite(std) or std == 0.0:
            raise RuntimeError(f"{name}: output of {w} has std {std}")
        gains[w] = float(f"{gains[w] / std:.{SIG_DIGITS}g}")
    outs = sess.run(None, feeds())
    by_name = dict(zip([o.name for o in graph.output], outs))
    stds = [float(by_name[layer_out[w]].std()) for w in weights]
    if verbose:
        g = np.array(list(gains.values()))
        print(f"{name}: {len(weights)} layers, gains {g.min():.3g}..{g.max():.3g}, "
              f"layer output std after {min(stds):.3f}..{max(stds):.3f}, {time.time() - t0:.1f}s")
    return gains


def batch_variant_gains(name: str, base: str) -> dict[str, float]:
    """The gains of batch variant `name`, copied from its batch-1 graph `base`.

    LSUV gains are statistics of one layer's output over images from one distribution, which
    the batch does not change; calibrating the batch-32 graph itself would cost 32 times more.
    The two exports list the same weights in the same order (the same model, traced the same
    way), which is checked record by record (kind and shape) before the gains are copied.
    """
    def records(n: str) -> list[dict]:
        model = onnx.load(str(zoo.path(n)))
        return [r for r in json.loads(next(p.value for p in model.metadata_props if p.key == _params.STRIPPED_KEY))
                if r["kind"].endswith("_weight")]

    mine, theirs = records(name), records(base)
    if [(r["kind"], r["dims"]) for r in mine] != [(r["kind"], r["dims"]) for r in theirs]:
        raise RuntimeError(f"{name}: its weights do not match those of {base} one for one")
    print(f"{name}: {len(mine)} gains copied from {base}")
    return {a["name"]: b["gain"] for a, b in zip(mine, theirs)}


def store(name: str, gains: dict[str, float]) -> None:
    if zoo._entry(name).light:
        path = zoo.LIGHT_CALIBRATION
        table = json.loads(path.read_text()) if path.is_file() else {}
        table[name] = gains
        table = {k: table[k] for k in sorted(table)}
        path.write_text(json.dumps(table, indent=1, sort_keys=False) + "\n")
        zoo._light_gains.cache_clear()
    else:
        path = zoo.path(name)
        model = onnx.load(str(path))
        for prop in model.metadata_props:
            if prop.key == _params.STRIPPED_KEY:
                recs = json.loads(prop.value)
                for r in recs:
                    if r["name"] in gains:
                        r["gain"] = gains[r["name"]]
                prop.value = json.dumps(recs, separators=(",", ":"))
        onnx.save(model, str(path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="LSUV-calibrate the zoo's weight gains")
    ap.add_argument("names", nargs="*", help="zoo names (default: all)")
    args = ap.parse_args(argv)
    for name in args.names or zoo.names():
        base = name.rsplit("-b", 1)[0]
        if base != name and zoo.is_zoo_name(base) and not zoo._entry(name).light:
            store(name, batch_variant_gains(name, base))
        else:
            store(name, calibrate(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
