"""Physical layouts of feature maps: how a view of a channels-last buffer is addressed.

The GPU target stores convolution feature maps NHWC (activation_layout.py) and every kernel
addresses a value through the strides `physical_shape` derives for it; these tests pin that
derivation for views, and the refusal of a reshape the layout cannot alias.
"""

from __future__ import annotations

import numpy as np
import pytest

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Module
from fusegraph.ops.fused import Allocate
from fusegraph.ops.views import Reshape, Slice, Transpose
from fusegraph.targets.gpu.activation_layout import CHANNELS_LAST
from fusegraph.targets.gpu.kernel_writer import CodegenError
from fusegraph.targets.gpu.memory_plan import physical_shape, plan_memory


def _address(shape, index):
    return shape.offset + sum(i * s for i, s in zip(index, shape.strides))


def test_views_of_a_channels_last_buffer_address_the_right_elements():
    main = Module()
    buf = main.add(Allocate(DType.float16, [2, 6, 3, 5]))
    part = main.add(Slice([1], [2], [6]), [buf])  # channels 2..5
    moved = main.add(Transpose([0, 2, 3, 1]), [part])
    main.set_returns([moved], ["y"])
    plan = plan_memory(main)
    plan.of[id(buf)].kind = "arena"
    plan.of[id(buf)].perm = CHANNELS_LAST
    nhwc = np.arange(2 * 3 * 5 * 6).reshape(2, 3, 5, 6)  # element = its NHWC address
    logical = nhwc.transpose(0, 3, 1, 2)  # [N, C, H, W] view of the same storage
    s = physical_shape(moved, plan)
    rng = np.random.default_rng(0)
    for _ in range(50):
        n, h, w, c = (int(rng.integers(0, k)) for k in (2, 3, 5, 4))
        assert _address(s, (n, h, w, c)) == logical[n, c + 2, h, w]


def test_a_reshape_that_cannot_alias_the_layout_is_refused():
    main = Module()
    buf = main.add(Allocate(DType.float16, [1, 8, 3, 5]))
    flat = main.add(Reshape([1, 120]), [buf])
    main.set_returns([flat], ["y"])
    plan = plan_memory(main)
    plan.of[id(buf)].perm = CHANNELS_LAST
    with pytest.raises(CodegenError, match="reshape"):
        physical_shape(flat, plan)


def test_a_view_that_is_only_an_index_map_gets_no_buffer_of_its_input():
    from fusegraph.ops.views import DepthToSpace

    main = Module()
    buf = main.add(Allocate(DType.float32, [1, 8, 3, 5]))
    moved = main.add(DepthToSpace(2), [buf])
    main.set_returns([moved], ["y"])
    with pytest.raises(CodegenError, match="depth_to_space"):
        plan_memory(main)


def test_only_convolution_kernels_store_their_feature_maps_channels_last():
    from onnx import helper

    from fusegraph import parse_onnx
    from fusegraph.passes.pipeline import fuse
    from fusegraph.targets.gpu.codegen import plan_program
    from tests.helpers import make_model, rand

    def model(second):
        # e is also read by the add, so the product reads it from a buffer (not computed in its prologue)
        nodes = [helper.make_node("Exp", ["x"], ["e"]), second, helper.make_node("Add", ["p", "e"], ["q"]),
                 helper.make_node("Sigmoid", ["q"], ["y"])]
        return make_model(nodes, {"x": [2, 8, 4, 4]}, ["y"], {"w": rand(*weights[second.op_type], seed=1)})

    weights = {"Conv": (8, 8, 3, 3), "MatMul": (4, 4)}
    for second, want in ((helper.make_node("Conv", ["e", "w"], ["p"], pads=[1, 1, 1, 1]), CHANNELS_LAST),
                         (helper.make_node("MatMul", ["e", "w"], ["p"]), None)):
        program = parse_onnx(model(second))
        fuse(program)
        plan = plan_program(program.main)
        perms = {b.perm for b in plan.buffers if b.kind == "arena" and b.shape.ndim == 4}
        assert perms == {want}, (second.op_type, perms)
