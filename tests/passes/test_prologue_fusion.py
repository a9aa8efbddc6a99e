"""Prologue fusion (passes/prologue_rule.py through FuseAnchors, passes/fold_norm_affine.py): the
producers of a product's A operand that the rule accepts are computed inside the product's
kernel, so each pattern becomes one fused instruction; what the rule refuses keeps its kernel.
Every case also runs on the ref target, fused against unfused, on fresh random inputs."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from fusegraph import parse_onnx, run
from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction, Module, Program
from fusegraph.ir.shape import Shape
from fusegraph.ir.zero_sum_columns import columns_sum_to_zero
from fusegraph.ops import make_op
from fusegraph.ops.source import add_literal, add_param
from fusegraph.ops.views import MultiBroadcast
from fusegraph.passes.fuse_anchors import FuseAnchors
from fusegraph.passes.pipeline import fuse
from fusegraph.passes.prologue_rule import (NORM_PROLOGUE_ANY_ROWS_K, NORM_PROLOGUE_MAX_ROWS, RECOMPUTE_BUDGET,
                                           STORE_NORMS_ENV, pointwise_ops, reads_per_element)
from tests.helpers import assert_same_results, embedding_model, make_model, op_names, ort_run, rand

TOLERANCE = 1e-6  # the same ops on the same values, in the same order
NORM_TOLERANCE = 1e-5  # folding gamma into the weights rounds the products differently


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


def _conv(m: Module, x: Instruction, out_channels: int, k: int = 1, seed: int = 1) -> Instruction:
    w = add_literal(m, rand(out_channels, x.shape.lens[1], k, k, seed=seed))
    pad = (k // 2,) * 4
    return m.add(make_op("convolution", padding=pad, stride=(1, 1), dilation=(1, 1)), [x, w])


def _se_scaled(m: Module) -> Instruction:
    """x * sigmoid(s), s per (n, c) broadcast over h, w: a squeeze-and-excitation scale."""
    x = add_param(m, "x", Shape.of(DType.float32, [1, 16, 5, 6]))
    s = add_param(m, "s", Shape.of(DType.float32, [1, 16, 1, 1]))
    g = m.add(MultiBroadcast(x.shape.lens), [m.add(make_op("sigmoid"), [s])])
    return m.add(make_op("mul"), [x, g])


def _fused(p: Program) -> list[Instruction]:
    return [i for i in p.main if i.op.name == "fused"]


def _sub_ops(fused: Instruction) -> list[str]:
    return [n for n in op_names(fused.op.module) if n not in ("@param", "load", "allocate", "store")]


def test_cost_rule_counts_reads_per_element_and_ops():
    m = Module()
    xs = _se_scaled(m)
    assert pointwise_ops(xs) == 2  # the mul and the sigmoid, through the broadcast
    assert reads_per_element(_conv(m, xs, 24)) == 1
    assert reads_per_element(_conv(m, xs, 24, k=3)) == 9  # each element under nine taps
    assert reads_per_element(_conv(m, xs, 300)) == 3  # one read per N tile of 128 channels
    a = add_param(m, "a", Shape.of(DType.float32, [2, 6, 16]))
    dot = m.add(make_op("dot"), [a, add_literal(m, rand(2, 16, 200, seed=3))])
    assert reads_per_element(dot) == 2  # batched: its weights' last axis is N, not a window


def test_se_scaled_input_is_computed_in_the_conv():
    def build() -> Program:
        p = Program()
        m = p.main
        m.set_returns([_conv(m, _se_scaled(m), 24)], ["y"])
        return p

    before, after = build(), build()
    assert FuseAnchors().apply(after.main)
    (f,) = _fused(after)
    assert op_names(after.main) == ["@param", "@param", "@literal", "fused"]
    assert f.op.attrs["kernel"] == "sigmoid_mul_conv"
    assert _sub_ops(f) == ["sigmoid", "mul", "convolution"]
    assert_same_results(before, after, tolerance=TOLERANCE)


def _shared_scale(second_kernel: int) -> Program:
    """The SE-scaled tensor read by two convolutions: a 1x1 and one of `second_kernel`."""
    p = Program()
    m = p.main
    xs = _se_scaled(m)
    a = _conv(m, xs, 8, seed=1)
    b = _conv(m, xs, 8, k=second_kernel, seed=2)
    m.set_returns([m.add(make_op("add"), [a, b])], ["y"])
    return p


def test_a_producer_cheap_for_every_reader_is_recomputed_by_each():
    """2 ops x 1 read <= the budget in both 1x1 convolutions: both compute the scale, no mul kernel."""
    before, after = _shared_scale(1), _shared_scale(1)
    assert 2 * 1 <= RECOMPUTE_BUDGET
    assert FuseAnchors().apply(after.main)
    assert [f.op.attrs["kernel"] for f in _fused(after)] == ["sigmoid_mul_conv", "sigmoid_mul_conv_add"]
    assert "mul" not in op_names(after.main)
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_producer_expensive_for_another_reader_keeps_its_kernel():
    """The 3x3 convolution would repeat the scale 9 times per element (2 x 9 > the budget): the
    scale stays outside, both convolutions read it, and the full pipeline gives it its own kernel."""
    before, after = _shared_scale(3), _shared_scale(3)
    assert 2 * 9 > RECOMPUTE_BUDGET
    assert FuseAnchors().apply(after.main)
    assert [f.op.attrs["kernel"] for f in _fused(after)] == ["conv", "conv_add"]
    assert "mul" in op_names(after.main)
    assert_same_results(before, after, tolerance=TOLERANCE)
    fuse(after)
    assert [f.op.attrs["kernel"] for f in _fused(after)] == ["sigmoid_mul", "conv", "conv_add"]
    assert_same_results(before, after, tolerance=TOLERANCE)


def _silu_conv(extra: list | None = None, outputs: tuple[str, ...] = ("y",)):
    """x + c, then SiLU (`y * sigmoid(y)`: y read twice), into a 3x3 convolution."""
    nodes = [node("Add", ["x", "c"], ["h"]), node("Sigmoid", ["h"], ["s"]), node("Mul", ["h", "s"], ["a"]),
             node("Conv", ["a", "w", "wb"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), *(extra or [])]
    return make_model(nodes, {"x": [1, 8, 5, 6]}, list(outputs),
                      {"c": rand(1, 8, 1, 1, seed=1), "w": rand(4, 8, 3, 3, seed=2), "wb": rand(4, seed=3)})


def test_a_value_read_twice_inside_the_prologue_is_computed_there():
    """SiLU reads its input twice; the rule used to see the sigmoid's read as an outside one
    (asked about h before the sigmoid was in) and left h a kernel of its own."""
    before, after = parse_onnx(_silu_conv()), parse_onnx(_silu_conv())
    fuse(after)
    (f,) = _fused(after)
    assert _sub_ops(f) == ["add", "sigmoid", "mul", "convolution", "add"]
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_value_a_reduction_also_reads_is_computed_by_both():
    """h read by the convolution's prologue and by a mean: the mean's kernel computes h again
    from x, so nothing stores h."""
    model = _silu_conv([node("ReduceMean", ["h"], ["m"], axes=[2, 3], keepdims=0)], ("y", "m"))
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    assert [_sub_ops(f) for f in _fused(after)] == [["add", "sigmoid", "mul", "convolution", "add"],
                                                     ["add", "reduce_mean"]]
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_value_an_epilogue_also_reads_keeps_its_kernel():
    """h is also the residual of a second convolution's epilogue, on the way to a mean: that
    epilogue loads h, so h is stored once (its own kernel) and the prologue reads it."""
    extra = [node("Conv", ["y", "w2"], ["y2"], kernel_shape=[1, 1]), node("Add", ["y2", "h"], ["r"]),
             node("ReduceMean", ["r"], ["m"], axes=[2, 3], keepdims=0)]
    model = _silu_conv([*extra], ("m",))
    model.graph.initializer.append(numpy_helper.from_array(rand(8, 4, 1, 1, seed=4), "w2"))
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    assert [_sub_ops(f) for f in _fused(after)] == [["add"], ["sigmoid", "mul", "convolution", "add"],
                                                     ["convolution", "add", "epilogue_sum"]]
    assert_same_results(before, after, tolerance=TOLERANCE)


def _group_norm_silu_conv():
    nodes = [node("GroupNormalization", ["x", "g", "b"], ["n"], num_groups=4, epsilon=1e-5),
             node("Sigmoid", ["n"], ["s"]), node("Mul", ["n", "s"], ["a"]),
             node("Conv", ["a", "w", "wb"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    return make_model(nodes, {"x": [2, 16, 6, 5]}, ["y"],
                      {"g": rand(16, seed=1), "b": rand(16, seed=2), "w": rand(8, 16, 3, 3, seed=3), "wb": rand(8, seed=4)},
                      opset=21)


def test_group_norm_and_silu_are_normalized_in_the_conv_from_one_statistics_kernel():
    """The group statistics are reductions over a group's channels and pixels, which no tile of
    the convolution holds: one kernel computes each group's mean and 1 / sqrt(var + eps)
    (`row_moments`), and the convolution normalizes, scales, shifts and applies SiLU as it
    loads x. Nothing stores a tensor of x's size."""
    before, after = parse_onnx(_group_norm_silu_conv()), parse_onnx(_group_norm_silu_conv())
    fuse(after)
    moments, conv = _fused(after)
    assert _sub_ops(moments)[0] == "row_moments" and moments.shape.lens == (2, 4, 1)
    assert [r.shape.lens for r in moments.op.module.returns] == [(2, 4, 1), (2, 4, 1)]  # the mean and 1 / std
    assert _sub_ops(conv) == ["sub", "mul", "mul", "add", "sigmoid", "mul", "convolution", "add"]
    assert_same_results(before, after, tolerance=NORM_TOLERANCE)
    x = np.random.default_rng().standard_normal((2, 16, 6, 5)).astype(np.float32)
    (want,) = ort_run(_group_norm_silu_conv(), {"x": x})
    (got,) = run(after, {"x": x}).values()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _torch_group_norm_silu_conv():
    """torch.nn.GroupNorm as torch's legacy exporter writes it (opset 17): a Reshape to
    [N, G, -1], InstanceNormalization with unit scale and zero bias per group, a Reshape back,
    then the per-channel Mul and Add; SiLU as Sigmoid and Mul; a 3x3 convolution."""
    nodes = [node("Reshape", ["x", "grouped"], ["g"]), node("InstanceNormalization", ["g", "ones", "zeros"], ["z"], epsilon=1e-5),
             node("Reshape", ["z", "full"], ["zf"]), node("Mul", ["zf", "gamma"], ["zs"]), node("Add", ["zs", "beta"], ["n"]),
             node("Sigmoid", ["n"], ["s"]), node("Mul", ["n", "s"], ["a"]),
             node("Conv", ["a", "w", "wb"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    return make_model(nodes, {"x": [1, 16, 6, 5]}, ["y"],
                      {"grouped": np.array([1, 4, -1], np.int64), "ones": np.ones(4, np.float32),
                       "zeros": np.zeros(4, np.float32), "full": np.array([1, 16, 6, 5], np.int64),
                       "gamma": rand(16, 1, 1, seed=1), "beta": rand(16, 1, 1, seed=2), "w": rand(8, 16, 3, 3, seed=3),
                       "wb": rand(8, seed=4)})


def test_group_norm_as_torch_exports_it_is_one_statistics_kernel_and_the_conv():
    """Four kernels before (mean, variance, the normalized tensor, the convolution), two now."""
    before, after = parse_onnx(_torch_group_norm_silu_conv()), parse_onnx(_torch_group_norm_silu_conv())
    fuse(after)
    moments, conv = _fused(after)
    assert _sub_ops(moments)[0] == "row_moments"
    assert _sub_ops(conv)[-4:] == ["sigmoid", "mul", "convolution", "add"]
    assert_same_results(before, after, tolerance=NORM_TOLERANCE)
    x = np.random.default_rng().standard_normal((1, 16, 6, 5)).astype(np.float32)
    (want,) = ort_run(_torch_group_norm_silu_conv(), {"x": x})
    np.testing.assert_allclose(next(iter(run(after, {"x": x}).values())), want, rtol=1e-4, atol=1e-4)


def _spelled_out_group_norm_conv():
    """GroupNorm as an exporter may spell it: ReduceMean, Sub, Mul, ReduceMean, Add, Sqrt, Div
    over [N, G, C/G * H * W], then a per-channel affine, into a 3x3 convolution."""
    nodes = [node("Reshape", ["x", "grouped"], ["g"]), node("ReduceMean", ["g"], ["m"], axes=[2]),
             node("Sub", ["g", "m"], ["d"]), node("Mul", ["d", "d"], ["d2"]), node("ReduceMean", ["d2"], ["v"], axes=[2]),
             node("Add", ["v", "eps"], ["ve"]), node("Sqrt", ["ve"], ["sd"]), node("Div", ["d", "sd"], ["z"]),
             node("Reshape", ["z", "full"], ["zf"]), node("Mul", ["zf", "gamma"], ["zs"]), node("Add", ["zs", "beta"], ["n"]),
             node("Conv", ["n", "w", "wb"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    return make_model(nodes, {"x": [2, 16, 6, 5]}, ["y"],
                      {"grouped": np.array([2, 4, 120], np.int64), "full": np.array([2, 16, 6, 5], np.int64),
                       "eps": np.array(1e-5, np.float32), "gamma": rand(16, 1, 1, seed=1), "beta": rand(16, 1, 1, seed=2),
                       "w": rand(8, 16, 3, 3, seed=3), "wb": rand(8, seed=4)})


def test_a_pointwise_tail_of_reductions_stays_with_the_reduction():
    """Spelled out, the variance's `sqrt(var + eps)` is one value per group that the
    convolution reads through a broadcast: it joins the variance's kernel (once per group),
    while the centered `x - mean`, which the variance also reads, is computed in both kernels."""
    before, after = parse_onnx(_spelled_out_group_norm_conv()), parse_onnx(_spelled_out_group_norm_conv())
    fuse(after)
    mean, var, conv = _fused(after)
    assert _sub_ops(mean) == ["reduce_mean"]
    assert _sub_ops(var) == ["sub", "mul", "reduce_mean", "add", "sqrt"]
    assert _sub_ops(conv)[:2] == ["sub", "div"] and "sqrt" not in _sub_ops(conv)
    assert_same_results(before, after, tolerance=NORM_TOLERANCE)


def _neck() -> object:
    """Nearest upsample (scale 2) of one map, concatenated with another, into a 3x3 convolution."""
    return make_model([node("Resize", ["a", "", "sc"], ["u"], mode="nearest"), node("Concat", ["u", "b"], ["c"], axis=1),
                       node("Conv", ["c", "w", "wb"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
                      {"a": [1, 8, 3, 4], "b": [1, 16, 6, 8]}, ["y"],
                      {"sc": np.array([1, 1, 2, 2], np.float32), "w": rand(8, 24, 3, 3, seed=1), "wb": rand(8, seed=2)})


def test_resize_and_concat_are_read_by_the_conv_through_a_select():
    before, after = parse_onnx(_neck()), parse_onnx(_neck())
    fuse(after)
    (f,) = _fused(after)
    assert f.op.attrs["kernel"] == "concat_conv_add"
    assert _sub_ops(f) == ["select", "convolution", "add"]
    loads = [str(i.op) for i in f.op.module if i.op.name == "load"][:2]
    assert loads[0].endswith("(i0, i1, (i2 // 2), (i3 // 2)) if 0 <= i1 < 8]")  # the resize's map, under the part's range
    assert loads[1].endswith("(i0, i1 - 8, i2, i3) if 8 <= i1 < 24]")
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_concat_of_kernel_outputs_is_left_to_concat_elimination():
    """Both parts are kernels that can write into the concat's buffer: no select, no copy."""
    m = make_model([node("Conv", ["x", "w1"], ["a"], kernel_shape=[1, 1]), node("Conv", ["z", "w2"], ["b"], kernel_shape=[1, 1]),
                    node("Relu", ["a"], ["ra"]), node("Relu", ["b"], ["rb"]),
                    node("Concat", ["ra", "rb"], ["c"], axis=1), node("Conv", ["c", "w3"], ["y"], kernel_shape=[1, 1])],
                   {"x": [1, 4, 5, 5], "z": [1, 4, 5, 5]}, ["y"], {"w1": rand(8, 4, 1, 1, seed=1), "w2": rand(6, 4, 1, 1, seed=2),
                                                "w3": rand(5, 14, 1, 1, seed=3)})
    before, after = parse_onnx(m), parse_onnx(m)
    fuse(after)
    assert [f.op.attrs["kernel"] for f in _fused(after)] == ["conv_relu", "conv_relu", "conv"]
    assert_same_results(before, after, tolerance=TOLERANCE)


def _layernorm_model(op: str, lens: list[int], k: int, n: int):
    nodes = [node("LayerNormalization", ["x", "g", "b"], ["t"], axis=-1, epsilon=1e-5)]
    literals = {"g": rand(k, seed=1), "b": rand(k, seed=2), "w": rand(k, n, seed=3, scale=0.2)}
    if op == "Gemm":
        nodes.append(node("Gemm", ["t", "w", "c"], ["y"]))
        literals["c"] = rand(n, seed=4)
    else:
        nodes.append(node("MatMul", ["t", "w"], ["y"]))
    return make_model(nodes, {"x": lens}, ["y"], literals)


def test_layernorm_before_matmul_is_normalized_in_the_product_with_the_affine_in_its_weights():
    model = _layernorm_model("MatMul", [1, 7, 48], 48, 20)
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    (f,) = _fused(after)
    assert f.op.attrs["kernel"] == "layernorm_dot_add"  # the add is beta W, the folded shift
    assert _sub_ops(f) == ["layernorm", "dot", "add"]
    (ln,) = [i for i in f.op.module if i.op.name == "layernorm"]
    assert len(ln.inputs) == 1  # gamma and beta are in the weights and the bias now
    assert_same_results(before, after, tolerance=NORM_TOLERANCE)


def _weights_of(fused: Instruction) -> np.ndarray:
    (dot,) = [i for i in fused.op.module if i.op.name == "dot"]
    param = dot.inputs[1].inputs[0]
    k = next(j for j, p in enumerate(fused.op.module.params.values()) if p is param)
    return np.asarray(fused.inputs[k].op.value)


def test_a_centered_norms_folded_weights_have_columns_summing_to_zero():
    """A layernorm's rows sum to zero, so its folded weights are stored centered, each column
    summing to zero (what lets a deferred kernel skip W's column sums); an RMS norm's rows keep
    their mean, so its weights are gamma W as they are."""
    model = _layernorm_model("MatMul", [1, 7, 48], 48, 20)
    after = parse_onnx(model)
    fuse(after)
    (f,) = _fused(after)
    assert columns_sum_to_zero(_weights_of(f))
    rms = make_model([node("RMSNormalization", ["x", "g"], ["t"], axis=-1), node("MatMul", ["t", "w"], ["y"])],
                     {"x": [6, 32]}, ["y"], {"g": rand(32, seed=1), "w": rand(32, 8, seed=3)}, opset=23)
    after = parse_onnx(rms)
    fuse(after)
    (f,) = _fused(after)
    assert not columns_sum_to_zero(_weights_of(f))


def test_layernorm_before_gemm_with_bias_gives_one_bias_add():
    model = _layernorm_model("Gemm", [9, 40], 40, 24)
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    (f,) = _fused(after)
    assert _sub_ops(f) == ["layernorm", "dot", "add"]
    assert_same_results(before, after, tolerance=NORM_TOLERANCE)


def _norm_with_a_relu_reader():
    return make_model([node("LayerNormalization", ["x", "g", "b"], ["t"], axis=-1), node("MatMul", ["t", "w"], ["y"]),
                       node("Relu", ["t"], ["z"])], {"x": [6, 32]}, ["y", "z"],
                      {"g": rand(32, seed=1), "b": rand(32, seed=2), "w": rand(32, 8, seed=3)})


def test_layernorm_with_another_kind_of_reader_keeps_its_kernel_by_default():
    """The relu needs the normalized tensor too: storing it from the product measured slower
    than the norm's own kernel (`prologue_rule.STORE_NORMS_ENV`), so the norm (with the relu)
    is a kernel of its own and the product reads what it writes."""
    model = _norm_with_a_relu_reader()
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    norm, product = _fused(after)
    assert norm.op.attrs["kernel"].startswith("layernorm") and "dot" in product.op.attrs["kernel"]
    assert "layernorm" not in product.op.attrs["kernel"]
    assert_same_results(before, after, tolerance=NORM_TOLERANCE)


def test_layernorm_keeping_its_kernel_is_not_folded_into_the_product():
    """Folded, the norm's kernel would store the bare norm for the product and its affine for
    the relu: two tensors. Unfolded it stores the affine norm once (beside the relu, its other
    output) and the product reads that with its own weights, unscaled."""
    model = _norm_with_a_relu_reader()
    p = parse_onnx(model)
    fuse(p)
    norm, product = _fused(p)
    (ln,) = [i for i in norm.op.module if i.op.name == "layernorm"]
    assert len(ln.inputs) == 3  # gamma and beta applied by the norm itself
    assert sorted(r.inputs[1].op.name for r in norm.op.module.returns) == ["layernorm", "relu"]
    assert product.op.attrs["kernel"] == "dot"  # no bias: beta W was not folded in
    (w,) = [i for i in product.inputs if i.op.name == "@literal"]
    assert np.array_equal(w.op.value, rand(32, 8, seed=3))


def test_layernorm_with_another_kind_of_reader_is_computed_by_the_product_and_stored_on_request(monkeypatch):
    """With `STORE_NORMS_ENV` set, the affine moves into the product's weights and bias, the
    product computes the norm, and the relu of norm * gamma + beta (pointwise ops on the norm
    and constants, all its other readers) is computed there too and stored as a further output:
    one kernel, no layernorm of its own (tests/passes/test_prologue_layernorm_store.py)."""
    monkeypatch.setenv(STORE_NORMS_ENV, "1")
    model = _norm_with_a_relu_reader()
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    (product,) = _fused(after)
    assert product.op.attrs["kernel"] == "layernorm_dot_add"
    (ln,) = [i for i in product.op.module if i.op.name == "layernorm"]
    assert len(ln.inputs) == 1 and len(product.op.module.returns) == 2
    assert product.op.module.returns[1].inputs[1].op.name == "relu"
    assert after.main.returns[1].op.name == "fused_output" and after.main.returns[1].inputs == [product]
    assert_same_results(before, after, tolerance=NORM_TOLERANCE)


def test_layernorm_keeps_its_kernel_in_front_of_a_product_with_many_long_rows():
    """Past `NORM_PROLOGUE_MAX_ROWS` rows longer than `NORM_PROLOGUE_ANY_ROWS_K`, the product's
    tiles would each compute the statistics again at a cost above the norm's own kernel: the
    norm is a kernel, the product a plain one. Short rows stay inside at any count."""
    long_k, short_k = NORM_PROLOGUE_ANY_ROWS_K + 8, NORM_PROLOGUE_ANY_ROWS_K
    for rows, k, inside in [(NORM_PROLOGUE_MAX_ROWS, long_k, True), (NORM_PROLOGUE_MAX_ROWS + 1, long_k, False),
                            (4 * NORM_PROLOGUE_MAX_ROWS, short_k, True)]:
        model = _layernorm_model("MatMul", [1, rows, k], k, 8)
        after = parse_onnx(model)
        fuse(after)
        kernels = [f.op.attrs["kernel"] for f in _fused(after)]
        assert (kernels == ["layernorm_dot_add"]) == inside, (rows, k, kernels)
        assert len(kernels) == (1 if inside else 2)


def _layernorm_transpose_matmul(perm: list[int]):
    return make_model([node("LayerNormalization", ["x", "g", "b"], ["t"], axis=-1), node("Transpose", ["t"], ["tt"], perm=perm),
                       node("MatMul", ["tt", "w"], ["y"])], {"x": [3, 5, 32]}, ["y"],
                      {"g": rand(32, seed=1), "b": rand(32, seed=2), "w": rand(32 if perm[-1] == 2 else 5, 8, seed=3)})


def test_layernorm_read_through_a_transpose_of_its_leading_axes_is_in_the_product():
    """Sequence-first attention transposes the normalized rows before its projection: each row
    stays whole, so the product still normalizes it."""
    model = _layernorm_transpose_matmul([1, 0, 2])
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    (f,) = _fused(after)
    assert _sub_ops(f) == ["layernorm", "dot", "add"]
    assert_same_results(before, after, tolerance=NORM_TOLERANCE)


def test_layernorm_whose_rows_a_transpose_breaks_keeps_its_kernel():
    """A product summing across rows (the normalized axis moved away from K) cannot normalize."""
    model = _layernorm_transpose_matmul([0, 2, 1])
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    kernels = [f.op.attrs["kernel"] for f in _fused(after)]
    assert len(kernels) == 2 and kernels[0].startswith("layernorm")
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_rms_norm_is_computed_inside_the_product():
    """RMSNormalization arrives as one rmsnorm op, a layernorm that does not center: its
    scale folds into the weights and the product computes the rows' mean square itself, so
    there is one kernel and the normalized tensor is never written."""
    model = make_model([node("RMSNormalization", ["x", "g"], ["t"], axis=-1), node("MatMul", ["t", "w"], ["y"])],
                       {"x": [6, 32]}, ["y"], {"g": rand(32, seed=1), "w": rand(32, 8, seed=3)}, opset=23)
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    (product,) = _fused(after)
    assert product.op.attrs["kernel"] == "rmsnorm_dot" and _sub_ops(product)[-2:] == ["rmsnorm", "dot"]
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_gathers_in_front_of_a_layernorm_are_computed_in_its_kernel():
    """BERT's embeddings: the two row lookups find their rows inside the layernorm's kernel,
    which reads each element once, instead of each writing a tensor of its own."""
    model = embedding_model()
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    (f,) = _fused(after)
    assert f.op.attrs["kernel"] == "gather_add_layernorm"
    assert _sub_ops(f) == ["gather", "gather", "add", "add", "layernorm"]
    rng = np.random.default_rng()
    ids = {"ids": rng.integers(-50, 50, (2, 8)), "tt": rng.integers(-4, 4, (2, 8))}  # negatives count from the end
    assert_same_results(before, after, tolerance=TOLERANCE, inputs=ids)


def test_a_gather_read_through_a_view_keeps_its_kernel():
    """Only a gather read where it writes joins the reduction: through a transpose its rows
    would be found at another index, so it stays a kernel of its own."""
    model = make_model([node("Gather", ["table", "ids"], ["g"]), node("Transpose", ["g"], ["t"], perm=[0, 2, 1]),
                        node("Softmax", ["t"], ["y"], axis=-1)], {"ids": [2, 8]}, ["y"], {"table": rand(10, 6, seed=1)},
                       dtype=TensorProto.INT64)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    assert [f.op.attrs["kernel"] for f in _fused(after)] == ["gather", "softmax"]
    assert_same_results(before, after, tolerance=TOLERANCE, inputs={"ids": np.random.default_rng().integers(0, 10, (2, 8))})
