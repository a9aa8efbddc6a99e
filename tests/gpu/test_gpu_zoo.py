"""Whole zoo models on the gpu target against the reference target.

Every kind of fused kernel the zoo produces (convolutions with their SiLU/ReLU epilogues and
concat-buffer stores, the detection heads, pooling, copies, LRN, softmax, reductions, matrix
products) runs here: under Triton's interpreter without a GPU, compiled on a GPU. Buffers are
poisoned with NaN first, so an element no kernel writes fails the test.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from fusegraph import api, parse_onnx
from fusegraph.driver.inputs import input_ranges, random_inputs
from tests.helpers import has_gpu, rel_err

# fast enough under the interpreter for every CI run; the rest on a GPU or with FUSEGRAPH_SLOW_TESTS=1
RUN_SLOW = has_gpu() or os.environ.get("FUSEGRAPH_SLOW_TESTS") == "1"
QUICK = ["yolov5s-160"]
SLOW = ["yolov5s-bn-160", "light_squeezenet", "light_inception_v1", "light_shufflenet", "light_resnet50", "light_densenet121", "light_bvlc_alexnet",
        "light_zfnet512", "light_vgg19", "light_inception_v2"]
# the models exported from their libraries' own definitions: every fusion rule they meet (prologue
# and stored norms, epilogue layernorms, sunk concats, attention, folded batches) on real shapes
EXPORTED = ["resnet18", "mobilenet_v3_large", "convnext_tiny", "efficientnet_b1", "yolov8s", "unet_small", "sd_resblock",
            "vit_small_patch16_224", "swin_tiny_patch4_window7_224", "bert_base", "gpt2_2layer"]


def _check(name: str, fp16: bool = False, tune: bool = False) -> None:
    """The model's outputs against the reference target, and a second run (buffers poisoned
    again) bit-identical to the first: no kernel's result may depend on the order in which its
    programs ran (split-k included)."""
    program = parse_onnx(name)
    compiled = api.compile(program, "gpu", tune=tune, fp16=fp16)
    inputs = random_inputs(program.input_shapes, seed=11, ranges=input_ranges(program))
    want = api.run(program, inputs)
    runs = []
    for _ in range(2):
        compiled.poison()
        runs.append({k: np.array(v) for k, v in compiled.run(inputs).items()})
    got = runs[0]
    for out, value in want.items():
        g = np.asarray(got[out], dtype=np.float32)
        assert not np.isnan(g).any(), f"{name} {out}: {np.isnan(g).sum()} elements left unwritten"
        assert rel_err(g, value) < (1e-2 if fp16 else 1e-4), f"{name} {out}: {rel_err(g, value)}"
        assert np.array_equal(runs[1][out], got[out]), f"{name} {out}: two runs differ"


@pytest.mark.parametrize("name", QUICK)
def test_zoo_model_on_gpu_target(name: str) -> None:
    _check(name)


@pytest.mark.slow
@pytest.mark.skipif(not RUN_SLOW, reason="minutes under the interpreter: runs on a GPU or with FUSEGRAPH_SLOW_TESTS=1")
@pytest.mark.parametrize("name", SLOW)
def test_zoo_model_on_gpu_target_slow(name: str) -> None:
    _check(name)


@pytest.mark.slow
@pytest.mark.skipif(not has_gpu(), reason="too large for the interpreter: runs on a GPU")
@pytest.mark.parametrize("name", EXPORTED)
def test_exported_zoo_model_on_gpu_target(name: str) -> None:
    _check(name)


def test_yolov5s_fp16_on_gpu_target() -> None:
    _check("yolov5s-160", fp16=True)


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="tuned configs and CUDA graphs need a GPU")
@pytest.mark.parametrize("name", ["yolov5s"])
def test_tuned_fp16_model_runs_bit_identically_twice(name: str) -> None:
    _check(name, fp16=True, tune=True)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not has_gpu(), reason="batch 32 is minutes under the interpreter, where these kernels agree "
                    "(the first layer alone, cut from the graph, passes there): runs on a GPU")
def test_bert_base_at_batch_32_in_fp16_on_gpu_target() -> None:
    """The post-norm layers' products at batch 32 (M = 4096) take the large tiles that batch 1
    never does; their output against the reference target at the same batch."""
    from fusegraph import zoo
    from fusegraph.onnx.rebatch import with_batch

    program = parse_onnx(with_batch(zoo.load("bert_base"), 32))
    compiled = api.compile(program, "gpu", tune=False, fp16=True)
    inputs = random_inputs(program.input_shapes, seed=11, ranges=input_ranges(program))
    want = api.run(program, inputs)
    compiled.poison()
    for out, value in compiled.run(inputs).items():
        g = np.asarray(value, dtype=np.float32)
        assert np.isfinite(g).all(), f"{out}: {(~np.isfinite(g)).sum()} non-finite elements"
        assert rel_err(g, want[out]) < 1e-2, f"{out}: {rel_err(g, want[out])}"
