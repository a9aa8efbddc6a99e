"""tools/strip_weights.py on transformer-style graphs: which tensors it strips, as what kind and
fan-in, what it keeps, and that the zoo's loader puts runnable weights back."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from strip_weights import STRIPPED_KEY, strip  # noqa: E402

from fusegraph.zoo import _params  # noqa: E402
from tests.helpers import ort_run  # noqa: E402


def _model():
    """ids -> embedding -> LayerNorm -> x @ W + b -> * scale * pos: one of each slot."""
    rng = np.random.default_rng(0)
    inits = {"emb": rng.random((11, 4)), "ln_w": rng.random(4), "ln_b": rng.random(4),
             "W": rng.random((4, 6)), "b": rng.random(6), "scale": rng.random(6), "pos": rng.random((3, 6))}
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "ids"], ["e"]),
         helper.make_node("LayerNormalization", ["e", "ln_w", "ln_b"], ["n"], axis=-1),
         helper.make_node("MatMul", ["n", "W"], ["mm"]),
         helper.make_node("Add", ["b", "mm"], ["lin"]),
         helper.make_node("Mul", ["lin", "scale"], ["s"]),
         helper.make_node("Add", ["s", "pos"], ["y"])],
        "t", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 6])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _records(model) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads(next(p.value for p in model.metadata_props if p.key == STRIPPED_KEY))}


def test_each_weight_slot_is_stripped_as_its_kind():
    stripped = strip(_model())
    recs = _records(stripped)
    assert {k: r["kind"] for k, r in recs.items()} == {
        "emb": "embedding", "ln_w": "norm_scale", "ln_b": "norm_bias", "W": "gemm_weight", "b": "gemm_bias"}
    assert recs["W"]["fan_in"] == 4  # x @ W with W [in, out]
    # a Mul by a tensor and a position table carry meaning: kept verbatim
    assert sorted(i.name for i in stripped.graph.initializer) == ["pos", "scale"]


def test_layer_scales_and_keep():
    recs = _records(strip(_model(), keep=frozenset({"W"}), layer_scales=True))
    assert recs["scale"]["kind"] == "channel_scale" and "W" not in recs


def test_restored_model_runs():
    model = strip(_model())
    _params.restore_stripped(model, model_seed="t")
    (y,) = ort_run(model, {"ids": np.array([[0, 5, 10]], np.int64)})
    assert y.shape == (1, 3, 6) and np.isfinite(y).all() and y.std() > 0.1


def test_a_tensor_in_a_weight_slot_and_elsewhere_is_refused():
    model = _model()
    model.graph.node.append(helper.make_node("Add", ["W", "W"], ["w2"]))
    model.graph.output.append(helper.make_tensor_value_info("w2", TensorProto.FLOAT, [4, 6]))
    with pytest.raises(ValueError, match="both as weights and otherwise"):
        strip(model)
