"""GEMM kernels that compute their A operand (prologue fusion), under Triton's interpreter (or
on a GPU): the squeeze-and-excitation scale, a nearest resize and concat read through a select,
and a layernorm whose row statistics the kernel computes before its k loop. Each runs as one
kernel on NaN-poisoned buffers, against the NumPy reference target, in fp32 and fp16."""

from __future__ import annotations

import numpy as np
import pytest

from fusegraph import api, parse_onnx
from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Program
from fusegraph.ir.shape import Shape
from fusegraph.ops.reduce import LayerNorm
from fusegraph.ops.source import add_param
from fusegraph.targets.gpu.templates.gemm_prologue import LANE_STATS_ENV
from tests.gpu.test_gpu_kernels import TOL, _run_configs, check_gpu, node
from tests.helpers import embedding_model, make_model, rand, rel_err

FP16_TOL = 2e-2  # fp16 operands and outputs against the fp32 reference


@pytest.fixture(params=["0", "1"], ids=["chunk-stats", "lane-stats"])
def lane_stats(request, monkeypatch) -> bool:
    """Both ways a deferred prologue takes its statistics (`LANE_STATS_ENV`: lane sums by default)."""
    monkeypatch.setenv(LANE_STATS_ENV, request.param)
    return request.param == "1"


def _lanes_as_set(source: str, lanes: bool) -> None:
    assert ("ln0_s1 += " in source) == lanes


