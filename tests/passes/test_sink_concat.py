"""Concat sinking (passes/sink_concat.py): ops after a concat that work along its axis position
by position move above it, one copy per part, where every copy joins the kernel of its part's
anchor; the rest keeps reading one concat. Structure before and after, and equal results on the
ref target."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import api, parse_onnx
from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction, Program
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.anchors import Convolution
from fusegraph.ops.movement import Concat
from fusegraph.ops.reduce import Softmax
from fusegraph.ops.source import add_literal, add_param
from fusegraph.ops.views import Reshape, Slice, Transpose
from fusegraph.passes.sink_concat import SinkConcat, split_axis, view_axis
from tests.helpers import assert_same_results, make_model, printed, rand

TOLERANCE = 1e-6  # the same ops on the same values, per part


def two_convs(reader: str = "sigmoid", channels: int = 2, axis: int = 1) -> Program:
    """reader(concat(reshape(conv(a)), reshape(conv(b)))) along the pixels, the two 1x1 convs
    over 2x2 and 1x1 maps (a softmax reader along `axis`)."""
    p = Program()
    m = p.main
    a = add_param(m, "a", Shape.of(DType.float32, [1, 3, 2, 2]))
    b = add_param(m, "b", Shape.of(DType.float32, [1, 3, 1, 1]))
    conv = Convolution([0, 0, 0, 0], [1, 1], [1, 1])
    ca = m.add(conv, [a, add_literal(m, rand(channels, 3, 1, 1, seed=1))])
    cb = m.add(conv, [b, add_literal(m, rand(channels, 3, 1, 1, seed=2))])
    cat = m.add(Concat(2), [m.add(Reshape([1, channels, 4]), [ca]), m.add(Reshape([1, channels, 1]), [cb])])
    y = m.add(make_op(reader), [cat]) if reader != "softmax" else m.add(Softmax(axis), [cat])
    m.set_returns([y], ["y"])
    return p


def test_a_sigmoid_after_a_concat_of_two_convs_moves_into_each():
    before, after = two_convs(), two_convs()
    assert SinkConcat().apply(after.main)
    assert printed(before.main)[7:] == [
        "@6 = reshape[dims={1,2,4}](@3) -> float_type, {1, 2, 4}, {8, 4, 1}",
        "@7 = reshape[dims={1,2,1}](@5) -> float_type, {1, 2, 1}, {2, 1, 1}",
        "@8 = concat[axis=2](@6,@7) -> float_type, {1, 2, 5}, {10, 5, 1}",
        "@9 = sigmoid(@8) -> float_type, {1, 2, 5}, {10, 5, 1}",
        "@10 = @return(@9)",
    ]
    assert printed(after.main)[7:] == [
        "@6 = reshape[dims={1,2,4}](@3) -> float_type, {1, 2, 4}, {8, 4, 1}",
        "@7 = reshape[dims={1,2,1}](@5) -> float_type, {1, 2, 1}, {2, 1, 1}",
        "@8 = sigmoid(@6) -> float_type, {1, 2, 4}, {8, 4, 1}",
        "@9 = sigmoid(@7) -> float_type, {1, 2, 1}, {2, 1, 1}",
        "@10 = concat[axis=2](@8,@9) -> float_type, {1, 2, 5}, {10, 5, 1}",
        "@11 = @return(@10)",
    ]
    assert_same_results(before, after, tolerance=TOLERANCE)
    api.fuse(after)
    assert [i.op.attrs["kernel"] for i in after.main if i.op.name == "fused"] == ["conv_reshape_sigmoid"] * 2
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_softmax_over_the_concat_axis_stays_below_it():
    p = two_convs("softmax", axis=2)
    text = str(p)
    assert not SinkConcat().apply(p.main)
    assert str(p) == text


def test_a_softmax_whose_copies_would_not_join_their_convs_stays_below_the_concat():
    """Softmax over 320 channels: wider than the widest run a conv's epilogue reduces (256)."""
    p = two_convs("softmax", channels=320)
    text = str(p)
    assert not SinkConcat().apply(p.main)
    assert str(p) == text


