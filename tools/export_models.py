"""Export the CNN and transformer graphs of the model zoo from the libraries' own definitions.

Why this exists: the zoo's models must be the graphs a user gets from torchvision, timm,
ultralytics and transformers, not hand-written look-alikes, yet nothing may be downloaded. So each
model is built in code (`pretrained=False`, configs made here, YOLOv8s from its yaml) with random
weights, exported by torch's legacy exporter (`dynamo=False`, opset 17, batch 1, fixed shapes,
fp32), its weights stripped (tools/strip_weights.py) and the graph committed under
fusegraph/zoo/models/; `fusegraph.zoo.load` regenerates the weights.

Run it in a SEPARATE venv, never in the project's:
    python3.11 -m venv /tmp/export-venv
    /tmp/export-venv/bin/pip install torch==2.13.0         # pinned CPU wheel; never unpinned
    /tmp/export-venv/bin/pip install --no-deps torchvision==0.28.0 timm==1.0.31 \\
        ultralytics==8.4.190 transformers==4.57.6
    /tmp/export-venv/bin/pip install onnx pyyaml 'huggingface-hub<1.0' safetensors regex \\
        'tokenizers<=0.23.0' tqdm packaging filelock pillow opencv-python-headless psutil \\
        matplotlib numpy requests polars scipy onnxscript
    /tmp/export-venv/bin/python tools/export_models.py [NAME ...] [--dynamo-dir DIR]

transformers 4.57.6 refuses huggingface-hub>=1.0 and tokenizers>0.23.0 at import, hence their
caps. The BERTs alone need only torch, transformers, onnx, numpy and transformers' import-time
requirements (huggingface-hub, tokenizers, safetensors, regex, pyyaml, tqdm, packaging,
filelock, requests); onnxscript only with --dynamo-dir.

`--dynamo-dir DIR` also writes each model through torch 2.13's default exporter (dynamo, opset 20,
weights in NAME.onnx.data) into DIR, unstripped, for checking that fusegraph reads those too.

torchvision's operator library: the torchvision 0.28.0 wheel is a CUDA build, so under the CPU
torch its compiled ops do not load, and `import torchvision` fails in `_meta_registrations.py`
(`operator torchvision::nms does not exist`) because it registers fake kernels for ops whose
schemas the missing library would have defined. `define_torchvision_ops()` defines those schemas
before torchvision is imported; their CPU kernels raise, and no exported model calls them.

Duplicate initializers: fresh parameters are often equal (LayerNorm weights all 1, biases all 0),
and the exporter then shares one initializer between layers, which no trained model shows and
which strip_weights refuses (one tensor in two slots). So every trainable parameter gets a small
seeded perturbation before export; frozen ones (YOLOv8's DFL arange) keep their values.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from strip_weights import strip  # noqa: E402  (tools/ is not a package)

SEED = 0
OPSET = 17
BERT_SEQS = {"bert_base": 128, "bert_base_s512": 512}  # zoo name -> sequence length
GPT_SEQ = 128

_TV_SCHEMAS = [
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width) -> (Tensor, Tensor)",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, int sampling_ratio) -> (Tensor, Tensor)",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width) -> (Tensor, Tensor)",
]


def define_torchvision_ops() -> None:
    """Define the torchvision op schemas its Python side expects (see the module docstring)."""
    import torch

    lib = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _TV_SCHEMAS:
        name = schema.split("(")[0]
        if hasattr(torch.ops.torchvision, name):
            continue
        lib.define(schema)

        def unavailable(*args, _name=name, **kwargs):
            raise RuntimeError(f"torchvision::{_name} is a schema defined by tools/export_models.py "
                               "without a kernel; the export should never call it")

        lib.impl(name, unavailable, "CompositeExplicitAutograd")
    define_torchvision_ops.lib = lib  # keep the registration alive


def _perturb(model) -> None:
    """Make every trainable parameter distinct (see 'Duplicate initializers' above)."""
    import torch

    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad and p.is_floating_point():
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.normal_(0.0, 0.1, generator=gen)
                m.running_var.uniform_(0.5, 1.5, generator=gen)


def build_unet():
    """A small U-Net: two poolings down, two nearest upsamplings back, each joined by a concat."""
    import torch
    from torch import nn

    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(inplace=True))

    class SmallUNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc1 = nn.Sequential(block(3, 16), block(16, 16))
            self.enc2 = nn.Sequential(block(16, 32), block(32, 32))
            self.mid = block(32, 64)
            self.dec2 = block(64 + 32, 32)
            self.dec1 = nn.Sequential(block(32 + 16, 16), block(16, 16))
            self.head = nn.Conv2d(16, 2, 1)
            self.pool = nn.MaxPool2d(2)
            self.up = nn.Upsample(scale_factor=2, mode="nearest")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            e1 = self.enc1(x)
            e2 = self.enc2(self.pool(e1))
            m = self.mid(self.pool(e2))
            d2 = self.dec2(torch.cat([self.up(m), e2], 1))
            d1 = self.dec1(torch.cat([self.up(d2), e1], 1))
            return self.head(d1)

    return SmallUNet()


def build_sd_resblock():
    """A Stable Diffusion UNet residual block (diffusers' ResnetBlock2D: GroupNorm(32) -> SiLU ->
    3x3 conv, plus the SiLU'd time embedding projected to the channels, GroupNorm(32) -> SiLU ->
    3x3 conv, plus the input) at SD 1.5's first-stage width, written with torch.nn's own modules
    (diffusers itself is not installed)."""
    import torch
    from torch import nn

    class ResBlock(nn.Module):
        def __init__(self, channels: int = 320, temb: int = 1280) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.GroupNorm(32, channels, eps=1e-5), nn.GroupNorm(32, channels, eps=1e-5)
            self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
            self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
            self.time_emb_proj = nn.Linear(temb, channels)
            self.act = nn.SiLU()

        def forward(self, sample: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
            h = self.conv1(self.act(self.norm1(sample)))
            h = h + self.time_emb_proj(self.act(temb))[:, :, None, None]
            h = self.conv2(self.act(self.norm2(h)))
            return sample + h

    return ResBlock()


def build_torchvision(arch: str) -> Callable:
    def build():
        import torchvision

        return getattr(torchvision.models, arch)(weights=None)
    return build


def build_timm(arch: str) -> Callable:
    def build():
        import timm

        return timm.create_model(arch, pretrained=False)
    return build


def build_yolov8s():
    """YOLOv8s from ultralytics' own yolov8s.yaml, BN folded and Detect in export mode, as
    ultralytics' exporter sets it for ONNX (one output [1, 84, 8400])."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics.nn.modules import Detect
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolov8s.yaml", ch=3, nc=80, verbose=False).eval()
    _perturb(model)
    model.fuse(verbose=False)
    for m in model.modules():
        if isinstance(m, Detect):
            m.dynamic, m.export, m.format = False, True, "onnx"
    return model


