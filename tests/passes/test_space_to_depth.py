"""Space-to-depth (passes/space_to_depth.py): a strided convolution over few input channels
runs as a stride-1 convolution over s x s blocks of pixels, padded to 16 channels. Checked
against the unrewritten program on random inputs (reference target and, under the
interpreter, the gpu target), by structure, and where it must not fire."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import api, parse_onnx
from fusegraph.driver.inputs import random_inputs
from fusegraph.passes.space_to_depth import SpaceToDepth, block_stride
from tests.helpers import make_model, rand, rel_err


def conv_model(c: int = 3, m: int = 8, k: int = 6, s: int = 2, pads=(2, 2, 2, 2), hw=(12, 16), batch: int = 2):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[s, s], pads=list(pads)),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    weights = {"w": rand(m, c, k, k, seed=1, scale=(c * k * k) ** -0.5), "b": rand(m, seed=2)}
    return make_model(nodes, {"x": [batch, c, *hw]}, ["y"], weights)


def first_conv(program):
    return next(i for i in program.main if i.op.name == "convolution")


@pytest.mark.parametrize("c,k,s,pads,hw", [(3, 6, 2, (2, 2, 2, 2), (12, 16)),   # YOLOv5's first layer
                                           (1, 4, 2, (0, 2, 2, 0), (8, 10)),    # one channel, uneven pads
                                           (3, 4, 2, (0, 0, 0, 0), (6, 8)),     # no padding, windows overlapping
                                           (2, 6, 3, (3, 0, 0, 3), (12, 9)),    # stride 3: 18 channels padded to 32
                                           (12, 4, 2, (2, 2, 2, 2), (8, 8))])   # 48 channels
def test_rewrite_computes_the_same_convolution(c, k, s, pads, hw):
    model = conv_model(c=c, k=k, s=s, pads=pads, hw=hw)
    plain = parse_onnx(model)
    rewritten = parse_onnx(model)
    assert block_stride(first_conv(rewritten)) == s
    assert SpaceToDepth().apply(rewritten.main)
    conv = first_conv(rewritten)
    assert conv.op.attrs["stride"] == (1, 1) and conv.inputs[1].shape.lens[1] % 16 == 0
    assert conv.inputs[0].op.name == "pad"
    inputs = random_inputs(plain.input_shapes, seed=3)
    want = api.run(plain, inputs)["y"]
    assert rel_err(api.run(rewritten, inputs)["y"], want) < 1e-5
    compiled = api.compile(parse_onnx(model), "gpu", tune=False)
    assert any(k.src.name.endswith("_pad") for k in compiled.kernels)
    assert rel_err(compiled.run(inputs)["y"], want) < 2e-5


@pytest.mark.parametrize("kwargs", [dict(s=1, k=3, pads=(1, 1, 1, 1)),      # no stride
                                    dict(k=3, pads=(1, 1, 1, 1)),           # odd kernel
                                    dict(pads=(1, 1, 1, 1)),                # odd padding
                                    dict(hw=(13, 16), pads=(2, 2, 2, 2)),   # odd height
                                    dict(c=16),                             # already 16 channels a tap
                                    dict(c=17),                             # 68 block channels: too wide
                                    dict(k=2, pads=(0, 0, 0, 0)),           # patches: each pixel read once
                                    dict(k=4, s=4, pads=(0, 0, 0, 0), hw=(8, 12))])  # ConvNeXt's and Swin's stem
def test_leaves_other_convolutions_alone(kwargs):
    program = parse_onnx(conv_model(**kwargs))
    assert block_stride(first_conv(program)) == 0
    assert not SpaceToDepth().apply(program.main)


def test_yolov5s_first_convolution_reads_blocks():
    program = parse_onnx("yolov5s-160")
    SpaceToDepth().apply(program.main)
    conv = first_conv(program)
    assert tuple(conv.inputs[0].shape.lens) == (1, 16, 80, 80) and tuple(conv.inputs[1].shape.lens) == (32, 16, 3, 3)
    assert conv.op.attrs["padding"] == (1, 1, 1, 1)
    assert sum(1 for i in program.main if i.op.name == "pad") == 1


def test_a_patch_embedding_runs_in_place_on_the_gpu_target():
    model = conv_model(c=3, m=8, k=4, s=4, pads=(0, 0, 0, 0), hw=(8, 12))
    inputs = random_inputs(parse_onnx(model).input_shapes, seed=5)
    want = api.run(parse_onnx(model), inputs)["y"]
    compiled = api.compile(parse_onnx(model), "gpu", tune=False)
    assert [k.src.template for k in compiled.kernels] == ["gemm"]
    assert rel_err(compiled.run(inputs)["y"], want) < 2e-5


def test_convnext_stem_reads_the_image_in_place():
    """ConvNeXt-T's 4x4 stem of stride 4 is a patch embedding: no block copy in front of it, its
    kernel reads the image itself."""
    from fusegraph.ops.base import OpKind, is_fused
    from fusegraph.passes.pipeline import fuse

    program = parse_onnx("convnext_tiny")
    fuse(program)
    kernels = [i for i in program.main if is_fused(i)]
    assert not any(k.op.attrs["kernel"] == "pad" for k in kernels)
    stem = next(k for k in kernels if k.op.attrs["kernel"].startswith("conv"))
    assert any(x.op.kind == OpKind.PARAM for x in stem.inputs)


def test_block_weights_match_the_pixels_they_multiply():
    from fusegraph.passes.space_to_depth import block_weights

    w = np.arange(1 * 3 * 6 * 6, dtype=np.float32).reshape(1, 3, 6, 6)
    b = block_weights(w, 2, 16)
    # block channel (i*2 + j)*3 + c at tap (u, v) is pixel (2u + i, 2v + j) of channel c
    for i in range(2):
        for j in range(2):
            for c in range(3):
                assert np.array_equal(b[0, (i * 2 + j) * 3 + c], w[0, c, i::2, j::2])
    assert not b[0, 12:].any()