def test_a_concat_of_inputs_is_left_alone():
    p = Program()
    m = p.main
    cat = m.add(Concat(1), [add_param(m, "a", Shape.of(DType.float32, [2, 3])), add_param(m, "b", Shape.of(DType.float32, [2, 1]))])
    m.set_returns([m.add(make_op("exp"), [cat])], ["y"])
    text = str(p)
    assert not SinkConcat().apply(m)
    assert str(p) == text


def class_token_model(batch: int = 2):
    """A vision transformer's token stem: a 2x2 patch conv over 4x4 images of 16 channels, its 4 patches as
    tokens, a class token [1, 1, 8] expanded to the batch and concatenated in front, a position
    table added to all 5 tokens, a layernorm over the embedding (the first block's)."""
    from tests.gpu.test_gpu_kernels import node

    nodes = [node("Conv", ["x", "w"], ["c"], kernel_shape=[2, 2], strides=[2, 2]), node("Add", ["c", "cb"], ["cc"]),
             node("Reshape", ["cc", "flat"], ["f"]), node("Transpose", ["f"], ["t"], perm=[0, 2, 1]),
             node("Expand", ["cls", "bshape"], ["ce"]), node("Concat", ["ce", "t"], ["tok"], axis=1),
             node("Add", ["tok", "pos"], ["e"]),
             node("LayerNormalization", ["e", "g", "b"], ["y"], axis=-1)]
    return make_model(nodes, {"x": [batch, 16, 4, 4]}, ["y", "e"],
                      {"w": rand(8, 16, 2, 2, seed=1), "cb": rand(1, 8, 1, 1, seed=2), "cls": rand(1, 1, 8, seed=3),
                       "pos": rand(1, 5, 8, seed=4), "g": rand(8, seed=5), "b": rand(8, seed=6),
                       "flat": np.array([batch, 8, 4], np.int64), "bshape": np.array([batch, 1, 8], np.int64)})


def test_a_class_token_part_takes_its_position_in_its_own_copy_kernel():
    """The patches' position add joins their conv's epilogue and the class token's makes the
    kernel that fills its rows (concat elimination would copy them anyway), so the sum over all
    tokens, read by the layernorm and returned, is never a pass of its own."""
    before, after = parse_onnx(class_token_model()), parse_onnx(class_token_model())
    api.fuse(after)
    kernels = sorted(i.op.attrs["kernel"] for i in after.main if i.op.name == "fused")
    assert kernels == ["add", "conv_add_reshape_transpose", "layernorm"], kernels
    conv = next(i for i in after.main if i.op.name == "fused" and i.op.attrs["kernel"].startswith("conv"))
    assert [x.op.name for x in conv.op.module].count("add") == 2  # its bias and the positions
    assert not _ops(after, "concat")
    assert_same_results(before, after, tolerance=1e-5)


def test_the_class_token_stem_runs_on_the_gpu_target():
    from tests.gpu.test_gpu_kernels import check_gpu

    c = check_gpu(class_token_model(), tolerance=2e-5)
    assert len(c.kernels) == 3