def build_bert():
    """A BERT-base encoder (BertModel, pooler included) from a default BertConfig."""
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(attn_implementation="eager"))


def bert_entry(seq: int) -> tuple:
    """The MODELS entry of the BERT-base encoder at sequence `seq`.

    One model at several sequence lengths: the same builder, seed and perturbation, so the
    graphs differ only in the shapes the exporter traced (the sequence is baked into the graph:
    fixed shapes, and the position ids are a slice of a constant). A default BertConfig has 512
    positions (`max_position_embeddings`), the longest sequence it can export.
    """
    if not 0 < seq <= 512:
        raise ValueError(f"BERT-base has 512 positions; sequence {seq} does not fit")
    inputs = [("input_ids", [1, seq], "int64", (0, 30522)), ("attention_mask", [1, seq], "int64", (0, 2)),
              ("token_type_ids", [1, seq], "int64", (0, 2))]
    return (build_bert, inputs, ["last_hidden_state"],
            f"BERT-base encoder, sequence {seq} (transformers 4.57.6)")


def build_gpt2():
    """Two GPT-2 decoder blocks (causal self-attention), no KV cache, eager attention.

    GPT-2's eager attention applies the causal mask itself (`torch.where` with its `bias` buffer,
    a lower-triangular constant); `create_causal_mask` only adds padding on top, and transformers
    4.57 builds it with `torch.vmap`, which the legacy exporter cannot trace (`unordered_map::at`).
    Without an attention_mask input that extra mask is all zeros, so it is left out here
    (`create_causal_mask` returns None, which GPT-2 accepts): the same computation, exportable.
    """
    from transformers import GPT2Config, GPT2Model
    from transformers.models.gpt2 import modeling_gpt2

    modeling_gpt2.create_causal_mask = lambda **kwargs: None
    return GPT2Model(GPT2Config(n_layer=2, use_cache=False, attn_implementation="eager"))


class _LastHidden:
    """Wraps a transformers model so that the export has one plain tensor output."""

    def __new__(cls, inner, names: list[str]):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, *args):
                return self.inner(**dict(zip(names, args)), return_dict=True).last_hidden_state

        return Wrapped()


