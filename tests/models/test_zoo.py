"""Tests of the model zoo: every model loads, is valid ONNX, runs in ONNX Runtime with sane
(finite, non-degenerate) outputs, and is the same on every load."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import pytest

from fusegraph import zoo
from fusegraph.errors import FusegraphError, ModelLoadError

ort = pytest.importorskip("onnxruntime")

YOLO = {  # name -> (image size, BatchNormalization nodes)
    "yolov5s": (640, 0),
    "yolov5s-160": (160, 0),
    "yolov5s-bn": (640, 57),
    "yolov5s-bn-160": (160, 57),
}
LIGHT = [
    "light_bvlc_alexnet", "light_densenet121", "light_inception_v1", "light_inception_v2",
    "light_resnet50", "light_shufflenet", "light_squeezenet", "light_vgg19", "light_zfnet512",
]


@pytest.fixture(scope="module")
def loaded():
    """Each model is loaded once per module: VGG-19 alone has 140M weights to generate."""
    cache: dict[str, onnx.ModelProto] = {}

    def get(name: str) -> onnx.ModelProto:
        if name not in cache:
            cache[name] = zoo.load(name)
        return cache[name]

    return get


def _data_input(model: onnx.ModelProto) -> onnx.ValueInfoProto:
    inits = {i.name for i in model.graph.initializer}
    (inp,) = [i for i in model.graph.input if i.name not in inits]
    return inp


def _run(model: onnx.ModelProto) -> tuple[str, np.ndarray, list[np.ndarray]]:
    inp = _data_input(model)
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    # Images in [0, 1], the domain YOLOv5 expects (and the one the gains were calibrated on).
    x = np.random.default_rng(123).random(shape, dtype=np.float32)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # the light resnet50/zfnet512 carry one unused blob ORT warns about
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return inp.name, x, sess.run(None, {inp.name: x})


def _weights_digest(model: onnx.ModelProto) -> str:
    h = hashlib.sha256()
    for init in sorted(model.graph.initializer, key=lambda i: i.name):
        h.update(init.SerializeToString(deterministic=True))
    return h.hexdigest()


def test_names():
    names = zoo.names()
    assert names[:4] == list(YOLO)
    # then the exported CNNs and transformers (tests/models/test_zoo_exported.py), then light
    assert sorted(n for n in names if n.startswith("light_")) == LIGHT
    assert names[-len(LIGHT):] == [n for n in names if n.startswith("light_")]
    assert len(set(names)) == len(names)
    assert all(zoo.is_zoo_name(n) for n in names)
    assert not zoo.is_zoo_name("yolov5s.onnx")
    assert not zoo.is_zoo_name("")


@pytest.mark.parametrize("name", ["yolov5x", "light_resnet", "YOLOv5s", "model.onnx"])
def test_unknown_name_lists_the_options(name):
    with pytest.raises(ModelLoadError) as info:
        zoo.load(name)
    msg = str(info.value)
    assert repr(name) in msg
    for known in zoo.names():
        assert known in msg
    assert isinstance(info.value, FusegraphError)
    with pytest.raises(ModelLoadError):
        zoo.describe(name)


@pytest.mark.parametrize("name", list(YOLO) + LIGHT)
def test_describe_is_one_line(name):
    text = zoo.describe(name)
    assert text.startswith(f"{name}: ")
    assert "\n" not in text
    assert "->" in text


def test_light_models_come_from_the_onnx_package():
    import pathlib

    onnx_dir = pathlib.Path(onnx.__file__).resolve().parent
    for name in LIGHT:
        assert zoo.path(name).is_relative_to(onnx_dir)


@pytest.mark.parametrize("name", list(YOLO))
def test_shipped_yolo_files_are_small_and_stripped(name):
    path = zoo.path(name)
    assert path.stat().st_size < 3_000_000
    model = onnx.load(str(path))
    assert not any(i.name.endswith(".weight") for i in model.graph.initializer)
    records = json.loads(next(p.value for p in model.metadata_props if p.key == "fusegraph.stripped_weights"))
    weights = [r for r in records if r["kind"] == "conv_weight"]
    assert len(weights) == 60
    # Every conv weight carries its calibrated gain (tools/calibrate_zoo.py must follow any re-export).
    assert all(r["fan_in"] > 0 and 0.1 < r["gain"] < 10 for r in weights)


# VGG-19 carries 143M weights (0.5 GB): a few seconds to generate, check and run. Marked slow so
# a quick run can leave it out with -m "not slow"; it runs by default.
ALL = list(YOLO) + [pytest.param(n, marks=pytest.mark.slow) if n == "light_vgg19" else n for n in LIGHT]


@pytest.mark.parametrize("name", ALL)
def test_loads_checks_and_runs(name, loaded):
    model = loaded(name)
    onnx.checker.check_model(model)
    assert not any(n.op_type == "ConstantOfShape" for n in model.graph.node)  # light weights materialized
    _, _, outs = _run(model)
    for out in outs:
        assert np.isfinite(out).all()
    out = outs[0]
    if name in YOLO:
        size, n_bn = YOLO[name]
        assert sum(n.op_type == "BatchNormalization" for n in model.graph.node) == n_bn
        assert len(outs) == 1
        assert out.shape == (1, 3 * sum((size // s) ** 2 for s in (8, 16, 32)), 85)
        xy, wh, conf = out[0, :, :2], out[0, :, 2:4], out[0, :, 4:]
        # xy = (2 * sigmoid + grid - 0.5) * stride, grid 0..size/stride-1, stride up to 32
        assert -16 <= xy.min() and xy.max() <= size + 48 and xy.std() > size / 8
        assert (wh >= 0).all() and wh.std() > 1.0
        # Confidences neither collapsed to 0.5 (weights too small) nor saturated at 0/1 (too large).
        assert conf.std() > 0.05
        assert 0.5 < ((conf > 0.01) & (conf < 0.99)).mean()
    else:
        flat = out.reshape(-1)
        assert flat.size == 1000
        assert np.unique(flat).size > 500  # constant weights would make every class equal
        assert flat.std() > 0.1 * np.abs(flat).mean()


@pytest.mark.parametrize("name", ALL)
def test_load_is_deterministic(name, loaded):
    first = loaded(name)  # cached copy from an earlier load
    again = zoo.load(name)
    assert _weights_digest(first) == _weights_digest(again)
    assert first.graph.node == again.graph.node


def test_weights_differ_between_models(loaded):
    a = {i.name: i.raw_data[:64] for i in loaded("yolov5s-160").graph.initializer}
    b = {i.name: i.raw_data[:64] for i in loaded("yolov5s").graph.initializer}
    shared = a.keys() & b.keys()
    assert len(shared) == 120  # same export, same tensor names...
    assert sum(a[k] != b[k] for k in shared) == len(shared)  # ...but each name has its own seed


def test_load_returns_a_fresh_model():
    first = zoo.load("yolov5s-160")
    first.graph.node[0].op_type = "Mutated"
    assert zoo.load("yolov5s-160").graph.node[0].op_type == "Conv"