def dfl_levels_model(levels: tuple[tuple[int, int], ...] = ((4, 4), (2, 2), (1, 1)), classes: int = 8):
    """YOLOv8's detection tail over several levels, as fusegraph reads it: per level a box conv
    (64 channels: 4 sides x 16 bins) and a class conv, each reshaped to [1, C, h*w] and
    concatenated over the levels along the anchor axis; then the distribution focal loss
    (reshape {1,4,16,n}, transpose, softmax over the bins, 1x1 conv with weights 0..15), the
    box from the anchor points times each anchor's stride, and the class sigmoid, the boxes
    and classes concatenated."""
    n = sum(h * w for h, w in levels)
    nodes, inits, inputs, boxes, scores = [], {}, {}, [], []
    for k, (h, w) in enumerate(levels):
        inputs[f"x{k}"] = [1, 8, h, w]
        inits.update({f"wb{k}": rand(64, 8, 3, 3, seed=10 + k, scale=0.3), f"bb{k}": rand(64, seed=20 + k),
                      f"wc{k}": rand(classes, 8, 1, 1, seed=30 + k), f"bc{k}": rand(classes, seed=40 + k),
                      f"sb{k}": np.array([1, 64, h * w], np.int64), f"sc{k}": np.array([1, classes, h * w], np.int64)})
        nodes += [helper.make_node("Conv", [f"x{k}", f"wb{k}", f"bb{k}"], [f"box{k}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Conv", [f"x{k}", f"wc{k}", f"bc{k}"], [f"cls{k}"]),
                  helper.make_node("Reshape", [f"box{k}", f"sb{k}"], [f"b{k}"]),
                  helper.make_node("Reshape", [f"cls{k}", f"sc{k}"], [f"c{k}"])]
        boxes.append(f"b{k}")
        scores.append(f"c{k}")
    grid = np.concatenate([np.stack(np.meshgrid(np.arange(w) + 0.5, np.arange(h) + 0.5)[::-1], 0)[::-1].reshape(2, h * w)
                           for h, w in levels], axis=1)
    strides = np.concatenate([np.full(h * w, 8.0 * 2 ** k) for k, (h, w) in enumerate(levels)])
    inits.update({"s4": np.array([1, 4, 16, n], np.int64), "s3": np.array([1, 4, n], np.int64),
                  "wd": np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1), "z": np.array([0], np.int64),
                  "two": np.array([2], np.int64), "four": np.array([4], np.int64), "one": np.array([1], np.int64),
                  "anc": grid.reshape(1, 2, n).astype(np.float32), "half": np.array(2.0, np.float32),
                  "stride": strides.reshape(1, n).astype(np.float32)})
    nodes += [helper.make_node("Concat", boxes, ["box"], axis=2), helper.make_node("Concat", scores, ["cls"], axis=2),
              helper.make_node("Reshape", ["box", "s4"], ["b4"]), helper.make_node("Transpose", ["b4"], ["bt"], perm=[0, 2, 1, 3]),
              helper.make_node("Softmax", ["bt"], ["sm"], axis=1), helper.make_node("Conv", ["sm", "wd"], ["d"]),
              helper.make_node("Reshape", ["d", "s3"], ["dist"]),
              helper.make_node("Slice", ["dist", "z", "two", "one"], ["lt"]),
              helper.make_node("Slice", ["dist", "two", "four", "one"], ["rb"]),
              helper.make_node("Sub", ["anc", "lt"], ["xy1"]), helper.make_node("Add", ["anc", "rb"], ["xy2"]),
              helper.make_node("Add", ["xy1", "xy2"], ["sxy"]), helper.make_node("Div", ["sxy", "half"], ["cxy"]),
              helper.make_node("Sub", ["xy2", "xy1"], ["wh"]), helper.make_node("Concat", ["cxy", "wh"], ["bx"], axis=1),
              helper.make_node("Mul", ["bx", "stride"], ["dbox"]), helper.make_node("Sigmoid", ["cls"], ["cs"]),
              helper.make_node("Concat", ["dbox", "cs"], ["y"], axis=1)]
    return make_model(nodes, inputs, ["y"], inits)


def _ops(program: Program, name: str) -> list[Instruction]:
    return [i for i in program.main if i.op.name == name]


