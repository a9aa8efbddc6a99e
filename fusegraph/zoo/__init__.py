"""A small zoo of real models with deterministic random weights, loadable by name.

Why: tests, benchmarks and the command line need real graphs (YOLOv5s, ResNet-50, ...) without
downloading anything. The zoo gives them by name, always the same bytes for the same name:

    yolov5s, yolov5s-160          YOLOv5s at 640x640 / 160x160, BatchNormalization folded into the
                                  convs, exactly as the yolov5 package exports it (opset 17)
    yolov5s-bn, yolov5s-bn-160    the same with BatchNormalization nodes left in (exercises BN folding)
    resnet18, mobilenet_v3_large, convnext_tiny   torchvision 0.28.0, 224x224
    efficientnet_b1               timm 1.0.31, 240x240
    yolov8s                       ultralytics 8.4.190 yolov8s.yaml, 640x640, BN folded, output [1,84,8400]
    unet_small                    a 9-conv U-Net (max-pool down, nearest upsample + concat up), 256x256
    sd_resblock                   a Stable Diffusion UNet residual block (GroupNorm(32) + SiLU + 3x3 conv,
                                  twice, a time embedding, the residual): 320 channels, 32x32,
                                  inputs sample [1,320,32,32] and temb [1,1280]
    vit_small_patch16_224, deit_small_patch16_224, swin_tiny_patch4_window7_224   timm 1.0.31, 224x224
    bert_base                     transformers 4.57.6 BertModel (BERT-base config), sequence 128,
                                  int64 inputs input_ids, attention_mask, token_type_ids
    bert_base_s512                the same BertModel at sequence 512 (its longest: 512 positions)
    gpt2_2layer                   transformers 4.57.6 GPT2Model, 2 blocks, causal, sequence 128
    <vit/deit/swin>-b32           the three vision transformers at batch 32 (their batch-1 exports
                                  fold the batch into constants, so they cannot be rebatched)
    light_<model>                 the nine "light" models inside the installed onnx package
                                  (onnx/backend/test/data/light; opset 9, IR version 3)

All but the light models: batch 1 unless named -b32, fp32, fixed shapes, opset 17 (torch 2.13's
legacy exporter), outputs as the library returns them (logits, or last_hidden_state).

The YOLOv5s graphs ship under fusegraph/zoo/models/ without their weights (made and stripped by
tools/export_yolov5.py), and so do the others (tools/export_models.py); the light models are
read straight from the onnx package. `load` (re)generates every weight from a seed derived from
the model name and the tensor name. What stays in the files is what carries meaning: shapes,
grids, YOLOv8's DFL weights, attention masks, position tables and Swin's relative position bias.

Integer inputs: a token id must lie inside the vocabulary and a mask in {0, 1}, which the graph's
types do not say, so such models state each integer input's [low, high) range in their metadata
(`fusegraph.input_ranges`); the importer keeps it in `program.meta` and
`fusegraph.driver.inputs.random_inputs` draws within it.

Scale of the weights. Plain N(0, 1/fan_in) conv weights do NOT keep activations alive through
YOLOv5s's 60 SiLU convs: SiLU halves a small signal (slope 1/2 at 0), so the signal shrinks by
about 4x in variance per layer; measured, the RMS falls from 0.5 to 0.01 and every confidence in
the output is 0.500 +- 0.003. A larger fixed gain does not help either: the mean-field map of
SiLU has an unstable fixed point, so gain 1.41 still dies out and gain 1.7 explodes to RMS 1e3
with saturated outputs. Hence each conv/gemm weight carries a gain calibrated once, offline, in
the LSUV way (tools/calibrate_zoo.py: layer by layer, scale the weight so that the conv output has
unit standard deviation on a fixed random input); the gains live next to the graphs (the YOLO
files' metadata, models/light_calibration.json). The result: unit-scale pre-activations in every
layer, confidences spread over (0, 1), no overflow in fp16. Biases N(0, 0.01), BN scale U(0.5,1.5),
bias N(0, 0.1), mean N(0, 0.1), var U(0.5, 1.5), LayerNorm scale U(0.5, 1.5) and bias N(0, 0.1),
embedding tables N(0, 1) (see `fusegraph.zoo._weights`). In the transformers the MatMul/Gemm
weights are calibrated the same way and LayerNorm keeps every block's input at unit scale;
attention rows stay soft but not uniform (ViT-S: the median row maximum is about 2x the uniform
1/197), outputs stay within a few units (fp16-safe).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import onnx

from ..errors import ModelLoadError
from . import _params

__all__ = ["names", "is_zoo_name", "load", "describe", "summary", "path"]

MODELS_DIR = Path(__file__).resolve().parent / "models"
LIGHT_CALIBRATION = MODELS_DIR / "light_calibration.json"


@dataclass(frozen=True)
class _Entry:
    name: str
    title: str
    light: bool  # True: from onnx's backend test data; False: a stripped graph in MODELS_DIR


_YOLO = [
    _Entry("yolov5s", "YOLOv5s detector 640x640, BatchNorm folded (yolov5 7.0.14 export)", False),
    _Entry("yolov5s-160", "YOLOv5s detector 160x160, BatchNorm folded (yolov5 7.0.14 export)", False),
    _Entry("yolov5s-bn", "YOLOv5s detector 640x640, BatchNorm unfolded (yolov5 7.0.14 export)", False),
    _Entry("yolov5s-bn-160", "YOLOv5s detector 160x160, BatchNorm unfolded (yolov5 7.0.14 export)", False),
]
_EXPORTED = [  # tools/export_models.py: torch 2.13 legacy exporter, opset 17, batch 1, fp32
    _Entry("resnet18", "ResNet-18 classifier 224x224 (torchvision 0.28.0)", False),
    _Entry("mobilenet_v3_large", "MobileNetV3-Large classifier 224x224 (torchvision 0.28.0)", False),
    _Entry("convnext_tiny", "ConvNeXt-Tiny classifier 224x224 (torchvision 0.28.0)", False),
    _Entry("efficientnet_b1", "EfficientNet-B1 classifier 240x240 (timm 1.0.31)", False),
    _Entry("yolov8s", "YOLOv8s detector 640x640, BatchNorm folded (ultralytics 8.4.190)", False),
    _Entry("unet_small", "small U-Net 256x256, nearest upsample + concat (tools/export_models.py)", False),
    _Entry("sd_resblock", "Stable Diffusion UNet residual block, 320 channels 32x32, GroupNorm + SiLU "
           "(tools/export_models.py)", False),
    _Entry("vit_small_patch16_224", "ViT-S/16 classifier 224x224 (timm 1.0.31)", False),
    _Entry("deit_small_patch16_224", "DeiT-S/16 classifier 224x224 (timm 1.0.31)", False),
    _Entry("swin_tiny_patch4_window7_224", "Swin-T classifier 224x224, window 7 (timm 1.0.31)", False),
    _Entry("bert_base", "BERT-base encoder, sequence 128 (transformers 4.57.6)", False),
    _Entry("bert_base_s512", "BERT-base encoder, sequence 512 (transformers 4.57.6)", False),
    _Entry("gpt2_2layer", "GPT-2 decoder, 2 blocks, causal, sequence 128 (transformers 4.57.6)", False),
    # batch 32: these exports fold the batch into constants, so batch 1 cannot be rebatched
    _Entry("vit_small_patch16_224-b32", "ViT-S/16 classifier 224x224, batch 32 (timm 1.0.31)", False),
    _Entry("deit_small_patch16_224-b32", "DeiT-S/16 classifier 224x224, batch 32 (timm 1.0.31)", False),
    _Entry("swin_tiny_patch4_window7_224-b32", "Swin-T classifier 224x224, window 7, batch 32 (timm 1.0.31)",
           False),
]
_LIGHT = [
    _Entry("light_bvlc_alexnet", "AlexNet (BVLC) classifier", True),
    _Entry("light_densenet121", "DenseNet-121 classifier", True),
    _Entry("light_inception_v1", "Inception v1 (GoogLeNet) classifier", True),
    _Entry("light_inception_v2", "Inception v2 (BN-Inception) classifier", True),
    _Entry("light_resnet50", "ResNet-50 classifier", True),
    _Entry("light_shufflenet", "ShuffleNet classifier", True),
    _Entry("light_squeezenet", "SqueezeNet classifier", True),
    _Entry("light_vgg19", "VGG-19 classifier", True),
    _Entry("light_zfnet512", "ZFNet-512 classifier", True),
]


def _light_dir() -> Path:
    """Where the installed onnx package keeps its light models (found, never copied)."""
    return Path(onnx.__file__).resolve().parent / "backend" / "test" / "data" / "light"


def _entries() -> dict[str, _Entry]:
    # Light models count only if this onnx install ships them, so names() never lists a model
    # that load() cannot read.
    out = {e.name: e for e in _YOLO + _EXPORTED}
    out.update({e.name: e for e in _LIGHT if (_light_dir() / f"{e.name}.onnx").is_file()})
    return out


def names() -> list[str]:
    """All zoo names: YOLOv5s variants, the exported CNNs and transformers, then the light models."""
    return list(_entries())


def is_zoo_name(s: str) -> bool:
    """True if `s` names a zoo model (so a command line can tell it from a file path)."""
    return s in _entries()


def _entry(name: str) -> _Entry:
    entries = _entries()
    if name not in entries:
        raise ModelLoadError(f"unknown zoo model {name!r}; available: {', '.join(entries)}")
    return entries[name]


def path(name: str) -> Path:
    """The file a zoo model is read from: the stripped graph, or the onnx package's light model
    as shipped (constant 0.02 weights, no randomization)."""
    e = _entry(name)
    return (_light_dir() if e.light else MODELS_DIR) / f"{name}.onnx"


def _read(name: str) -> onnx.ModelProto:
    p = path(name)
    try:
        return onnx.load(str(p))
    except Exception as exc:  # a missing or corrupt file: report it as the user's load error
        raise ModelLoadError(f"zoo model {name!r}: cannot read {p}: {exc}") from exc


@lru_cache(maxsize=1)
def _light_gains() -> dict[str, dict[str, float]]:
    if not LIGHT_CALIBRATION.is_file():
        return {}
    return json.loads(LIGHT_CALIBRATION.read_text())


def load(name: str) -> onnx.ModelProto:
    """The zoo model `name` with its weights generated; a new ModelProto on every call.

    Deterministic: the same name gives the same weights every time, on every machine. Raises
    `ModelLoadError` for an unknown name (the message lists the available ones).
    """
    e = _entry(name)
    model = _read(name)
    if e.light:
        _params.randomize_params(model, model_seed=name, gains=_light_gains().get(name, {}))
    else:
        _params.restore_stripped(model, model_seed=name)
    _set_metadata(model, "fusegraph.zoo_name", name)
    _set_metadata(model, "fusegraph.weights",
                  "random, generated by fusegraph.zoo from the model and tensor names")
    return model


def _set_metadata(model: onnx.ModelProto, key: str, value: str) -> None:
    for prop in model.metadata_props:
        if prop.key == key:
            prop.value = value
            return
    model.metadata_props.add(key=key, value=value)


def _fmt(values) -> str:
    parts = []
    for v in values:
        dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
                for d in v.type.tensor_type.shape.dim]
        parts.append(f"{v.name}[{','.join(dims)}]")
    return " ".join(parts)


def describe(name: str) -> str:
    """One line: the name, then its `summary`."""
    return f"{name}: {summary(name)}"


def summary(name: str) -> str:
    """What the model is, its opset, inputs -> outputs (no weights are generated); without the
    name, for listings that show the name in a column of its own."""
    e = _entry(name)
    model = _read(name)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), "?")
    # IR 3 models (the light ones) list their initializers as graph inputs too: show only real inputs.
    inits = {i.name for i in model.graph.initializer}
    ins = _fmt(i for i in model.graph.input if i.name not in inits)
    outs = _fmt(model.graph.output)
    source = "onnx backend test 'light' model" if e.light else "stripped graph in fusegraph/zoo/models"
    return f"{e.title}, opset {opset}, {ins} -> {outs}; random weights ({source})"
