"""The IR: strided shapes, views' strides, the printer's format."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import api, parse_onnx
from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Module
from fusegraph.ir.shape import Shape
from fusegraph.ops.anchors import Convolution
from fusegraph.ops.source import add_literal, add_param
from fusegraph.ops.views import MultiBroadcast, Reshape, Slice, Transpose, view_strides
from tests.helpers import make_model, rand


def test_shape_kinds():
    s = Shape.of(DType.float32, [1, 255, 80, 80])
    assert s.strides == (1632000, 6400, 80, 1) and s.standard() and s.packed()
    assert str(s) == "float_type, {1, 255, 80, 80}, {1632000, 6400, 80, 1}"
    t = Transpose([0, 2, 3, 1]).compute_shape([s])
    assert t.lens == (1, 80, 80, 255) and t.strides == (1632000, 80, 1, 6400)
    assert t.transposed() and not t.standard() and t.packed()
    b = MultiBroadcast([4, 255, 80, 80]).compute_shape([Shape.of(DType.float32, [255, 1, 1])])
    assert b.strides == (0, 1, 0, 0) and b.broadcasted() and not b.packed()
    sl = Slice([1], [85], [170]).compute_shape([s])
    assert sl.lens == (1, 85, 80, 80) and sl.strides == s.strides and sl.offset == 85 * 6400
    assert not sl.standard() and sl.element_space() == 170 * 6400
    assert Shape.of(DType.float16, [2, 3]).bytes == 12


@pytest.mark.parametrize("lens,perm,new", [
    ((2, 3, 4), (0, 2, 1), (2, 12)),
    ((2, 3, 4), (1, 0, 2), (6, 4)),
    ((2, 3, 4), (1, 0, 2), (3, 2, 2, 2)),
    ((4, 6), (1, 0), (6, 2, 2)),
    ((4, 6), (1, 0), (3, 2, 4)),
])
def test_reshape_of_transposed_view_is_exact(lens, perm, new):
    """When a reshape of a strided view is expressible, its strides address the right elements."""
    base = np.arange(np.prod(lens)).reshape(lens)
    view = base.transpose(perm)
    shape = Transpose(perm).compute_shape([Shape.of(DType.int64, lens)])
    strides = view_strides(shape.lens, shape.strides, new)
    expected = view.reshape(new)
    if strides is None:
        assert not np.shares_memory(expected, base)
        assert Reshape(new).compute_shape([shape]).standard()
        return
    got = np.lib.stride_tricks.as_strided(base, new, [s * base.itemsize for s in strides])
    np.testing.assert_array_equal(got, expected)


def test_printer_reads_like_migraphx():
    m = Module()
    x = add_param(m, "x", Shape.of(DType.float32, [1, 3, 640, 640]))
    w = add_literal(m, rand(32, 3, 6, 6))
    c = m.add(Convolution([2, 2, 2, 2], [2, 2], [1, 1]), [x, w])
    m.set_returns([c], ["y"])
    assert str(m).splitlines() == [
        'module: "main"',
        "@0 = @param:x -> float_type, {1, 3, 640, 640}, {1228800, 409600, 640, 1}",
        "@1 = @literal -> float_type, {32, 3, 6, 6}, {108, 36, 6, 1}",
        "@2 = convolution[padding={2,2,2,2},stride={2,2},dilation={1,1},group=1](@0,@1) -> "
        "float_type, {1, 32, 320, 320}, {3276800, 102400, 320, 1}",
        "@3 = @return(@2)",
    ]


def test_shape_subgraph_folds_to_a_literal():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape becomes a plain reshape with explicit dims."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    model = make_model(nodes, {"x": [2, 3, 4]}, ["y"], {
        "i0": np.array(0, np.int64), "ax": np.array([0], np.int64), "minus1": np.array([-1], np.int64)})
    program = parse_onnx(model)
    names = [i.op.name for i in program.main]
    assert names == ["@param", "reshape"]
    assert program.main.instructions[1].op.attrs["dims"] == (2, 12)
    x = rand(2, 3, 4)
    np.testing.assert_array_equal(api.run(program, {"x": x})["y"], x.reshape(2, 12))
