"""The libraries' own PyTorch modules for the zoo models that tools/export_models.py exports.

Why: bench/models.py compares fusegraph on the zoo graph with PyTorch running the model as its
library defines it (torchvision, timm, ultralytics, transformers), built on the benchmark machine
with the same configuration and random weights. A library that is not installed there makes its
models fall back to the module generated from the zoo graph itself (bench/torch_reference.py),
and the table says so.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

TOOLS = Path(__file__).resolve().parents[1] / "tools"


@dataclass(frozen=True)
class Spec:
    """How to build one zoo model's library module and feed it."""

    library: str  # the import the module needs
    build: Callable[[], torch.nn.Module]
    keyword_inputs: bool = False  # called with its inputs by name (transformers, the SD block); one tensor out


def _torchvision(arch: str) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import torchvision

        return getattr(torchvision.models, arch)(weights=None)
    return build


def _timm(arch: str) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import timm

        return timm.create_model(arch, pretrained=False)
    return build


def _yolov8s() -> torch.nn.Module:
    """As ultralytics' ONNX exporter prepares it: BN folded, Detect in export mode."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics.nn.modules import Detect
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolov8s.yaml", ch=3, nc=80, verbose=False).eval()
    model.fuse(verbose=False)
    for m in model.modules():
        if isinstance(m, Detect):
            m.dynamic, m.export, m.format = False, True, "onnx"
    return model


def _exported_here(builder: str) -> Callable[[], torch.nn.Module]:
    """A zoo model defined in tools/export_models.py with torch.nn's own modules (the small
    U-Net, the Stable Diffusion residual block), from that definition."""
    def build() -> torch.nn.Module:
        sys.path.insert(0, str(TOOLS))
        try:
            return getattr(importlib.import_module("export_models"), builder)()
        finally:
            sys.path.remove(str(TOOLS))
    return build


class _LastHidden(torch.nn.Module):
    """A transformers model called with keyword inputs, returning last_hidden_state."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        return self.inner(**inputs)[0]  # last_hidden_state, as a ModelOutput or a tuple


def _bert() -> torch.nn.Module:
    """BERT-base for every zoo sequence: BertModel takes any sequence up to its 512 positions, so
    the sequence is the inputs' (bench/models.py draws them in the zoo graph's shapes)."""
    from transformers import BertConfig, BertModel

    return _LastHidden(BertModel(BertConfig()))


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2Model

    return _LastHidden(GPT2Model(GPT2Config(n_layer=2, use_cache=False)))


SPECS: dict[str, Spec] = {
    "resnet18": Spec("torchvision", _torchvision("resnet18")),
    "mobilenet_v3_large": Spec("torchvision", _torchvision("mobilenet_v3_large")),
    "convnext_tiny": Spec("torchvision", _torchvision("convnext_tiny")),
    "efficientnet_b1": Spec("timm", _timm("efficientnet_b1")),
    "yolov8s": Spec("ultralytics", _yolov8s),
    "unet_small": Spec("torch", _exported_here("build_unet")),
    "sd_resblock": Spec("torch", _exported_here("build_sd_resblock"), keyword_inputs=True),
    "vit_small_patch16_224": Spec("timm", _timm("vit_small_patch16_224")),
    "deit_small_patch16_224": Spec("timm", _timm("deit_small_patch16_224")),
    "swin_tiny_patch4_window7_224": Spec("timm", _timm("swin_tiny_patch4_window7_224")),
    "bert_base": Spec("transformers", _bert, keyword_inputs=True),
    "bert_base_s512": Spec("transformers", _bert, keyword_inputs=True),
    "gpt2_2layer": Spec("transformers", _gpt2, keyword_inputs=True),
}


def library_missing(name: str) -> str:
    """Why the library module of zoo model `name` cannot be built here ('' if it can)."""
    lib = SPECS[name].library
    try:
        importlib.import_module(lib)
    except Exception as e:  # not installed, or installed for another torch
        return f"{lib} not importable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return ""


def library_module(name: str, seed: int) -> torch.nn.Module:
    """The library's module for `name` with seeded random weights, in eval mode."""
    torch.manual_seed(seed)
    return SPECS[name].build().eval()