# zoo name -> (builder, inputs [(name, shape, dtype, (lo, hi) for integers)], output names, title)
MODELS: dict[str, tuple] = {
    "resnet18": (build_torchvision("resnet18"), [("input", [1, 3, 224, 224], "float32", None)],
                 ["logits"], "ResNet-18 classifier 224x224 (torchvision 0.28.0)"),
    "mobilenet_v3_large": (build_torchvision("mobilenet_v3_large"),
                           [("input", [1, 3, 224, 224], "float32", None)], ["logits"],
                           "MobileNetV3-Large classifier 224x224 (torchvision 0.28.0)"),
    "convnext_tiny": (build_torchvision("convnext_tiny"), [("input", [1, 3, 224, 224], "float32", None)],
                      ["logits"], "ConvNeXt-Tiny classifier 224x224 (torchvision 0.28.0)"),
    "efficientnet_b1": (build_timm("efficientnet_b1"), [("input", [1, 3, 240, 240], "float32", None)],
                        ["logits"], "EfficientNet-B1 classifier 240x240 (timm 1.0.31)"),
    "yolov8s": (build_yolov8s, [("images", [1, 3, 640, 640], "float32", None)], ["output0"],
                "YOLOv8s detector 640x640, BatchNorm folded (ultralytics 8.4.190 yolov8s.yaml)"),
    "unet_small": (build_unet, [("input", [1, 3, 256, 256], "float32", None)], ["mask"],
                   "small U-Net 256x256: 9 convs, max-pool down, nearest upsample + concat up"),
    "sd_resblock": (build_sd_resblock, [("sample", [1, 320, 32, 32], "float32", None), ("temb", [1, 1280], "float32", None)],
                    ["out"], "Stable Diffusion UNet residual block, 320 channels 32x32, GroupNorm(32) + SiLU "
                    "(torch.nn modules)"),
    "vit_small_patch16_224": (build_timm("vit_small_patch16_224"),
                              [("input", [1, 3, 224, 224], "float32", None)], ["logits"],
                              "ViT-S/16 classifier 224x224 (timm 1.0.31)"),
    "deit_small_patch16_224": (build_timm("deit_small_patch16_224"),
                               [("input", [1, 3, 224, 224], "float32", None)], ["logits"],
                               "DeiT-S/16 classifier 224x224 (timm 1.0.31)"),
    "swin_tiny_patch4_window7_224": (build_timm("swin_tiny_patch4_window7_224"),
                                     [("input", [1, 3, 224, 224], "float32", None)], ["logits"],
                                     "Swin-T classifier 224x224, window 7 (timm 1.0.31)"),
    **{name: bert_entry(seq) for name, seq in BERT_SEQS.items()},
    "gpt2_2layer": (build_gpt2, [("input_ids", [1, GPT_SEQ], "int64", (0, 50257))],
                    ["last_hidden_state"],
                    f"GPT-2 decoder, 2 blocks, causal mask, sequence {GPT_SEQ}, no KV cache "
                    "(transformers 4.57.6)"),
}
#: batch-32 copies of graphs whose batch-1 export cannot be rebatched afterwards: the exporter
#: folds the batch into constants (ViT's expanded class token, Swin's window reshapes), so a
#: benchmark at batch 32 needs a graph exported at 32. Their gains are copied from the batch-1
#: graph by tools/calibrate_zoo.py.
BATCH_VARIANTS = {f"{base}-b32": (base, 32) for base in
                  ("vit_small_patch16_224", "deit_small_patch16_224", "swin_tiny_patch4_window7_224")}
#: frozen weights that carry meaning and stay verbatim
KEEP = {"yolov8s": frozenset({"model.22.dfl.conv.weight"})}
#: models whose Mul-by-tensor nodes are layer scales (strip them as channel_scale)
LAYER_SCALES = {"convnext_tiny"}
TRANSFORMERS = {*BERT_SEQS, "gpt2_2layer"}


def _base(name: str) -> tuple[str, int]:
    """(the MODELS entry, batch) of a zoo name: a batch variant or a batch-1 model."""
    return BATCH_VARIANTS.get(name, (name, 1))


def build(name: str):
    """The seeded, perturbed model `name` (a MODELS entry) in eval mode, ready for export."""
    import torch

    torch.manual_seed(SEED)
    builder, inputs = MODELS[name][:2]
    model = builder().eval()
    if name != "yolov8s":  # YOLOv8s was perturbed before its BN fold
        _perturb(model)
    if name in TRANSFORMERS:
        model = _LastHidden(model, [i[0] for i in inputs]).eval()
    return model


