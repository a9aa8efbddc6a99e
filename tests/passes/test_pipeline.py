"""The default pipeline (passes/pipeline.py): canonicalization, then fusion; `fuse` runs it in
place and `compile_program` reports the kernels it made."""

from __future__ import annotations

from onnx import helper

from fusegraph import parse_onnx
from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Program
from fusegraph.ir.shape import Shape
from fusegraph.ops.source import add_param
from fusegraph.passes.pipeline import (canonicalize_passes, compile_program, count_kernels, default_pipeline, fuse,
                                       fusion_passes)
from tests.helpers import assert_same_results, make_model, op_names, rand

TOLERANCE = 1e-6  # fusion reorders no arithmetic


def conv_pool_concat():
    """relu(concat(maxpool(silu(conv(x))), q))."""
    return make_model([
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["a"]),
        helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Concat", ["p", "q"], ["cat"], axis=1), helper.make_node("Relu", ["cat"], ["y"]),
    ], {"x": [1, 2, 6, 6], "q": [1, 1, 3, 3]}, ["y"], {"w": rand(3, 2, 3, 3, seed=1), "b": rand(3, seed=2)})


def test_the_pipeline_is_canonicalization_then_fusion():
    assert [p.name for p in canonicalize_passes()] == [
        "dead_code_elimination", "constant_propagation", "eliminate_identity", "common_subexpressions", "simplify_views",
        "fold_into_weights", "fold_norm_affine", "defer_norm",
        "pad_channel_groups", "space_to_depth", "constant_propagation", "compact_literals", "eliminate_identity",
        "dead_code_elimination"]
    assert [p.name for p in fusion_passes()] == [
        "fuse_attention", "merge_siblings", "sink_concat", "fuse_anchors", "fuse_reductions", "fuse_movement", "fuse_pointwise",
        "eliminate_concat", "dead_code_elimination"]
    assert [p.name for p in default_pipeline()] == [p.name for p in canonicalize_passes() + fusion_passes()]


def test_fuse_makes_one_kernel_per_anchor_and_reads_the_concat_in_its_reader():
    """The relu reads the concat of the pool's output and the input q as a select of the
    two: no copy kernel puts q into a concat buffer."""
    before, after = parse_onnx(conv_pool_concat()), parse_onnx(conv_pool_concat())
    assert count_kernels(before) == 0
    report = fuse(after)
    assert len(report.timings) == len(default_pipeline())
    assert op_names(after.main) == ["@param", "@param", "@literal", "@literal", "fused", "fused", "fused"]
    assert [i.op.attrs["kernel"] for i in after.main if i.op.name == "fused"] == [
        "conv_add_sigmoid_mul", "pool", "concat_relu"]
    assert count_kernels(after) == 3
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_compile_program_reports_the_kernels_and_the_pass_times():
    text = compile_program(parse_onnx(conv_pool_concat()))
    lines = text.splitlines()
    assert lines[0] == "3 fused kernels:"
    assert sorted(line.split()[-1] for line in lines[1:4]) == ["concat_relu", "conv_add_sigmoid_mul", "pool"]
    assert lines[4] == "passes:" and len(lines) == 5 + len(default_pipeline()) + 1


def test_a_program_that_computes_nothing_gets_no_kernel():
    p = Program()
    x = add_param(p.main, "x", Shape.of(DType.float32, [2, 2]))
    p.main.set_returns([x], ["y"])
    text = str(p)
    fuse(p)
    assert count_kernels(p) == 0 and str(p) == text
