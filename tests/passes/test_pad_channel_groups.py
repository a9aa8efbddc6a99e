"""Channel-group padding (passes/pad_channel_groups.py): a convolution whose channels a reshape
splits into groups of an odd size computes each group padded to a power of two, and a slice
drops the padding. Checked by structure, by numerics against the unpadded program, and on the
cases where it must not fire."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import api, parse_onnx
from fusegraph.driver.inputs import random_inputs
from fusegraph.passes.manager import run_passes
from fusegraph.passes.pad_channel_groups import PadChannelGroups, _pad_rows
from fusegraph.passes.pipeline import canonicalize_passes, fuse
from tests.helpers import make_model, rand, rel_err


def head(groups: int = 3, size: int = 21, bias: bool = True, perm=(0, 1, 3, 4, 2)):
    """YOLOv5's head shape in small: conv 1x1 -> reshape {1, groups, size, H, W} -> transpose -> sigmoid."""
    c, h, w = 6, 4, 5
    ins = ["x", "w", "b"] if bias else ["x", "w"]
    nodes = [helper.make_node("Conv", ins, ["c"], kernel_shape=[1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=list(perm)),
             helper.make_node("Sigmoid", ["t"], ["y"])]
    weights = {"w": rand(groups * size, c, 1, 1, seed=1), "shape": np.array([1, groups, size, h, w], np.int64)}
    if bias:
        weights["b"] = rand(groups * size, seed=2)
    return make_model(nodes, {"x": [1, c, h, w]}, ["y"], weights)


def canonical(model):
    program = parse_onnx(model)
    run_passes(program, canonicalize_passes())
    return program


def convs(program):
    return [i for i in program.main if i.op.name == "convolution"]


def test_pad_rows_puts_each_group_at_a_power_of_two_stride():
    v = np.arange(6, dtype=np.float32).reshape(6, 1)  # 2 groups of 3
    out = _pad_rows(v, 2, 3, 0)
    assert out.shape == (8, 1)
    np.testing.assert_array_equal(out[:, 0], [0, 1, 2, 0, 3, 4, 5, 0])


@pytest.mark.parametrize("bias", [True, False])
def test_head_convolution_is_padded_and_sliced_back(bias):
    program = canonical(head(bias=bias))
    (conv,) = convs(program)
    assert conv.shape.lens == (1, 96, 4, 5)  # 3 groups of 21 -> 3 x 32
    w = conv.inputs[1].op.value.reshape(3, 32, 6)
    assert np.all(w[:, 21:] == 0)
    slices = [i for i in program.main if i.op.name == "slice"]
    assert [(s.op.attrs["axes"], s.op.attrs["starts"], s.op.attrs["ends"]) for s in slices] == [((2,), (0,), (21,))]


@pytest.mark.parametrize("bias", [True, False])
def test_padded_program_computes_what_the_original_does(bias):
    model = head(bias=bias)
    plain, fused = parse_onnx(model), parse_onnx(model)
    fuse(fused)
    assert convs(fused) == [] and [i.op.name for i in fused.main].count("fused") == 1
    inputs = random_inputs(plain.input_shapes, seed=5)
    want, got = api.run(plain, inputs), api.run(fused, inputs)
    assert not np.isnan(got["y"]).any()
    assert rel_err(got["y"], want["y"]) <= 1e-6


@pytest.mark.parametrize("groups,size", [(3, 32), (2, 8), (1, 63)])
def test_groups_already_aligned_or_too_small_are_left_alone(groups, size):
    # a power-of-two group needs no padding; a group under 16 channels or a single group gains nothing
    program = parse_onnx(head(groups=groups, size=size))
    assert not PadChannelGroups().apply(program.main)
