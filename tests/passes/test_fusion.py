"""Fusion: the founding YOLOv5 head pattern and its general forms become single fused
instructions, and fused programs compute what unfused ones do (on the ref target, which
evaluates the fused groups' index maps element by element)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import api, parse_onnx, zoo
from fusegraph.driver.inputs import input_ranges, random_inputs
from fusegraph.ir.program import Instruction, Program
from fusegraph.passes.pipeline import count_kernels, fuse
from tests.helpers import make_model, ort_run, rand, rel_err
from tests.zoo_params import exported


def fused_instructions(program: Program) -> list[Instruction]:
    return [i for i in program.main if i.op.name == "fused"]


def sub_ops(ins: Instruction) -> list[str]:
    return [i.op.name for i in ins.op.module]


def check_fused_equals_unfused(model, tolerance: float = 1e-6, seed: int = 3) -> Program:
    plain = parse_onnx(model)
    fused = parse_onnx(model)
    fuse(fused)
    inputs = random_inputs(plain.input_shapes, seed, input_ranges(plain))
    want, got = api.run(plain, inputs), api.run(fused, inputs)
    for name in want:
        assert not np.isnan(got[name]).any(), f"{name}: elements left unwritten (NaN)"
        assert rel_err(got[name], want[name]) <= tolerance, name
    return fused


def test_pointwise_transpose_pointwise_is_one_kernel():
    model = make_model([
        helper.make_node("Exp", ["x"], ["e"]),
        helper.make_node("Transpose", ["e"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Add", ["t", "b"], ["a"]),
        helper.make_node("Sigmoid", ["a"], ["y"]),
    ], {"x": [2, 3, 5]}, ["y"], {"b": rand(5, 3, seed=1)})
    program = check_fused_equals_unfused(model)
    (k,) = fused_instructions(program)
    assert [i.op.name for i in program.main] == ["@param", "@literal", "fused"]
    assert sub_ops(k) == ["@param", "load", "exp", "@param", "load", "add", "sigmoid", "allocate", "store"]
    loads = [i for i in k.op.module if i.op.name == "load"]
    # the transpose lives in the first load's map: output (i0, i1, i2) reads x at (i0, i2, i1)
    assert [str(e) for e in loads[0].op.attrs["map"].exprs] == ["i0", "i2", "i1"]


def test_gemm_reshape_transpose_pointwise_is_one_kernel():
    model = make_model([
        helper.make_node("Gemm", ["x", "w", "c"], ["g"], transB=1),
        helper.make_node("Reshape", ["g", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Sigmoid", ["t"], ["y"]),
    ], {"x": [6, 8]}, ["y"], {"w": rand(12, 8, seed=1), "c": rand(12, seed=2),
                              "shape": np.array([6, 3, 4], np.int64)})
    program = check_fused_equals_unfused(model)
    (k,) = fused_instructions(program)
    assert k.shape.lens == (6, 4, 3)
    assert {"dot", "add", "sigmoid", "store"} <= set(sub_ops(k))
    (store,) = [i for i in k.op.module if i.op.name == "store"]
    # dot output (m, n) lands at (m, n % 4, n // 4) of the transposed result
    assert [str(e) for e in store.op.attrs["map"].exprs] == ["i0", "(i1 % 4)", "(i1 // 4)"]
    x = rand(6, 8, seed=5)
    (want,) = ort_run(model, {"x": x})
    assert rel_err(api.run(program, {"x": x})["y"], want) < 1e-6


def test_conv_reshape_transpose_sigmoid_is_one_kernel():
    model = make_model([
        helper.make_node("Conv", ["x", "w", "b"], ["c"]),
        helper.make_node("Reshape", ["c", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 1, 3, 4, 2]),
        helper.make_node("Sigmoid", ["t"], ["y"]),
    ], {"x": [1, 4, 5, 6]}, ["y"], {"w": rand(15, 4, 1, 1, seed=1), "b": rand(15, seed=2),
                                    "shape": np.array([1, 3, 5, 5, 6], np.int64)})
    program = check_fused_equals_unfused(model)
    (k,) = fused_instructions(program)
    assert k.op.attrs["kernel"] == "conv_add_reshape_transpose_sigmoid"
    (store,) = [i for i in k.op.module if i.op.name == "store"]
    assert [str(e) for e in store.op.attrs["map"].exprs] == ["0", "(i1 // 5)", "i2", "i3", "(i1 % 5)"]


def test_conv_writes_its_slice_of_a_concat():
    model = make_model([
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["ra"]),
        helper.make_node("Conv", ["x", "w2"], ["b"]),
        helper.make_node("Concat", ["ra", "b"], ["y"], axis=1),
    ], {"x": [1, 3, 6, 6]}, ["y"], {"w1": rand(4, 3, 3, 3, seed=1), "w2": rand(2, 3, 1, 1, seed=2)})
    program = check_fused_equals_unfused(model)
    kernels = fused_instructions(program)
    assert [i.op.name for i in program.main if i.op.name not in ("@param", "@literal")] == \
        ["allocate", "fused", "fused"]
    assert [k.op.attrs["kernel"] for k in kernels] == ["conv_relu", "conv"]
    alloc = next(i for i in program.main if i.op.name == "allocate")
    assert kernels[0].inputs[-1] is alloc and kernels[1].inputs[-1] is kernels[0]
    assert program.main.returns == [kernels[1]]
    stores = [next(i for i in k.op.module if i.op.name == "store") for k in kernels]
    assert [str(e) for e in stores[1].op.attrs["map"].exprs] == ["i0", "i1 + 4", "i2", "i3"]


def test_silu_and_residual_join_the_conv():
    model = make_model([
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["s"]),
        helper.make_node("Mul", ["c", "s"], ["m"]),
        helper.make_node("Add", ["x", "m"], ["y"]),
    ], {"x": [1, 4, 5, 5]}, ["y"], {"w": rand(4, 4, 3, 3, seed=1, scale=0.3), "b": rand(4, seed=2)})
    program = check_fused_equals_unfused(model)
    (k,) = fused_instructions(program)
    assert k.op.attrs["kernel"] == "conv_add_sigmoid_mul"


def _head_kernels(program: Program) -> list[Instruction]:
    return [k for k in fused_instructions(program) if "transpose" in k.op.attrs["kernel"]]


@pytest.mark.parametrize("name,size", [("yolov5s", 640), ("yolov5s-160", 160)])
def test_yolov5_head_is_one_kernel_per_level(name, size):
    program = parse_onnx(name)
    fuse(program)
    heads = _head_kernels(program)
    assert len(heads) == 3
    rows = 0
    for level, k in enumerate(heads):
        g = size // (8 << level)
        ops = sub_ops(k)
        assert ops.count("convolution") == 1 and ops.count("store") == 3  # xy, wh, conf branches
        assert {"sigmoid", "mul", "pow", "add"} <= set(ops)
        assert k.shape.lens == (1, 3 * sum((size // s) ** 2 for s in (8, 16, 32)), 85)
        conv = next(i for i in k.op.module if i.op.name == "convolution")
        # each anchor's 85 channels padded to 128 (pad_channel_groups): channel c = 128 * anchor + column
        assert conv.shape.lens == (1, 384, g, g)
        # each branch stores conv element (0, c, h, w) at row offset + (c // 128) * g*g + h*g + w, column c % 128
        stored = np.zeros((384, g, g), int)
        for st in (i for i in k.op.module if i.op.name == "store"):
            m = st.op.attrs["map"]
            c, h, w = np.meshgrid(np.arange(384), np.arange(g), np.arange(g), indexing="ij")
            mask = np.ones(c.shape, bool)
            grid = {"i0": 0, "i1": c, "i2": h, "i3": w}
            from fusegraph.ops.fused import domain_mask
            mask = domain_mask(st.op.attrs["domain"], grid, c.shape)
            idx = m.evaluate((np.zeros_like(c), c, h, w))
            assert (idx[1][mask] == rows + (c // 128)[mask] * g * g + (h * g + w)[mask]).all()
            assert (idx[2][mask] == (c % 128)[mask]).all()
            stored += mask
        # every real channel is stored exactly once, no padding channel ever
        assert (stored == ((np.arange(384) % 128) < 85)[:, None, None]).all()
        rows += 3 * g * g
    # the three heads write the final output directly, one after the other
    assert program.main.returns == [heads[2]]
    assert heads[2].inputs[-1] is heads[1] and heads[1].inputs[-1] is heads[0]
    assert not any(i.op.name == "concat" for i in program.main)


@pytest.mark.parametrize("name", [
    "yolov5s-160", "yolov5s-bn-160", "light_resnet50", "light_squeezenet", "light_shufflenet",
    "light_inception_v1", "light_inception_v2", "light_densenet121", "light_bvlc_alexnet", "light_zfnet512",
] + exported())
def test_zoo_fused_equals_unfused(name):
    check_fused_equals_unfused(zoo.load(name), tolerance=1e-5)


def test_yolov5s_kernel_budget():
    program = parse_onnx("yolov5s")
    fuse(program)
    # 60 convolutions: the 8 C3 blocks' cv1/cv2 pairs merge (52 conv kernels, 3 of them heads),
    # 3 pools, and the space-to-depth blocks the first convolution reads; the two necks' upsample
    # and concat are read by their convolution's A tile (no copy kernel)
    assert count_kernels(program) <= 56
    kernels = [k.op.attrs["kernel"] for k in program.main if k.op.name == "fused"]
    assert kernels.count("pad") == 1 and kernels.count("copy") == 0
    assert kernels.count("concat_conv_add_sigmoid_mul") == 2
    assert not any(i.op.name in ("concat", "sigmoid", "mul", "add", "convolution") for i in program.main)