def test_each_levels_softmax_and_weighted_sum_move_above_the_concat():
    before, after = parse_onnx(dfl_levels_model()), parse_onnx(dfl_levels_model())
    assert [c.shape.lens for c in _ops(before, "concat")] == [(1, 64, 21), (1, 8, 21), (1, 4, 21), (1, 12, 21)]
    assert SinkConcat().apply(after.main)
    # per level: the softmax over the bins, the 1x1 conv summing them, the class sigmoid
    assert [s.shape.lens for s in _ops(after, "softmax")] == [(1, 16, 4, 16), (1, 16, 4, 4), (1, 16, 4, 1)]
    assert [s.shape.lens for s in _ops(after, "sigmoid")] == [(1, 8, 16), (1, 8, 4), (1, 8, 1)]
    dfl = [c for c in _ops(after, "convolution") if c.shape.lens[1] == 1]
    assert [c.shape.lens for c in dfl] == [(1, 1, 4, 16), (1, 1, 4, 4), (1, 1, 4, 1)]
    # the sums of the three levels meet in one concat along the anchors; the box arithmetic,
    # which combines box sides j and j + 2, reads them there (its copies would not join a conv)
    cats = _ops(after, "concat")
    assert [(c.shape.lens, c.op.attrs["axis"]) for c in cats] == [
        ((1, 1, 4, 21), 3), ((1, 4, 21), 1), ((1, 8, 21), 2), ((1, 12, 21), 1)]
    assert cats[0].inputs == dfl
    assert [s.inputs[0].inputs[0] for s in _ops(after, "slice")] == [cats[0], cats[0]]
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_the_dfl_tail_is_one_kernel_per_head_conv_and_one_for_the_boxes():
    before, after = parse_onnx(dfl_levels_model()), parse_onnx(dfl_levels_model())
    api.fuse(after)
    kernels = [i.op.attrs["kernel"] for i in after.main if i.op.name == "fused"]
    assert sorted(kernels) == sorted(["conv_add_reshape_transpose_softmax"] * 3 + ["conv_add_reshape_sigmoid"] * 3
                                     + ["sub_add_div_concat_mul"])
    assert not _ops(after, "concat")  # every part written into the output or the sums' buffer in place
    assert_same_results(before, after, tolerance=1e-5)


@pytest.mark.parametrize("lens,axis,new_lens,want", [
    ([1, 64, 21], 2, [1, 4, 16, 21], 3),  # the channels split, the anchors kept
    ([1, 64, 21], 1, [1, 4, 16, 21], None),  # the concat axis itself split
    ([2, 3, 5], 2, [6, 5], 1),
    ([2, 3, 5], 1, [6, 5], None),  # merged with the axis before it
    ([1, 4, 21], 2, [1, 1, 4, 21], 3),
])
def test_a_reshape_keeps_the_axis_when_it_regroups_only_the_axes_around_it(lens, axis, new_lens, want):
    p = Program()
    x = add_param(p.main, "x", Shape.of(DType.float32, lens))
    r = p.main.add(Reshape(new_lens), [x])
    assert view_axis(r, axis) == want


def test_split_axis_follows_each_op_kind():
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [1, 16, 4, 21]))
    t = m.add(Transpose([0, 2, 1, 3]), [x])
    assert split_axis(t, [3]) == 3 and split_axis(t, [1]) == 2
    s = m.add(Slice([2], [0], [2]), [x])
    assert split_axis(s, [3]) == 3 and split_axis(s, [2]) is None
    sm = m.add(Softmax(1), [x])
    assert split_axis(sm, [3]) == 3 and split_axis(sm, [1]) is None
    add = m.add(make_op("add"), [x, x])
    assert split_axis(add, [3, 3]) == 3 and split_axis(add, [3, 2]) is None
    one = m.add(Convolution([0, 0, 0, 0], [1, 1], [1, 1]), [x, add_literal(m, rand(1, 16, 1, 1))])
    assert split_axis(one, [3, None]) == 3 and split_axis(one, [1, None]) is None
    wide = m.add(Convolution([0, 1, 0, 1], [1, 1], [1, 1]), [x, add_literal(m, rand(2, 16, 1, 3))])
    assert split_axis(wide, [2, None]) == 2 and split_axis(wide, [3, None]) is None  # a 3-wide window along 3
    cat = m.add(Concat(1), [x, x])
    assert split_axis(cat, [3, 3]) == 3 and split_axis(cat, [1, 1]) is None