def example_inputs(name: str, batch: int) -> tuple:
    import torch

    gen = torch.Generator().manual_seed(SEED)
    out = []
    for _, shape, dtype, bounds in MODELS[name][1]:
        shape = [batch] + shape[1:]
        if dtype == "int64":
            out.append(torch.randint(bounds[0], bounds[1], shape, generator=gen))
        else:
            out.append(torch.rand(shape, generator=gen))
    return tuple(out)


def export(zoo_name: str, path: Path, dynamo: bool = False) -> list[list[int]]:
    """Export `zoo_name` to `path`; the shapes of its outputs, as torch computed them."""
    import torch

    name, batch = _base(zoo_name)
    model, args = build(name), example_inputs(name, batch)
    _, inputs, outputs = MODELS[name][:3]
    with torch.no_grad():
        out = model(*args)  # fails here, not in the exporter, if the model itself is broken
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            torch.onnx.export(model, args, str(path), input_names=[i[0] for i in inputs],
                              output_names=outputs, dynamo=True, external_data=True)
        else:
            torch.onnx.export(model, args, str(path), opset_version=OPSET, dynamo=False,
                              do_constant_folding=True, input_names=[i[0] for i in inputs],
                              output_names=outputs)
    return [list(t.shape) for t in (out if isinstance(out, (tuple, list)) else [out])]


def _fix_output_dims(model: "onnx.ModelProto", shapes: list[list[int]]) -> None:
    """Give symbolic output dimensions their values: the exporter leaves some symbolic (Swin-T's
    logits are [Gemmlogits_dim_0, 1000]) although every shape here is fixed."""
    for value, shape in zip(model.graph.output, shapes):
        for dim, n in zip(value.type.tensor_type.shape.dim, shape):
            if not dim.HasField("dim_value"):
                dim.dim_value = n


def finish(full_path: Path, zoo_name: str, out_shapes: list[list[int]]) -> "onnx.ModelProto":
    """Check the full export, strip its weights and record where it came from."""
    import onnx
    import torch

    name, batch = _base(zoo_name)
    model = onnx.load(str(full_path))
    onnx.checker.check_model(model, full_check=True)
    stripped = strip(model, keep=KEEP.get(name, frozenset()), layer_scales=name in LAYER_SCALES)
    title = MODELS[name][3] + (f", batch {batch}" if batch != 1 else "")
    _fix_output_dims(stripped, out_shapes)
    stripped.doc_string = f"{title}; weights stripped"
    ranges = {n: list(b) for n, _, _, b in MODELS[name][1] if b is not None}
    props = [("fusegraph.zoo_name", zoo_name),
             ("fusegraph.source", f"{title}, random weights, torch=={torch.__version__} "
                                  f"torch.onnx.export(opset_version={OPSET}, dynamo=False); "
                                  "tools/export_models.py")]
    if ranges:
        props.append(("fusegraph.input_ranges", json.dumps(ranges, separators=(",", ":"))))
    for key, value in props:
        stripped.metadata_props.add(key=key, value=value)
    return stripped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Export the zoo's CNN and transformer graphs (weights stripped)")
    ap.add_argument("names", nargs="*", help=f"models (default: all): {', '.join([*MODELS, *BATCH_VARIANTS])}")
    ap.add_argument("--out-dir", type=Path, default=REPO / "fusegraph" / "zoo" / "models")
    ap.add_argument("--dynamo-dir", type=Path, default=None,
                    help="also export with the default (dynamo) exporter, unstripped, into this folder")
    args = ap.parse_args(argv)
    known = [*MODELS, *BATCH_VARIANTS]
    unknown = sorted(set(args.names) - set(known))
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(known)}")
    define_torchvision_ops()
    import onnx

    args.out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.names or known:
            full = Path(tmp) / f"{name}.onnx"
            shapes = export(name, full)
            dst = args.out_dir / f"{name}.onnx"
            onnx.save(finish(full, name, shapes), str(dst))
            print(f"{dst}: {dst.stat().st_size} bytes (full {full.stat().st_size} bytes)", flush=True)
            if args.dynamo_dir is not None:
                args.dynamo_dir.mkdir(parents=True, exist_ok=True)
                export(name, args.dynamo_dir / f"{name}.onnx", dynamo=True)
                print(f"  dynamo export: {args.dynamo_dir / f'{name}.onnx'}", flush=True)
    print("Now recalibrate the weight gains with the project's venv: "
          ".venv/bin/python tools/calibrate_zoo.py NAME ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
