"""Which exported zoo models a default test run covers, and which only a full run does.

Why: on two cores the exported models cost 1-20 s each across the zoo tests (ref vs ONNX
Runtime, fused == unfused, load and run), about 70 s together, but two cost far more: ConvNeXt-T
(fused == unfused about 75 s, its fused depthwise groups evaluated element by element on the
ref target) and BERT-base (about 50 s: 110M weights to generate, parse and run), the more so at
sequence 512. Those run only with `FUSEGRAPH_FULL_ZOO=1 pytest ...` (also marked slow). Their
files change only when tools/export_models.py runs again. The BERTs' structure (one attention
kernel per layer, the mask computed once) takes seconds, not tens, and every run checks it
(tests/models/test_zoo_exported.py).
"""

from __future__ import annotations

import os

import pytest

FULL = os.environ.get("FUSEGRAPH_FULL_ZOO") == "1"

#: exported models every run checks
DEFAULT_EXPORTED = ["resnet18", "mobilenet_v3_large", "unet_small", "sd_resblock", "gpt2_2layer", "efficientnet_b1",
                    "yolov8s", "vit_small_patch16_224", "deit_small_patch16_224", "swin_tiny_patch4_window7_224"]
#: exported models only a full run checks
BIG_EXPORTED = ["bert_base", "bert_base_s512", "convnext_tiny"]

_only_full = pytest.mark.skipif(not FULL, reason="a big zoo model: set FUSEGRAPH_FULL_ZOO=1 to run it")


def big(name: str) -> "pytest.param":
    """`name` as a test parameter that runs only in a full run."""
    return pytest.param(name, marks=[pytest.mark.slow, _only_full])


def exported(names: list[str] | None = None) -> list:
    """Test parameters for `names` (default: every exported model), the big ones gated."""
    names = names if names is not None else DEFAULT_EXPORTED + BIG_EXPORTED
    return [big(n) if n in BIG_EXPORTED else n for n in names]
