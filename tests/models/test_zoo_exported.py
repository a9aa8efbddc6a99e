"""The exported CNN and transformer zoo models (tools/export_models.py): each ships small and
stripped, loads to a valid model with calibrated weights, runs in ONNX Runtime to sane outputs
(finite, spread out, attention not collapsed onto one key) and is the same on every load; the
BERTs, too big to run in every test run, have their fused structure checked in every run."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import pytest
from onnx import helper

from fusegraph import parse_onnx, zoo
from fusegraph.driver.inputs import input_ranges, random_inputs
from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction, Program
from fusegraph.passes.pipeline import count_kernels, fuse
from tests.zoo_params import exported

ort = pytest.importorskip("onnxruntime")

#: name -> (inputs {name: shape}, output shape)
EXPORTED = {
    "resnet18": ({"input": [1, 3, 224, 224]}, (1, 1000)),
    "mobilenet_v3_large": ({"input": [1, 3, 224, 224]}, (1, 1000)),
    "convnext_tiny": ({"input": [1, 3, 224, 224]}, (1, 1000)),
    "efficientnet_b1": ({"input": [1, 3, 240, 240]}, (1, 1000)),
    "yolov8s": ({"images": [1, 3, 640, 640]}, (1, 84, 8400)),
    "unet_small": ({"input": [1, 3, 256, 256]}, (1, 2, 256, 256)),
    "sd_resblock": ({"sample": [1, 320, 32, 32], "temb": [1, 1280]}, (1, 320, 32, 32)),
    "vit_small_patch16_224": ({"input": [1, 3, 224, 224]}, (1, 1000)),
    "deit_small_patch16_224": ({"input": [1, 3, 224, 224]}, (1, 1000)),
    "swin_tiny_patch4_window7_224": ({"input": [1, 3, 224, 224]}, (1, 1000)),
    "bert_base": ({"input_ids": [1, 128], "attention_mask": [1, 128], "token_type_ids": [1, 128]},
                  (1, 128, 768)),
    "bert_base_s512": ({"input_ids": [1, 512], "attention_mask": [1, 512], "token_type_ids": [1, 512]},
                       (1, 512, 768)),
    "gpt2_2layer": ({"input_ids": [1, 128]}, (1, 128, 768)),
}
B32 = ["vit_small_patch16_224-b32", "deit_small_patch16_224-b32", "swin_tiny_patch4_window7_224-b32"]
_BERT_RANGES = {"input_ids": (0, 30522), "attention_mask": (0, 2), "token_type_ids": (0, 2)}
RANGES = {"bert_base": _BERT_RANGES, "bert_base_s512": _BERT_RANGES, "gpt2_2layer": {"input_ids": (0, 50257)}}
#: the zoo's BERT-base encoders (one model at two sequence lengths) and their sequences
BERT_SEQ = {"bert_base": 128, "bert_base_s512": 512}
BERT_LAYERS = 12


def test_names_list_the_exported_models_after_yolov5s():
    assert zoo.names()[4:4 + len(EXPORTED) + len(B32)] == list(EXPORTED) + B32


@pytest.mark.parametrize("name", B32)
def test_batch_variants_take_the_gains_of_their_batch_1_graph(name):
    def gains(n: str) -> list[float]:
        model = onnx.load(str(zoo.path(n)))
        recs = json.loads(next(p.value for p in model.metadata_props if p.key == "fusegraph.stripped_weights"))
        return [r["gain"] for r in recs if r["kind"].endswith("_weight")]

    assert gains(name) == gains(name[:-len("-b32")])
    (inp,) = onnx.load(str(zoo.path(name))).graph.input
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim] == [32, 3, 224, 224]


@pytest.mark.parametrize("name", list(EXPORTED) + B32)
def test_shipped_file_is_small_stripped_and_calibrated(name):
    path = zoo.path(name)
    assert path.stat().st_size < 3_000_000
    model = onnx.load(str(path))
    records = json.loads(next(p.value for p in model.metadata_props if p.key == "fusegraph.stripped_weights"))
    weights = [r for r in records if r["kind"].endswith("_weight")]
    assert weights and all(r["fan_in"] > 0 and 0.05 < r["gain"] < 20 for r in weights)
    # fixed shapes everywhere, outputs included
    assert all(d.HasField("dim_value") for v in [*model.graph.input, *model.graph.output]
               for d in v.type.tensor_type.shape.dim)
    # What stays is small: no kept tensor is a weight matrix in disguise.
    assert max((i.ByteSize() for i in model.graph.initializer), default=0) < 1_000_000


@pytest.fixture(scope="module")
def run():
    """Each model is loaded and run once per module (BERT alone generates 110M weights)."""
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            model = zoo.load(name)
            program = parse_onnx(model)
            inputs = random_inputs(program.input_shapes, 5, input_ranges(program))
            cache[name] = model, inputs, _ort_run(model, inputs), input_ranges(program)
        return cache[name]

    return get


def _ort_run(model: onnx.ModelProto, inputs: dict[str, np.ndarray], extra: list[str] = ()) -> dict:
    graph = model.graph
    for name in extra:
        graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    out = dict(zip(names, sess.run(None, inputs)))
    del graph.output[len(graph.output) - len(extra):]
    return out


@pytest.mark.parametrize("name", exported())
def test_loads_and_runs_to_sane_outputs(name, run):
    model, inputs, outs, _ = run(name)
    onnx.checker.check_model(model)
    shapes, out_shape = EXPORTED[name]
    assert {k: list(v.shape) for k, v in inputs.items()} == shapes
    (out,) = outs.values()
    assert out.shape == out_shape and np.isfinite(out).all()
    flat = out.reshape(-1)
    assert np.unique(flat).size > min(500, flat.size // 2)  # not collapsed to a few values
    assert flat.std() > 0.1 * np.abs(flat).mean()
    if name == "yolov8s":  # rows 0-3 box xywh in pixels, rows 4-83 class confidences
        conf = out[0, 4:]
        assert 0.5 < ((conf > 0.01) & (conf < 0.99)).mean() and conf.std() > 0.05
        assert out[0, :4].std() > 640 / 8
    # fp16 must not overflow: every output well inside its range (65504).
    assert np.abs(flat).max() < 1e4


@pytest.mark.parametrize("name", exported(list(RANGES)))
def test_token_inputs_lie_in_their_declared_ranges(name, run):
    _, inputs, _, ranges = run(name)
    assert ranges == RANGES[name]
    for k, (lo, hi) in RANGES[name].items():
        assert inputs[k].dtype == np.int64 and lo <= inputs[k].min() and inputs[k].max() < hi
        assert np.unique(inputs[k]).size > 1


@pytest.mark.parametrize("name", exported(["gpt2_2layer", "vit_small_patch16_224", "bert_base", "bert_base_s512"]))
def test_attention_is_not_degenerate(name, run):
    """Softmax rows neither one-hot (scores too large) nor uniform (scores too small)."""
    model, inputs, _, _ = run(name)
    softmaxes = [n.output[0] for n in model.graph.node if n.op_type == "Softmax"]
    outs = _ort_run(model, inputs, softmaxes)
    for s in softmaxes:
        p = outs[s]
        top = p.max(axis=-1)
        assert np.median(top) < 0.9, s  # not collapsed onto one key
        assert np.median(top) > 1.5 / p.shape[-1], s  # not uniform


def test_sd_resblock_normalizes_in_its_convolutions(run):
    """Each GroupNorm's statistics are one kernel; its normalization, affine and SiLU are
    computed by the convolution that reads it, the time embedding's SiLU and projection are one
    kernel, and its add is the first convolution's epilogue, the residual the second's: five
    kernels, none storing a normalized tensor."""
    fused = parse_onnx(zoo.load("sd_resblock"))
    fuse(fused)
    kernels = [i for i in fused.main if i.op.name == "fused"]
    names = [[s.op.name for s in k.op.module if s.op.name in ("row_moments", "convolution", "dot", "sigmoid")]
             for k in kernels]
    assert names == [["row_moments"], ["sigmoid", "dot"], ["sigmoid", "convolution"], ["row_moments"],
                     ["sigmoid", "convolution"]]
    assert all(k.shape.elements in (32, 320, 320 * 32 * 32) for k in kernels)


def _digest(model: onnx.ModelProto) -> str:
    h = hashlib.sha256()
    for init in sorted(model.graph.initializer, key=lambda i: i.name):
        h.update(init.SerializeToString(deterministic=True))
    return h.hexdigest()


@pytest.mark.parametrize("name", ["resnet18", "unet_small"])
def test_load_is_deterministic(name, run):
    first, _, _, _ = run(name)
    assert _digest(first) == _digest(zoo.load(name))


# The BERTs' structure, in every run: running BERT-base is what makes it a big model (tests above,
# gated), while generating its weights, parsing and fusing take a few seconds.


@pytest.fixture(scope="module", params=list(BERT_SEQ))
def bert(request) -> tuple[str, Program, Program]:
    """(name, parsed program, fused program) of each zoo BERT, once per module; a fixture
    parameter, so pytest runs one model's tests together and holds one model's weights at a time."""
    model = zoo.load(request.param)
    fused = parse_onnx(model)
    fuse(fused)
    return request.param, parse_onnx(model), fused


def _readers(program: Program, ins: Instruction) -> list[Instruction]:
    return [i for i in program.main if any(x is ins for x in i.inputs)]


def _param(program: Program, name: str) -> Instruction:
    return next(i for i in program.main if i.op.name == "@param" and i.op.attrs["name"] == name)


def _attention_kernels(program: Program) -> list[Instruction]:
    return [i for i in program.main if i.op.name == "fused" and any(s.op.name == "attention" for s in i.op.module)]


def test_bert_parses_at_its_sequence(bert):
    name, plain, _ = bert
    seq = BERT_SEQ[name]
    assert {k: (v.lens, v.dtype) for k, v in plain.input_shapes.items()} == \
        {k: ((1, seq), DType.int64) for k in _BERT_RANGES}
    assert plain.output_names == ["last_hidden_state"]
    assert plain.main.returns[0].shape.lens == (1, seq, 768)
    assert input_ranges(plain) == _BERT_RANGES


def test_bert_fuses_to_one_attention_kernel_per_layer(bert):
    """The kernel count of README's table whatever the sequence, and each layer's attention (scores,
    mask, softmax, weighted sum, head merge) one kernel reading the merged QKV product."""
    _, _, fused = bert
    assert count_kernels(fused) == 85
    # the embeddings: both lookups inside their sum's layernorm, no kernel of their own
    assert not [i for i in fused.main if i.op.name == "fused" and i.op.attrs["kernel"] == "gather"]
    assert "gather_add_layernorm" in {i.op.attrs["kernel"] for i in fused.main if i.op.name == "fused"}
    attention = _attention_kernels(fused)
    assert len(attention) == BERT_LAYERS
    for k in attention:
        assert [s.op.name for s in k.op.module].count("attention") == 1
        (qkv,) = [x for x in k.inputs if x.op.name == "fused"]
        assert qkv.shape.lens[-1] == 3 * 768
    # nothing runs outside a kernel
    assert {i.op.name for i in fused.main} <= {"@param", "@literal", "fused", "fused_output"}


def test_bert_mask_is_built_once_and_read_by_the_attention_kernels_alone(bert):
    """BERT turns the 0/1 mask into an additive one, (1 - m) * min, once for all layers. Parsed, that
    is one chain read by each layer's scores; fused, each attention kernel computes it from the raw
    [1, S] int64 mask (S values, no kernel or buffer of its own), and nothing else reads the mask."""
    name, plain, fused = bert
    seq = BERT_SEQ[name]
    chain = [_param(plain, "attention_mask")]
    while len(readers := _readers(plain, chain[-1])) == 1:
        chain.append(readers[0])
    assert chain[-1].op.name == "mul" and chain[-1].shape.lens == (1, 1, 1, seq)
    assert len(readers) == BERT_LAYERS
    assert _readers(fused, _param(fused, "attention_mask")) == _attention_kernels(fused)
