"""passes/defer_norm.py: a layernorm (or RMS norm) that would keep its own kernel in front of the
products reading it becomes a `row_rstd` kernel (one value per row) and products that read x
itself and scale their rows by it. Structure before and after on small programs, and equal
results on the ref target, fused against unfused, on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from fusegraph import parse_onnx
from fusegraph.api import run as ref_run
from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Program
from fusegraph.ir.shape import Shape
from fusegraph.ops.reduce import LayerNorm, RowRstd
from fusegraph.ops.source import add_param
from fusegraph.passes.defer_norm import DeferNorm
from fusegraph.passes.pipeline import fuse
from fusegraph.passes.prologue_rule import NORM_PROLOGUE_ANY_ROWS_K, NORM_PROLOGUE_MAX_ROWS
from tests.helpers import assert_same_results, make_model, op_names, rand, rel_err

ROWS, K = NORM_PROLOGUE_MAX_ROWS + 44, NORM_PROLOGUE_ANY_ROWS_K + 16  # past what a product normalizes itself
TOLERANCE = 1e-5  # the rows summed raw, then scaled: float32 rounding of a different order


@pytest.fixture(autouse=True)
def deferring(monkeypatch):
    """The rule is off by default (`DEFER_NORMS_ENV`, default `free`): these tests turn it on."""
    from fusegraph.passes.defer_norm import DEFER_NORMS_ENV
    monkeypatch.setenv(DEFER_NORMS_ENV, "1")


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


def _norm_then_products(norm: str = "LayerNormalization", rows: int = ROWS, k: int = K, extra: list | None = None,
                        outputs: tuple[str, ...] = ("y", "z")):
    """x -> norm -> (MatMul + bias, MatMul): two products reading one norm."""
    attrs = {"axis": -1, "epsilon": 1e-5}
    inputs = ["x", "g", "b"] if norm == "LayerNormalization" else ["x", "g"]
    nodes = [node(norm, inputs, ["t"], **attrs), node("MatMul", ["t", "w"], ["m"]), node("Add", ["m", "c"], ["y"]),
             node("MatMul", ["t", "v"], ["z"])] + (extra or [])
    literals = {"g": 1 + 0.1 * rand(k, seed=1), "b": rand(k, seed=2), "w": rand(k, 24, seed=3, scale=0.2),
                "c": rand(24, seed=4), "v": rand(k, 8, seed=5, scale=0.2)}
    if norm != "LayerNormalization":
        del literals["b"]
    return make_model(nodes, {"x": [1, rows, k]}, list(outputs), literals, opset=23 if norm != "LayerNormalization" else 17)


def _kernels(p: Program) -> list[str]:
    return [i.op.attrs["kernel"] for i in p.main if i.op.name == "fused"]


def test_a_norm_with_many_long_rows_becomes_row_statistics_and_scaled_products():
    model = _norm_then_products()
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    # (returned results: siblings that merge stay apart, `merge_siblings`); beta W is each one's bias
    assert sorted(_kernels(after)) == ["dot_mul_add", "dot_mul_add", "row_rstd"]
    for product in [i for i in after.main if i.op.name == "fused" and i.op.attrs["kernel"].startswith("dot")]:
        assert product.inputs[0].op.name == "@param"  # x itself, not a normalized tensor
        assert "layernorm" not in op_names(product.op.module) and op_names(product.op.module).count("mul") == 1
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_the_pass_alone_rewrites_the_norm_and_leaves_short_or_few_rows_to_the_product():
    """Before fusion: the layernorm is gone, one row_rstd serves both products. With rows the
    product normalizes itself (few of them, or short), the pass leaves the norm alone."""
    from fusegraph.passes.pipeline import canonicalize_passes
    from fusegraph.passes.manager import run_passes

    p = parse_onnx(_norm_then_products())
    run_passes(p, canonicalize_passes())
    names = op_names(p.main)
    assert "layernorm" not in names and names.count("row_rstd") == 1 and names.count("dot") == 2
    for rows, k in [(NORM_PROLOGUE_MAX_ROWS, K), (ROWS, NORM_PROLOGUE_ANY_ROWS_K)]:
        p = parse_onnx(_norm_then_products(rows=rows, k=k))
        run_passes(p, canonicalize_passes())
        assert "row_rstd" not in op_names(p.main) and "layernorm" in op_names(p.main)


def test_rms_norm_is_deferred_without_centered_weights():
    model = _norm_then_products("RMSNormalization")
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    assert sorted(_kernels(after)) == ["dot_mul", "dot_mul_add", "row_rstd"]
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_norm_another_kind_of_op_reads_keeps_its_kernel():
    """A relu of the norm needs the normalized values themselves: nothing is deferred."""
    model = _norm_then_products(extra=[node("Relu", ["t"], ["r"])], outputs=("y", "z", "r"))
    after = parse_onnx(model)
    fuse(after)
    assert "row_rstd" not in op_names(after.main)
    assert any(k.startswith("layernorm") for k in _kernels(after))


def test_rows_far_from_zero_keep_their_accuracy():
    """A mean of 300 and a spread of 1: the products sum raw rows whose centered sums vanish;
    float32 carries the cancelling terms (against float64, the error stays near float32's)."""
    model = _shifted_rows(["y", "xs"])  # xs returned too: stored anyway
    after = parse_onnx(model)
    fuse(after)
    assert sorted(_kernels(after)) == ["add", "add_row_rstd", "dot_mul_add"]  # the statistics recompute the add
    x = np.random.default_rng().standard_normal((1, ROWS, K)).astype(np.float32)
    want = parse_onnx(model)
    got = ref_run(after, {"x": x})["y"]
    exact = _float64_reference(x + 300.0, model)
    assert rel_err(got, exact) < 1e-4
    assert rel_err(ref_run(want, {"x": x})["y"], exact) < 1e-4


def _shifted_rows(outputs: list[str]):
    return make_model([node("Add", ["x", "shift"], ["xs"]), node("LayerNormalization", ["xs", "g", "b"], ["t"], axis=-1),
                       node("MatMul", ["t", "w"], ["y"])], {"x": [1, ROWS, K]}, outputs,
                      {"shift": np.full(K, 300.0, np.float32), "g": 1 + 0.1 * rand(K, seed=1), "b": rand(K, seed=2),
                       "w": rand(K, 16, seed=3, scale=0.2)})


def test_a_pointwise_input_only_the_norm_reads_keeps_the_norm():
    """x + shift read by the norm alone is computed inside the norm's kernel; deferred, it would
    need a kernel of its own for the product to read: the norm stays."""
    after = parse_onnx(_shifted_rows(["y"]))
    fuse(after)
    assert sorted(_kernels(after)) == ["add_layernorm", "dot_add"]


def _float64_reference(xs: np.ndarray, model) -> np.ndarray:
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    x = xs.astype(np.float64)
    t = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    return (t * inits["g"] + inits["b"]) @ inits["w"].astype(np.float64)


def test_row_rstd_reference_and_shape():
    """The op alone: float32 statistics of a float16 input, two-pass variance."""
    p = Program()
    x = add_param(p.main, "x", Shape.of(DType.float16, [3, 5, 40]))
    r = p.main.add(RowRstd(2, 1e-5), [x])
    assert r.shape.lens == (3, 5, 1) and r.shape.dtype == DType.float32
    p.main.set_returns([r], ["r"])
    value = (np.random.default_rng().standard_normal((3, 5, 40)) * 3 + 7).astype(np.float16)
    got = ref_run(p, {"x": value})["r"]
    wide = value.astype(np.float64)
    assert rel_err(got, 1 / np.sqrt(wide.var(-1, keepdims=True) + 1e-5)) < 1e-6
    rms = RowRstd(2, 1e-5, center=False).reference([value])
    assert rel_err(rms, 1 / np.sqrt((wide * wide).mean(-1, keepdims=True) + 1e-5)) < 1e-6


def test_deferring_is_a_no_op_on_a_norm_it_does_not_take():
    p = Program()
    x = add_param(p.main, "x", Shape.of(DType.float32, [ROWS, K]))
    p.main.set_returns([p.main.add(LayerNorm(1, 1e-5), [x])], ["y"])  # returned: nothing reads it as A
    assert not DeferNorm().apply(p.main)


def residual_block(rows: int = ROWS, k: int = K, reshaped: bool = False):
    """h = x W1 + c + x (a product with its residual, h read twice), then layernorm(h) W2 + h:
    a pre-norm transformer's sub-block boundary. `reshaped`: h is the sum's rows reshaped to
    [rows, k] (a view as the stored value, as Swin's window merge is)."""
    nodes = [node("MatMul", ["x", "w1"], ["m1"]), node("Add", ["m1", "c"], ["a"]), node("Add", ["a", "x"], ["s"])]
    nodes += [node("Reshape", ["s", "rows"], ["h"])] if reshaped else [node("Identity", ["s"], ["h"])]
    nodes += [node("LayerNormalization", ["h", "g", "b"], ["t"], axis=-1, epsilon=1e-5), node("MatMul", ["t", "w2"], ["m2"]),
              node("Add", ["m2", "h"], ["y"])]
    return make_model(nodes, {"x": [1, rows, k]}, ["y"],
                      {"w1": rand(k, k, seed=1, scale=0.1), "c": rand(k, seed=2), "g": 1 + 0.1 * rand(k, seed=3),
                       "b": rand(k, seed=4), "w2": rand(k, k, seed=5, scale=0.1), "rows": np.array([rows, k], np.int64)})


@pytest.mark.parametrize("reshaped", [False, True])
def test_the_statistics_join_the_epilogue_of_the_product_that_writes_the_rows(reshaped):
    """Two kernels: the first product stores h and its rows' statistics (a further output), the
    second reads h raw, scales its rows and adds h back. A view of the sum stored beside the
    statistics stays in the group (they rearrange nothing)."""
    model = residual_block(reshaped=reshaped)
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    first, second = [i for i in after.main if i.op.name == "fused"]
    assert first.op.attrs["kernel"] == ("dot_add_reshape_row_rstd" if reshaped else "dot_add_row_rstd")
    assert second.op.attrs["kernel"] == "dot_mul_add"
    assert "epilogue_row_stat" in op_names(first.op.module)
    further = next(i for i in after.main if i.op.name == "fused_output")
    assert further.inputs == [first]
    values = {x.shape.lens: x for x in (first, further)}  # h, and its rows' 1 / std in float32
    rows = (ROWS,) if reshaped else (1, ROWS)
    assert set(values) == {(*rows, K), (*rows, 1)} and values[(*rows, 1)].shape.dtype == DType.float32
    assert first in second.inputs and further in second.inputs
    assert_same_results(before, after, tolerance=TOLERANCE)


def post_norm_block(rows: int = 128, k: int = 320):
    """BERT's sub-block boundary: n = layernorm(x W1 + c1 + x), then n W2 + c2 + n: the norm
    read by a product and by the residual add after it. Rows wider than the widest run an
    epilogue layernorm takes (`reduction_epilogue.MAX_RUN`), as BERT's 768."""
    nodes = [node("MatMul", ["x", "w1"], ["m1"]), node("Add", ["m1", "c1"], ["a"]), node("Add", ["a", "x"], ["h"]),
             node("LayerNormalization", ["h", "g", "b"], ["n"], axis=-1, epsilon=1e-12), node("MatMul", ["n", "w2"], ["m2"]),
             node("Add", ["m2", "c2"], ["o"]), node("Add", ["o", "n"], ["y"])]
    return make_model(nodes, {"x": [1, rows, k]}, ["y"],
                      {"w1": rand(k, k, seed=1, scale=0.1), "c1": rand(k, seed=2), "g": 1 + 0.1 * rand(k, seed=3),
                       "b": rand(k, seed=4), "w2": rand(k, k, seed=5, scale=0.1), "c2": rand(k, seed=6)})


def test_a_post_norm_is_deferred_at_any_row_count_and_its_residual_normalizes_as_it_reads():
    """Few rows (a product could normalize them itself, but the residual add needs the values
    too): the first product stores h and its rows' mean and 1 / std, the second reads h raw,
    scales its rows, and its epilogue computes (h - mean) * rstd * g + b for the residual."""
    model = post_norm_block()
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    first, second = [i for i in after.main if i.op.name == "fused"]
    assert first.op.attrs["kernel"] == "dot_add_row_rstd_row_mean"
    assert sorted(op_names(first.op.module)).count("epilogue_row_stat") == 2
    inner = op_names(second.op.module)
    assert "layernorm" not in inner and inner.count("dot") == 1 and {"sub", "mul"} <= set(inner)
    assert len([i for i in after.main if i.op.name == "fused_output"]) == 2  # h and one statistic beside the group's value
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_the_setting_turns_deferral_off_or_on_where_the_product_would_normalize(monkeypatch):
    """Unset (`free`, which defers only after depthwise convolutions) or FUSEGRAPH_DEFER_NORMS=0:
    these norms keep their kernels (measured faster than deferred); =all: few rows are deferred
    too, instead of normalized in the product."""
    from fusegraph.passes.defer_norm import DEFER_NORMS_ENV
    for setting in (None, "0"):
        if setting is None:
            monkeypatch.delenv(DEFER_NORMS_ENV)
        else:
            monkeypatch.setenv(DEFER_NORMS_ENV, setting)
        for model in (_norm_then_products(), post_norm_block(), norm_then_conv()):
            after = parse_onnx(model)
            fuse(after)
            assert not any("row_" in k for k in _kernels(after)) and any("layernorm" in k for k in _kernels(after))
    monkeypatch.setenv(DEFER_NORMS_ENV, "all")
    model = _norm_then_products(rows=NORM_PROLOGUE_MAX_ROWS)
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    assert "row_rstd" in _kernels(after) and not any("layernorm" in k for k in _kernels(after))
    assert_same_results(before, after, tolerance=TOLERANCE)


def norm_then_conv(kernel: int = 2, stride: int = 2, pad: int = 0, side: int = 8, k: int = 320):
    """ConvNeXt's downsampling: h = x W + c + x over channels-last pixels, layernorm(h) over
    the channels (its affine kept), back to channels-first, and a convolution (2x2 of stride
    2, or 3x3 padded: the normalized value must be zero in the padding, not beta)."""
    nodes = [node("MatMul", ["x", "w1"], ["m1"]), node("Add", ["m1", "c1"], ["a"]), node("Add", ["a", "x"], ["h"]),
             node("LayerNormalization", ["h", "g", "b"], ["n"], axis=-1, epsilon=1e-6),
             node("Transpose", ["n"], ["t"], perm=[0, 3, 1, 2]),
             node("Conv", ["t", "wc", "cc"], ["y"], kernel_shape=[kernel, kernel], strides=[stride, stride],
                  pads=[pad] * 4)]
    return make_model(nodes, {"x": [1, side, side, k]}, ["y"],
                      {"w1": rand(k, k, seed=1, scale=0.1), "c1": rand(k, seed=2), "g": 1 + 0.1 * rand(k, seed=3),
                       "b": rand(k, seed=4), "wc": rand(16, k, kernel, kernel, seed=5, scale=0.05), "cc": rand(16, seed=6)})


@pytest.mark.parametrize("kernel,stride,pad", [(2, 2, 0), (3, 1, 1)])
def test_a_norm_read_by_a_convolution_is_normalized_in_its_loads(kernel, stride, pad):
    """The norm's own kernel is gone: the product writing h stores its rows' mean and 1 / std
    too, and the convolution computes (h - mean) * rstd * g + b in its A loads, zero in the
    padding (a row scale cannot move past a window, whose K spans several pixels)."""
    model = norm_then_conv(kernel, stride, pad)
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    first, second = [i for i in after.main if i.op.name == "fused"]
    assert first.op.attrs["kernel"] == "dot_add_row_rstd_row_mean"
    inner = op_names(second.op.module)
    assert "convolution" in inner and "layernorm" not in inner and {"sub", "mul", "add"} <= set(inner)
    assert first in second.inputs
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_norm_read_by_a_convolution_keeps_its_kernel_where_its_input_is_no_epilogue_value():
    """x a program input: the statistics would need a kernel of their own, so the norm keeps its."""
    nodes = [node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1, epsilon=1e-6),
             node("Transpose", ["n"], ["t"], perm=[0, 3, 1, 2]),
             node("Conv", ["t", "wc"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    model = make_model(nodes, {"x": [1, 8, 8, K]}, ["y"], {"g": 1 + 0.1 * rand(K, seed=3), "b": rand(K, seed=4),
                                                            "wc": rand(16, K, 2, 2, seed=5, scale=0.05)})
    after = parse_onnx(model)
    fuse(after)
    assert "row_rstd" not in op_names(after.main) and any("layernorm" in k for k in _kernels(after))


def convnext_block(channels: int = 96, side: int = 9, permuted: bool = True, kernel: int = 7):
    """ConvNeXt's block head: a 7x7 depthwise convolution (+ bias), to channels-last, layernorm
    over the channels (affine), a linear layer + bias, GELU. `permuted=False`: the norm reads
    the convolution's output channels-first, over its last spatial axis instead."""
    nodes = [node("Conv", ["x", "wd", "cd"], ["d"], kernel_shape=[kernel, kernel], pads=[kernel // 2] * 4, group=channels)]
    nodes += [node("Transpose", ["d"], ["t"], perm=[0, 2, 3, 1])] if permuted else [node("Identity", ["d"], ["t"])]
    width = channels if permuted else side
    nodes += [node("LayerNormalization", ["t", "g", "b"], ["n"], axis=-1, epsilon=1e-6), node("MatMul", ["n", "w"], ["m"]),
              node("Add", ["m", "c"], ["a"]), node("Gelu", ["a"], ["y"])]
    return make_model(nodes, {"x": [1, channels, side, side]}, ["y"],
                      {"wd": rand(channels, 1, kernel, kernel, seed=1, scale=0.2), "cd": rand(channels, seed=2),
                       "g": 1 + 0.1 * rand(width, seed=3), "b": rand(width, seed=4), "w": rand(width, 64, seed=5, scale=0.1),
                       "c": rand(64, seed=6)}, opset=20)


@pytest.mark.parametrize("setting", [None, "free", "1"])
def test_a_norm_after_a_depthwise_convolution_takes_its_statistics_from_its_tile(monkeypatch, setting):
    """Unset (the default) or FUSEGRAPH_DEFER_NORMS=free or 1: the depthwise kernel, whose tile
    then holds every channel of its pixels, stores the rows' 1 / std beside them (no rendezvous,
    no kernel of their own), and the product reads them raw and scales its rows, for few and
    short rows."""
    from fusegraph.passes.defer_norm import DEFER_NORMS_ENV
    if setting is None:
        monkeypatch.delenv(DEFER_NORMS_ENV)
    else:
        monkeypatch.setenv(DEFER_NORMS_ENV, setting)
    model = convnext_block()
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    assert _kernels(after) == ["conv_add_transpose_row_rstd", "dot_mul_add_erf"]
    first, second = [i for i in after.main if i.op.name == "fused"]
    assert "epilogue_row_stat" in op_names(first.op.module) and "layernorm" not in op_names(second.op.module)
    assert_same_results(before, after, tolerance=TOLERANCE)


@pytest.mark.parametrize("case", ["off", "channels-first", "too many channels"])
def test_a_norm_after_a_depthwise_convolution_keeps_its_place_where_no_tile_holds_its_rows(monkeypatch, case):
    """FUSEGRAPH_DEFER_NORMS=0; under `free`, a norm over the convolution's last spatial axis
    (its rows are no tile's) or more channels than a tile takes
    (`reduction_epilogue.WHOLE_ROW_CHANNELS`): the product normalizes the rows itself."""
    from fusegraph.passes.defer_norm import DEFER_NORMS_ENV
    from fusegraph.passes.reduction_epilogue import WHOLE_ROW_CHANNELS
    if case == "off":
        monkeypatch.setenv(DEFER_NORMS_ENV, "0")
    else:
        monkeypatch.setenv(DEFER_NORMS_ENV, "free")
    model = {"off": convnext_block(), "channels-first": convnext_block(permuted=False),
             "too many channels": convnext_block(channels=WHOLE_ROW_CHANNELS + 8, side=2)}[case]
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    kernels = _kernels(after)
    assert len(kernels) == 2 and not any("row_" in k for k in kernels) and "layernorm" in kernels[1], kernels
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_misspelt_setting_is_an_error_that_names_the_variable_and_its_values(monkeypatch):
    from fusegraph.errors import ArgumentError
    from fusegraph.passes.defer_norm import DEFER_NORMS_ENV
    monkeypatch.setenv(DEFER_NORMS_ENV, "yes")
    with pytest.raises(ArgumentError, match=r"FUSEGRAPH_DEFER_NORMS='yes'.*free"):
        fuse(parse_onnx(convnext_block()))
