"""Literal compaction (passes/compact_literals.py): a constant that repeats along some axes is
stored as one slice behind a broadcast, so fused kernels read a vector instead of a tile."""

from __future__ import annotations

import numpy as np
from onnx import helper

from fusegraph import api, parse_onnx
from fusegraph.driver.inputs import random_inputs
from fusegraph.passes.compact_literals import CompactLiterals, repeated_axes
from fusegraph.passes.manager import run_passes
from fusegraph.passes.pipeline import canonicalize_passes, fuse
from tests.helpers import make_model, rand, rel_err


def anchor_grid_model():
    """YOLOv5's box-size step: sigmoid(x)*2 squared, times a [1, 3, H, W, 2] anchor grid that
    only varies with the anchor and the coordinate."""
    anchors = rand(1, 3, 1, 1, 2, seed=4, scale=10.0)
    grid = np.ascontiguousarray(np.broadcast_to(anchors, (1, 3, 6, 5, 2)))
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "two"], ["d"]),
             helper.make_node("Mul", ["d", "d"], ["sq"]), helper.make_node("Mul", ["sq", "grid"], ["y"])]
    return make_model(nodes, {"x": [1, 3, 6, 5, 2]}, ["y"], {"grid": grid, "two": np.array(2.0, np.float32)}), anchors


def literals(program):
    return [i for i in program.main if i.op.name == "@literal"]


def test_repeated_axes_finds_only_axes_where_every_slice_is_equal():
    v = np.broadcast_to(rand(3, 1, 2, seed=1), (3, 4, 2)).copy()
    assert repeated_axes(v) == [1]
    v[1, 2, 0] += 1.0  # one differing element breaks the repetition
    assert repeated_axes(v) == []
    assert repeated_axes(np.full((2, 3), 7.0)) == [0, 1]
    assert repeated_axes(np.full((2, 3), 7.0), {1}) == [1]  # only the axes asked about


def test_a_slice_equal_to_the_first_but_a_later_one_not_is_no_repetition():
    """The second slice alone agreeing says nothing: every slice is compared."""
    v = np.broadcast_to(rand(1, 3, seed=np.random.randint(1 << 30)), (4, 3)).copy()
    assert repeated_axes(v) == [0]
    v[3, 1] += 1.0  # the last row differs, the second still equals the first
    assert repeated_axes(v) == []


def test_anchor_grid_becomes_one_slice_behind_a_broadcast():
    model, anchors = anchor_grid_model()
    program = parse_onnx(model)
    run_passes(program, canonicalize_passes())
    grids = [i for i in literals(program) if i.shape.elements > 1]
    assert [g.shape.lens for g in grids] == [(1, 3, 1, 1, 2)]
    np.testing.assert_array_equal(grids[0].op.value, anchors)
    users = [u for u in program.main if grids[0] in u.inputs]
    assert [u.op.name for u in users] == ["multibroadcast"]
    assert users[0].shape.lens == (1, 3, 6, 5, 2)


def test_compacted_program_computes_what_the_original_does():
    model, _ = anchor_grid_model()
    plain, fused = parse_onnx(model), parse_onnx(model)
    fuse(fused)
    inputs = random_inputs(plain.input_shapes, seed=7)
    want, got = api.run(plain, inputs), api.run(fused, inputs)
    assert rel_err(got["y"], want["y"]) <= 1e-6


def test_weights_keep_their_layout_even_when_they_repeat():
    # a convolution weight equal across output channels is still the anchor's own operand
    w = np.broadcast_to(rand(1, 2, 3, 3, seed=2), (4, 2, 3, 3)).copy()
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": [1, 2, 5, 5]}, ["y"], {"w": w})
    program = parse_onnx(model)
    assert not CompactLiterals().apply(program.main)
    assert [i.shape.lens for i in literals(program)] == [(4, 2, 3, 3)]


def test_layernorm_scale_and_bias_become_rows_again():
    """The importer broadcasts a layernorm's [K] scale and bias to the input's lens and folds
    a small broadcast into a full [M, K] literal: the layernorm reads them element by element,
    so they compact back to one row behind a broadcast."""
    gamma, beta = rand(12, seed=1), rand(12, seed=2)
    model = make_model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)], {"x": [5, 12]}, ["y"],
                       {"g": gamma, "b": beta})
    program = parse_onnx(model)
    assert [i.shape.lens for i in literals(program)] == [(5, 12), (5, 12)]
    plain = parse_onnx(model)
    assert CompactLiterals().apply(program.main)
    rows = literals(program)
    assert [r.shape.lens for r in rows] == [(1, 12), (1, 12)]
    np.testing.assert_array_equal(rows[0].op.value[0], gamma)
    np.testing.assert_array_equal(rows[1].op.value[0], beta)
    inputs = random_inputs(plain.input_shapes, seed=3)
    assert rel_err(api.run(program, inputs)["y"], api.run(plain, inputs)["y"]) == 0.0


def test_batched_weights_repeated_over_the_batch_become_one_matrix():
    """MatMul([2, 3, 7, 9], W [9, 20]): the importer broadcasts W to [2, 3, 9, 20] and, small,
    folds it into a full literal; compaction keeps one [1, 1, 9, 20] matrix behind a broadcast
    (so the product's batches become rows of one product). Weights whose rows happen to repeat
    keep their K and N axes: only the batch axes compact."""
    w = rand(9, 20, seed=1)
    w[3] = w[0]  # a repeated row is not a batch axis
    model = make_model([helper.make_node("MatMul", ["a", "w"], ["y"])], {"a": [2, 3, 7, 9]}, ["y"], {"w": w})
    program = parse_onnx(model)
    run_passes(program, canonicalize_passes())
    (lit,) = [x for x in literals(program) if x.shape.elements > 1]
    assert list(lit.shape.lens) == [1, 1, 9, 20]
    x = random_inputs(program.input_shapes, seed=5)
    assert rel_err(api.run(program, x)["y"], api.run(parse_onnx(model), x)["y"]) < 1e-6
