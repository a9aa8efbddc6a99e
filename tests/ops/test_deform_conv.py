"""DeformConv against ONNX Runtime on fresh random inputs: offsets large enough that taps land
between pixels and outside the input, with and without mask and bias, groups and offset
groups, strides, pads, dilations and a non-square kernel; on the reference target unfused and
fused and on the gpu target under the interpreter (float32 sums in other orders: 1e-4)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import parse_onnx
from fusegraph.errors import ParseError
from fusegraph.ops.anchors import window_out_len
from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target

# (input shape, output channels, kernel, attributes, mask, bias)
CASES = [
    ((1, 2, 5, 5), 3, (3, 3), {}, False, False),
    ((2, 4, 6, 5), 4, (3, 2), dict(pads=[1, 0, 1, 1], strides=[2, 1], group=2, offset_group=2), True, True),
    ((1, 3, 7, 6), 2, (2, 2), dict(dilations=[2, 1], pads=[1, 1, 0, 0], offset_group=3), True, False),
    ((1, 4, 5, 5), 6, (1, 3), dict(strides=[1, 2], group=2, pads=[0, 1, 0, 1]), False, True),
]


def case(shape, cout, kernel, attrs, with_mask, with_bias):
    rng = np.random.default_rng()
    n, c, h, w = shape
    group, offset_group = attrs.get("group", 1), attrs.get("offset_group", 1)
    pads, strides, dil = attrs.get("pads", [0] * 4), attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    out = [window_out_len(shape[2 + d], kernel[d], strides[d], dil[d], pads[d], pads[d + 2]) for d in range(2)]
    taps = kernel[0] * kernel[1]
    feeds = {"x": rng.standard_normal(shape), "w": rng.standard_normal((cout, c // group, *kernel)),
             "offset": rng.standard_normal((n, offset_group * 2 * taps, *out)) * 1.5}
    names = ["x", "w", "offset", "", ""]
    if with_bias:
        feeds["b"], names[3] = rng.standard_normal(cout), "b"
    if with_mask:
        feeds["mask"], names[4] = rng.uniform(0, 1, (n, offset_group * taps, *out)), "mask"
    feeds = {k: f.astype(np.float32) for k, f in feeds.items()}
    while not names[-1]:
        names.pop()
    node = helper.make_node("DeformConv", names, ["y"], kernel_shape=list(kernel), **attrs)
    return model_of([node], feeds, ["y"], opset=19), feeds


@pytest.mark.parametrize("shape,cout,kernel,attrs,with_mask,with_bias", CASES)
def test_deform_conv(shape, cout, kernel, attrs, with_mask, with_bias):
    check_ref(*case(shape, cout, kernel, attrs, with_mask, with_bias), rtol=1e-4, atol=1e-4)


@needs_gpu_target
def test_gpu_deform_conv():
    check_gpu(*case(*CASES[1]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs,offset_channels,message", [
    (dict(offset_group=3), 18, "offset_group 3"),
    ({}, 9, "offset"),
    (dict(pads=[1, 1]), 18, "pads"),
])
def test_bad_attributes_name_the_node(attrs, offset_channels, message):
    oh = 5 if attrs.get("pads") else 3
    feeds = {"x": np.zeros((1, 2, 5, 5), np.float32), "w": np.zeros((2, 2, 3, 3), np.float32),
             "offset": np.zeros((1, offset_channels, oh, oh), np.float32)}
    node = helper.make_node("DeformConv", ["x", "w", "offset"], ["y"], name="dc1", **attrs)
    with pytest.raises(ParseError, match=message) as err:
        parse_onnx(model_of([node], feeds, ["y"], opset=19))
    assert "dc1" in str(err.value)
