"""Which exported zoo models a default test run covers, and which only a full run does.

Why: the exported CNNs and transformers take 10-100 s each on the NumPy reference target
(ConvNeXt-T's depthwise convolutions, BERT's 110M weights) and CI has two cores, so a default
run covers the four small ones and leaves the rest to `FUSEGRAPH_FULL_ZOO=1 pytest ...`
(also marked slow). Their files change only when tools/export_models.py runs again.
"""

from __future__ import annotations

import os

import pytest

FULL = os.environ.get("FUSEGRAPH_FULL_ZOO") == "1"

#: exported models every run checks (a few seconds each)
SMALL_EXPORTED = ["resnet18", "mobilenet_v3_large", "unet_small", "gpt2_2layer"]
#: exported models only a full run checks
BIG_EXPORTED = ["efficientnet_b1", "yolov8s", "vit_small_patch16_224", "deit_small_patch16_224",
                "swin_tiny_patch4_window7_224", "bert_base", "convnext_tiny"]

_only_full = pytest.mark.skipif(not FULL, reason="a big zoo model: set FUSEGRAPH_FULL_ZOO=1 to run it")


def big(name: str) -> "pytest.param":
    """`name` as a test parameter that runs only in a full run."""
    return pytest.param(name, marks=[pytest.mark.slow, _only_full])


def exported(names: list[str] | None = None) -> list:
    """Test parameters for `names` (default: every exported model), the big ones gated."""
    names = names if names is not None else SMALL_EXPORTED + BIG_EXPORTED
    return [big(n) if n in BIG_EXPORTED else n for n in names]