def _check_one_gemm(model, fp16: bool) -> None:
    compiled = check_gpu(model, tolerance=FP16_TOL if fp16 else TOL, fp16=fp16)
    assert [k.src.template for k in compiled.kernels] == ["gemm"]


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("kernel", [1, 3])
def test_conv_of_an_se_scaled_input(kernel, fp16):
    model = make_model([node("Sigmoid", ["s"], ["g"]), node("Mul", ["x", "g"], ["xs"]),
                        node("Conv", ["xs", "w", "b"], ["y"], kernel_shape=[kernel, kernel], pads=[kernel // 2] * 4)],
                       {"x": [1, 16, 5, 6], "s": [1, 16, 1, 1]}, ["y"],
                       {"w": rand(24, 16, kernel, kernel, seed=1, scale=0.3), "b": rand(24, seed=2)})
    _check_one_gemm(model, fp16)


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("channels", [(8, 16), (16, 32)])  # 24 channels: k mixes taps; 48: taps outermost
def test_conv_of_an_upsample_and_concat(channels, fp16):
    ca, cb = channels
    model = make_model([node("Resize", ["a", "", "sc"], ["u"], mode="nearest"), node("Concat", ["u", "b"], ["c"], axis=1),
                        node("Conv", ["c", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
                       {"a": [1, ca, 3, 4], "b": [1, cb, 6, 8]}, ["y"],
                       {"sc": np.array([1, 1, 2, 2], np.float32), "w": rand(8, ca + cb, 3, 3, seed=1, scale=0.3)})
    _check_one_gemm(model, fp16)


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("lens,width", [([1, 7, 48], 48), ([1, 5, 384], 384), ([4, 768], 768)])
def test_layernorm_then_matmul(lens, width, fp16):
    """Rows as wide as a ViT's (384, 768) loop over K in chunks for their statistics."""
    rng = np.random.default_rng(3)
    gamma, beta = 1 + 0.1 * rng.standard_normal(width), 0.1 * rng.standard_normal(width)
    model = make_model([node("LayerNormalization", ["x", "g", "bt"], ["t"], axis=-1, epsilon=1e-5),
                        node("MatMul", ["t", "w"], ["y"])], {"x": lens}, ["y"],
                       {"g": gamma.astype(np.float32), "bt": beta.astype(np.float32), "w": rand(width, 24, seed=1, scale=0.1)})
    _check_one_gemm(model, fp16)


def test_layernorm_then_transpose_then_batched_matmul():
    """Sequence-first rows: the batch index of the product picks the rows' sequence position."""
    model = make_model([node("LayerNormalization", ["x", "g", "bt"], ["t"], axis=-1), node("Transpose", ["t"], ["tt"], perm=[1, 0, 2]),
                        node("MatMul", ["tt", "w"], ["y"])], {"x": [3, 5, 64]}, ["y"],
                       {"g": rand(64, seed=1), "bt": rand(64, seed=2), "w": rand(64, 8, seed=3, scale=0.3)})
    _check_one_gemm(model, False)


@pytest.mark.parametrize("fp16", [False, True])
def test_layernorm_then_gemm_with_bias(fp16):
    model = make_model([node("LayerNormalization", ["x", "g", "bt"], ["t"], axis=-1), node("Gemm", ["t", "w", "c"], ["y"])],
                       {"x": [9, 40]}, ["y"], {"g": rand(40, seed=1), "bt": rand(40, seed=2), "w": rand(40, 24, seed=3, scale=0.3),
                                              "c": rand(24, seed=4)})
    _check_one_gemm(model, fp16)


def test_layernorm_statistics_of_rows_far_from_zero(lane_stats):
    """A mean of 300 and a spread of 1: the chunked statistics keep the variance (no E[x^2] - E[x]^2;
    the lane sums are of values less a shift near the mean)."""
    model = make_model([node("Add", ["x", "shift"], ["xs"]), node("LayerNormalization", ["xs", "g", "bt"], ["t"], axis=-1),
                        node("MatMul", ["t", "w"], ["y"])], {"x": [6, 96]}, ["y"],
                       {"shift": np.full(96, 300.0, np.float32), "g": rand(96, seed=1), "bt": rand(96, seed=2),
                        "w": rand(96, 16, seed=3, scale=0.2)})
    compiled = check_gpu(model, tolerance=1e-4)
    assert [k.src.template for k in compiled.kernels] == ["gemm"]  # the add too, recomputed in both loops
    _lanes_as_set(compiled.kernels[0].src.source, lane_stats)


def test_layernorm_prologue_under_every_default_config():
    """The first candidates (tile sizes and split-k: every program of a split computes the
    statistics of its rows over all of K) and a BK of 32, on fresh inputs against the reference."""
    model = make_model([node("LayerNormalization", ["x", "g", "bt"], ["t"], axis=-1), node("MatMul", ["t", "w"], ["y"])],
                       {"x": [1, 4, 768]}, ["y"], {"g": rand(768, seed=1), "bt": rand(768, seed=2), "w": rand(768, 16, seed=3, scale=0.1)})
    program = parse_onnx(model)
    compiled = api.compile(program, "gpu", tune=False)
    (k,) = compiled.kernels
    configs = k.src.configs[:4] + [c for c in k.src.configs if c["BK"] == 32][:1]
    assert any(c["SPLIT"] > 1 for c in configs) and len(configs) == 5, k.src.configs
    _run_configs(program, compiled, configs, np.random.default_rng(11))


def test_a_normalized_single_row_under_its_sixteen_row_tiles(lane_stats):
    """A classifier on a pooled vector (ConvNeXt's head: one row, layernorm, linear + bias)
    offers 16-row tiles, unsplit and split, to the exhaustive tune: each on fresh inputs
    against the reference."""
    model = make_model([node("LayerNormalization", ["x", "g", "bt"], ["t"], axis=-1), node("MatMul", ["t", "w"], ["m"]),
                        node("Add", ["m", "c"], ["y"])],
                       {"x": [1, 512]}, ["y"], {"g": rand(512, seed=1), "bt": rand(512, seed=2),
                                                "w": rand(512, 40, seed=3, scale=0.1), "c": rand(40, seed=4)})
    program = parse_onnx(model)
    compiled = api.compile(program, "gpu", tune=False)
    (k,) = compiled.kernels
    configs = [c for c in k.src.configs if c["BM"] == 16]
    assert {c["SPLIT"] for c in configs} == {1, 2, 4} and {c["BN"] for c in configs} == {32, 64}, configs
    _lanes_as_set(k.src.source, lane_stats)
    _run_configs(program, compiled, configs, np.random.default_rng())


def test_layernorm_without_affine_on_its_own():
    """A one-input layernorm (its affine folded away) that no product computes runs in the
    reduction template, normalizing only."""
    p = Program()
    x = add_param(p.main, "x", Shape.of(DType.float32, [5, 40]))
    p.main.set_returns([p.main.add(LayerNorm(1, 1e-5), [x])], ["y"])
    compiled = api.compile(p, "gpu", tune=False)
    assert [k.src.template for k in compiled.kernels] == ["reduction"]
    value = np.random.default_rng(2).standard_normal((5, 40)).astype(np.float32)
    compiled.poison()
    got = compiled.run({"x": value})["y"]
    assert rel_err(got, api.run(p, {"x": value})["y"]) <= TOL


@pytest.mark.parametrize("fp16", [False, True])
def test_layernorm_normalized_after_the_product(fp16, lane_stats):
    """Without split-k the kernel multiplies the rows less a shift and corrects the accumulator
    after the k loop (`RowStatistics`, deferred); with split-k it keeps the statistics loop.
    The folded weights' columns sum to zero (`fold_norm_affine`), so the deferred kernel takes
    no column sums of W: the shift's correction vanishes, which only holds with the shift close
    to each row's mean. Rows with a mean of 300 and a spread of 1, K of 520 (a partial last chunk
    of 8), 37 rows: every config the kernel offers of each kind, on fresh inputs, against the
    reference."""
    model = make_model([node("Add", ["x", "shift"], ["xs"]), node("LayerNormalization", ["xs", "g", "bt"], ["t"], axis=-1),
                        node("MatMul", ["t", "w"], ["y"])], {"x": [1, 37, 520]}, ["y"],
                       {"shift": np.full(520, 300.0, np.float32), "g": rand(520, seed=1), "bt": rand(520, seed=2),
                        "w": rand(520, 48, seed=3, scale=0.2)})
    program = parse_onnx(model)
    compiled = api.compile(program, "gpu", tune=False, fp16=fp16)
    (k,) = compiled.kernels
    assert "ln0_shift" in k.src.source and "ln_wsum" not in k.src.source and "for k1 in tl.range(0, 520, BK" in k.src.source
    _lanes_as_set(k.src.source, lane_stats)
    unsplit = [c for c in k.src.configs if c["SPLIT"] == 1]
    split = [c for c in k.src.configs if c["SPLIT"] > 1]
    assert unsplit and split
    rng = np.random.default_rng(12)
    for config in unsplit[:3] + [c for c in unsplit if c["BK"] == 32][:1] + split[:2]:
        k.config = config
        x = rng.standard_normal((1, 37, 520)).astype(np.float32)
        compiled.poison()
        got = compiled.run({"x": x})["y"]
        assert rel_err(got, api.run(program, {"x": x})["y"]) < (FP16_TOL if fp16 else 1e-4), config


def rms_model(rows: int, width: int, shift: float = 0.0, opset: int = 23):
    """RMSNormalization (opset 23) of x + shift, then a product: a decoder's norm before its QKV."""
    return make_model([node("Add", ["x", "shift"], ["xs"]), node("RMSNormalization", ["xs", "g"], ["t"], axis=-1, epsilon=1e-6),
                       node("MatMul", ["t", "w"], ["y"])], {"x": [1, rows, width]}, ["y"],
                      {"shift": np.full(width, shift, np.float32), "g": rand(width, seed=1),
                       "w": rand(width, 40, seed=3, scale=0.2)}, opset=opset)


@pytest.mark.parametrize("fp16", [False, True])
def test_rms_norm_then_matmul_is_one_kernel_under_split_and_unsplit_configs(fp16, lane_stats):
    """An RMS norm's rows keep their mean (here 3, beside a spread of 1, so that centring
    them would show): normalized after the product without split-k, before it with split-k."""
    program = parse_onnx(rms_model(37, 520, shift=3.0))
    compiled = api.compile(program, "gpu", tune=False, fp16=fp16)
    (k,) = compiled.kernels
    assert k.src.kernel_name == "add_rmsnorm_dot" and "ln_wsum" in k.src.source
    _lanes_as_set(k.src.source, lane_stats)
    unsplit = [c for c in k.src.configs if c["SPLIT"] == 1]
    split = [c for c in k.src.configs if c["SPLIT"] > 1]
    assert unsplit and split
    rng = np.random.default_rng(13)
    for config in unsplit[:2] + split[:1]:
        k.config = config
        x = rng.standard_normal((1, 37, 520)).astype(np.float32)
        compiled.poison()
        got = compiled.run({"x": x})["y"]
        assert rel_err(got, api.run(program, {"x": x})["y"]) < (FP16_TOL if fp16 else 1e-4), config


def test_a_computed_operand_is_loaded_a_chunk_ahead():
    """A prologue's loads are issued for the next k chunk while the current one is multiplied
    (gemm_emit `_prefetch_loads`): the first chunk before the loop, the following one inside it,
    the prefetched values used by the product. A raw A operand (pipelined by Triton) and a
    convolution's taps are read in place."""
    rms = api.compile(parse_onnx(rms_model(37, 520, shift=3.0)), "gpu", tune=False).kernels[0].src.source
    head, loop = rms.split("for k0 in range(", 1)
    assert "rk_ahead = pid_k * BK + tl.arange(0, BK)" in head and "rk_ahead = rk + BK * SPLIT" in loop
    prefetched = [line.split("=")[0].strip() for line in loop.splitlines() if line.strip().startswith("pf")]
    assert prefetched and all(f"({name} +" in loop or f" {name})" in loop for name in prefetched)
    plain = make_model([node("MatMul", ["x", "w"], ["y"])], {"x": [1, 37, 520]}, ["y"], {"w": rand(520, 40, seed=1)})
    se = make_model([node("Sigmoid", ["s"], ["g"]), node("Mul", ["x", "g"], ["xs"]),
                     node("Conv", ["xs", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
                    {"x": [1, 16, 5, 6], "s": [1, 16, 1, 1]}, ["y"], {"w": rand(24, 16, 3, 3, seed=1, scale=0.3)})
    for model in (plain, se):
        (kernel,) = api.compile(parse_onnx(model), "gpu", tune=False).kernels
        assert "rk_ahead" not in kernel.src.source


def test_a_misspelt_lane_statistics_setting_is_an_error_naming_it(monkeypatch):
    """`FUSEGRAPH_LANE_STATS=yes` would otherwise leave the default in force without a word."""
    from fusegraph.errors import FusegraphError

    monkeypatch.setenv(LANE_STATS_ENV, "yes")
    model = make_model([node("LayerNormalization", ["x", "g", "bt"], ["t"], axis=-1), node("MatMul", ["t", "w"], ["y"])],
                       {"x": [1, 4, 96]}, ["y"], {"g": rand(96, seed=1), "bt": rand(96, seed=2), "w": rand(96, 8, seed=3)})
    with pytest.raises(FusegraphError, match="FUSEGRAPH_LANE_STATS='yes': use 1 .* or 0"):
        api.compile(parse_onnx(model), "gpu", tune=False)


@pytest.mark.parametrize("fp16", [False, True])
def test_gathered_rows_summed_and_normalized_in_one_kernel(fp16):
    """BERT's embeddings: both lookups run inside the layernorm's row kernel."""
    compiled = check_gpu(embedding_model(), tolerance=FP16_TOL if fp16 else TOL, fp16=fp16)
    assert [(k.src.template, k.src.kernel_name) for k in compiled.kernels] == [("reduction", "gather_add_layernorm")]


def _movement_then_reduction(case: str):
    """One movement op (each finding its elements its own way) read by one reduction."""
    from onnx import TensorProto, helper, numpy_helper

    axes = np.array([1], np.int64)
    nodes, inputs, inits = {
        # a gather along the reduced axis (repeats and a negative index)
        "gather_columns_softmax": ([node("Gather", ["x", "i"], ["g"], axis=2), node("Softmax", ["g"], ["y"], axis=-1)],
                                   {"x": [2, 3, 10]}, {"i": np.array([3, 1, 0, 9, 2, 2, 5, -1], np.int64)}),
        "gather_elements_sum": ([node("GatherElements", ["x", "i"], ["g"], axis=1),
                                 node("ReduceSum", ["g", "axes"], ["y"], keepdims=0)],
                                {"x": [4, 6]}, {"i": np.random.default_rng(0).integers(0, 6, (4, 5)), "axes": axes}),
        "gather_nd_max": ([node("GatherND", ["x", "i"], ["g"]), node("ReduceMax", ["g", "axes"], ["y"], keepdims=1)],
                          {"x": [5, 7]}, {"i": np.array([[0], [3], [4]], np.int64), "axes": axes}),
        "edge_pad_layernorm": ([node("Pad", ["x", "p"], ["q"], mode="edge"),
                                node("LayerNormalization", ["q", "s", "b"], ["y"], axis=-1)],
                               {"x": [3, 4, 9]}, {"p": np.array([0, 0, 0, 0, 0, 3], np.int64), "s": rand(12, seed=1),
                                                  "b": rand(12, seed=2)}),
    }[case]
    graph = helper.make_graph(nodes, case, [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


@pytest.mark.parametrize("case", ["gather_columns_softmax", "gather_elements_sum", "gather_nd_max", "edge_pad_layernorm"])
def test_each_movement_op_inside_a_reduction(case):
    compiled = check_gpu(_movement_then_reduction(case))
    assert [k.src.template for k in compiled.kernels] == ["reduction"]


def test_a_reflect_pad_in_front_of_a_softmax_is_in_its_kernel():
    pads = np.array([0, 0, 1, 0, 0, 2], dtype=np.int64)
    model = make_model([node("Pad", ["x", "p"], ["q"], mode="reflect"), node("Softmax", ["q"], ["y"], axis=-1)],
                       {"x": [2, 3, 10]}, ["y"], {"p": pads})
    compiled = check_gpu(model)
    assert [(k.src.template, k.src.kernel_name) for k in compiled.kernels] == [("reduction", "pad_softmax")]


@pytest.mark.parametrize("fp16", [False, True])
def test_group_norm_and_silu_computed_as_the_conv_loads_its_input(fp16):
    """GroupNorm's statistics in one reduction kernel (each group's mean and 1 / sqrt(var +
    eps), `row_moments`, two stores a row), then one convolution kernel that normalizes, scales,
    shifts and applies SiLU (reading each normalized value twice) to every element it loads."""
    model = make_model([node("GroupNormalization", ["x", "g", "b"], ["n"], num_groups=4, epsilon=1e-5),
                        node("Sigmoid", ["n"], ["s"]), node("Mul", ["n", "s"], ["a"]),
                        node("Conv", ["a", "w", "wb"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
                       {"x": [2, 16, 6, 5]}, ["y"],
                       {"g": rand(16, seed=1), "b": rand(16, seed=2), "w": rand(8, 16, 3, 3, seed=3, scale=0.3),
                        "wb": rand(8, seed=4)}, opset=21)
    compiled = check_gpu(model, tolerance=FP16_TOL if fp16 else TOL, seed=None, fp16=fp16)
    assert [k.src.template for k in compiled.kernels] == ["reduction", "gemm"]
