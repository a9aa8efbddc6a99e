"""The GPU target's kernels, run under Triton's interpreter on the CPU (or on a GPU if present).

Each test builds a small model that exercises one template (flat, GEMM for convolutions and
matrix products, windows, reductions, data movement) with its prologue and epilogue, compiles
it for the gpu target, poisons every buffer with NaN, runs it, and compares with the NumPy
reference target on fresh random inputs. Shapes are small so the interpreter stays fast.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from fusegraph import api, parse_onnx
from tests.helpers import make_model, rand, rel_err

TOL = 2e-5  # fp32 with exact (interpreter) or ieee (GPU) products


def check_gpu(model, tolerance: float = TOL, seed: int = 5, dtype=np.float32, **options):
    program = parse_onnx(model)
    compiled = api.compile(program, "gpu", tune=False, **options)
    rng = np.random.default_rng(seed)
    inputs = {}
    for name, shape in program.input_shapes.items():
        if shape.dtype.is_float:
            inputs[name] = rng.standard_normal(shape.lens).astype(shape.dtype.numpy)
        else:
            inputs[name] = rng.integers(0, 3, shape.lens).astype(shape.dtype.numpy)
    want = api.run(program, inputs)
    compiled.poison()
    got = compiled.run(inputs)
    for name in want:
        g = np.asarray(got[name])
        if g.dtype.kind == "f":
            assert not np.isnan(g).any(), f"{name}: {np.isnan(g).sum()} elements left unwritten (NaN)"
            assert rel_err(g, want[name]) <= tolerance, f"{name}: {rel_err(g, want[name])}"
        else:
            np.testing.assert_array_equal(g, want[name])
    return compiled


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


def test_pointwise_through_transpose():
    m = make_model([node("Exp", ["x"], ["e"]), node("Transpose", ["e"], ["t"], perm=[0, 2, 1]),
                    node("Add", ["t", "b"], ["a"]), node("Sigmoid", ["a"], ["y"])],
                   {"x": [2, 3, 5]}, ["y"], {"b": rand(5, 3, seed=1)})
    c = check_gpu(m)
    assert [k.src.template for k in c.kernels] == ["flat"]


@pytest.mark.parametrize("kernel,stride,pads,dilation,group,cin,cout", [
    (1, 1, 0, 1, 1, 8, 16),
    (3, 1, 1, 1, 1, 4, 20),
    (3, 2, 1, 1, 1, 6, 8),
    (6, 2, 2, 1, 1, 3, 16),
    (3, 1, 2, 2, 1, 4, 8),
    (3, 1, 1, 1, 2, 8, 8),
    (3, 1, 1, 1, 8, 8, 80),  # one input channel per group, too many outputs each for the depthwise template
    (3, 2, 1, 1, 1, 32, 24),  # channels in chunks of 16/32: taps outermost
    (3, 1, 1, 1, 2, 64, 32),
    (1, 1, 0, 1, 1, 8, 20),  # 20 output channels: rows unaligned, weights keep ONNX's order
])
def test_conv_silu(kernel, stride, pads, dilation, group, cin, cout):
    w = rand(cout, cin // group, kernel, kernel, seed=2, scale=0.3)
    m = make_model([node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[kernel, kernel], strides=[stride, stride],
                         pads=[pads] * 4, dilations=[dilation, dilation], group=group),
                    node("Sigmoid", ["c"], ["s"]), node("Mul", ["c", "s"], ["y"])],
                   {"x": [1, cin, 9, 11]}, ["y"], {"w": w, "b": rand(cout, seed=3)})
    c = check_gpu(m)
    assert [k.src.template for k in c.kernels] == ["gemm"]
    # weights stored [kh, kw, C, M] (output channels contiguous) when each group's rows align
    n_major = (cout // group) % 8 == 0
    weights = [b for b in c.plan.buffers if b.kind == "literal" and b.shape.lens == w.shape]
    assert [b.perm for b in weights] == [(2, 3, 1, 0) if n_major else None]


def _full_head(per: int, h: int, w: int):
    """conv -> reshape -> transpose -> sigmoid -> split arithmetic -> concat, a YOLO head level
    with `per` values per anchor."""
    nodes = [
        node("Conv", ["x", "wt", "b"], ["c"], kernel_shape=[1, 1]),
        node("Reshape", ["c", "shape"], ["r"]),
        node("Transpose", ["r"], ["t"], perm=[0, 1, 3, 4, 2]),
        node("Sigmoid", ["t"], ["s"]),
        node("Split", ["s", "split"], ["xy", "wh", "conf"], axis=4),
        node("Mul", ["xy", "two"], ["xy2"]), node("Add", ["xy2", "grid"], ["xy3"]),
        node("Mul", ["wh", "two"], ["wh2"]), node("Pow", ["wh2", "two"], ["wh3"]), node("Mul", ["wh3", "anchor"], ["wh4"]),
        node("Concat", ["xy3", "wh4", "conf"], ["cat"], axis=4),
        node("Reshape", ["cat", "flat"], ["y"]),
    ]
    inits = {"wt": rand(3 * per, 8, 1, 1, seed=1, scale=0.3), "b": rand(3 * per, seed=2),
             "shape": np.array([1, 3, per, h, w], np.int64), "split": np.array([2, 2, per - 4], np.int64),
             "two": np.array(2.0, np.float32), "grid": rand(1, 3, h, w, 2, seed=3), "anchor": rand(1, 3, h, w, 2, seed=4),
             "flat": np.array([1, 3 * h * w, per], np.int64)}
    return make_model(nodes, {"x": [1, 8, h, w]}, ["y"], inits)


def test_detection_head_writes_final_layout():
    """conv -> reshape -> transpose -> sigmoid -> split arithmetic -> concat, as one kernel."""
    c = check_gpu(_full_head(9, 4, 4))
    assert len(c.kernels) == 1
    body = c.kernels[0].src.body
    # the scalar 2.0 is a number in the kernel, its square a product, the three concat pieces one store
    assert "libdevice.pow" not in body and "tl.full([], 2.0, tl.float32)" in body
    assert body.count("tl.store(out") == 1 and "tl.where(" in body


def test_k_chunk_start_is_declared_a_multiple_of_the_chunk():
    """Triton 3.6 (the H200's) loses the alignment of `k0 % C` and then loads the A tile element
    by element instead of in 16-byte copies (sm_90 PTX; 3.9 keeps it): the template states it."""
    m = make_model([node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])], {"x": [1, 16, 4, 4]}, ["y"],
                   {"w": rand(16, 16, 3, 3, seed=2, scale=0.1)})
    (k,) = check_gpu(m).kernels
    assert "rk = tl.multiple_of(k0 % 16, BK) + tl.arange(0, BK)" in k.src.body


def _head(cin: int, h: int, w: int, per: int = 17):
    """conv 1x1 to 3 x `per` channels -> reshape -> transpose -> sigmoid, as a head level."""
    nodes = [node("Conv", ["x", "wt", "b"], ["c"], kernel_shape=[1, 1]), node("Reshape", ["c", "shape"], ["r"]),
             node("Transpose", ["r"], ["t"], perm=[0, 1, 3, 4, 2]), node("Sigmoid", ["t"], ["y"])]
    inits = {"wt": rand(3 * per, cin, 1, 1, seed=1, scale=cin ** -0.5), "b": rand(3 * per, seed=2),
             "shape": np.array([1, 3, per, h, w], np.int64)}
    return make_model(nodes, {"x": [1, cin, h, w]}, ["y"], inits)


@pytest.mark.parametrize("cin,per", [(48, 17), (512, 17), (48, 85), (512, 40)])
def test_period_aligned_head_under_every_config(cin, per):
    """Every candidate of a period-aligned head is right: 48 input channels (k chunks must divide
    them: no chunk may run into the next tap), 512 with split-k, a feature map (15 pixels) that
    ends inside a tile; periods of 85 and 40 also in two column pieces (64 + 32, 32 + 16)."""
    program = parse_onnx(_head(cin, h=3, w=5, per=per))
    compiled = api.compile(program, "gpu", tune=False)
    (k,) = compiled.kernels
    _run_configs(program, compiled, k.src.configs, np.random.default_rng())
    assert any(c.get("PIECES") for c in k.src.configs) == (per != 17)


def _run_configs(program, compiled, configs, rng) -> None:
    """Run the one kernel of `compiled` under each config, on fresh inputs, against the reference."""
    (k,) = compiled.kernels
    (name, shape), = program.input_shapes.items()
    for config in configs:
        k.config = config
        x = rng.standard_normal(shape.lens).astype(np.float32)
        compiled.poison()
        got = compiled.run({name: x})["y"]
        assert not np.isnan(got).any(), config
        assert rel_err(got, api.run(program, {name: x})["y"]) < TOL, config


def test_detection_head_in_column_pieces():
    """YOLO's 85 values per anchor (padded to 128) in two column pieces, 64 + 32, whose three
    concat stores (xy, wh, classes) each cover part of the columns: every default candidate,
    whole and in pieces, against the reference target on fresh random inputs."""
    program = parse_onnx(_full_head(85, 3, 5))
    compiled = api.compile(program, "gpu", tune=False)
    (k,) = compiled.kernels
    tried = k.src.configs[:k.src.default_tune]
    assert {c["PIECES"] for c in tried} == {0, 1}
    _run_configs(program, compiled, tried, np.random.default_rng())


def test_a_tiny_product_times_two_candidates_and_a_larger_one_six():
    """The tuning cost rule of gemm_configs: under TINY_FLOPS (an SE block's 1x1 convs on a pooled
    vector) any tile takes the launch's time, so the default tune builds two candidates."""
    from fusegraph.targets.gpu.kernel_source import DEFAULT_TUNE_CONFIGS
    from fusegraph.targets.gpu.templates.gemm_configs import TINY_FLOPS, TINY_TUNE

    def tried(m: int, k: int, n: int) -> int:
        model = make_model([node("MatMul", ["a", "b"], ["y"])], {"a": [m, k]}, ["y"], {"b": rand(k, n, seed=1)})
        (kernel,) = api.compile(parse_onnx(model), "gpu", tune=False).kernels
        assert (kernel.src.flops < TINY_FLOPS) == (m * k * n * 2 < TINY_FLOPS)
        return len(kernel.src.configs[:kernel.src.default_tune or DEFAULT_TUNE_CONFIGS])

    assert tried(1, 1152, 48) == TINY_TUNE
    assert tried(64, 256, 128) == DEFAULT_TUNE_CONFIGS


def test_a_classifier_on_one_row_tries_16_row_tiles_first_and_an_se_fc_does_not():
    """Few rows over large weights (a classifier on a pooled vector) put 16-row tiles first and
    still time the general list's first TINY_TUNE; a small product of one row (an SE block's
    FC) keeps its two general candidates, the 16-row tiles left to the exhaustive tune. The
    classifier's default-tuned candidates all compute the product right."""
    from fusegraph.targets.gpu.templates.gemm_configs import FEW_ROWS_FIRST, FEW_ROWS_TUNE, TINY_TUNE

    def kernel(m: int, k: int, n: int):
        model = make_model([node("MatMul", ["a", "b"], ["y"])], {"a": [m, k]}, ["y"], {"b": rand(k, n, seed=1)})
        program = parse_onnx(model)
        compiled = api.compile(program, "gpu", tune=False)
        return program, compiled, compiled.kernels[0]

    program, compiled, k = kernel(1, 768, 1000)
    tried = k.src.configs[:k.src.default_tune]
    assert len(tried) == FEW_ROWS_TUNE and [(c["BM"], c["BN"], c["SPLIT"]) for c in tried[:len(FEW_ROWS_FIRST)]] == [
        (16, bn, f) for bn, f in FEW_ROWS_FIRST]
    assert all(c["BM"] > 16 for c in tried[len(FEW_ROWS_FIRST):])
    _, _, se = kernel(1, 1152, 48)
    assert se.src.default_tune == TINY_TUNE and all(c["BM"] > 16 for c in se.src.configs[:TINY_TUNE])
    assert any(c["BM"] == 16 for c in se.src.configs)
    _run_configs(program, compiled, tried, np.random.default_rng())


@pytest.mark.parametrize("a,b,trans_b", [([5, 7], [7, 20], 0), ([5, 7], [20, 7], 1), ([2, 3, 6, 9], [2, 3, 9, 17], 0),
                                         ([5, 1], [1, 3], 0), ([2, 4, 8, 1], [2, 4, 1, 8], 0)])
def test_matmul(a, b, trans_b):
    """Products, also of k = 1 (outer products: the operands' addresses ignore k, and the chunk's
    padding lanes past k must still add nothing)."""
    if len(a) == 2:
        m = make_model([node("Gemm", ["a", "b", "c"], ["g"], transB=trans_b), node("Relu", ["g"], ["y"])],
                       {"a": a}, ["y"], {"b": rand(*b, seed=1), "c": rand(b[0] if trans_b else b[1], seed=2)})
    else:
        m = make_model([node("MatMul", ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"])
    check_gpu(m)


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("weights,grid", [
    (True, [(2 * 3 * 7, "BM", None), (20, "BN", None), (1, None, "SPLIT")]),  # one B for all: batches are rows
    (False, [(7, "BM", None), (20, "BN", None), (6, None, "SPLIT")]),  # a B per batch: the batch is gz
])
def test_batches_reading_one_weight_matrix_are_rows_of_one_product(fp16, weights, grid):
    """A linear layer over [2, 3, 7, 9] rows (ConvNeXt's channels-last feature map, Swin's
    windows): its weights [9, 20], broadcast over the batch, make one product of 42 rows; a
    B of its own per batch keeps the batch as the grid's third axis."""
    if weights:
        m = make_model([node("MatMul", ["a", "w"], ["g"]), node("Add", ["g", "c"], ["y"])], {"a": [2, 3, 7, 9]}, ["y"],
                       {"w": rand(9, 20, seed=1), "c": rand(20, seed=2)})
    else:
        m = make_model([node("MatMul", ["a", "b"], ["y"])], {"a": [2, 3, 7, 9], "b": [2, 3, 9, 20]}, ["y"])
    c = check_gpu(m, tolerance=3e-3 if fp16 else TOL, fp16=fp16)
    (k,) = c.kernels
    assert k.src.grid_dims == grid


def test_gemm_reshape_transpose_softmax():
    m = make_model([node("MatMul", ["x", "w"], ["g"]), node("Reshape", ["g", "shape"], ["r"]),
                    node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]), node("Softmax", ["t"], ["y"], axis=-1)],
                   {"x": [1, 6, 8]}, ["y"], {"w": rand(8, 12, seed=1), "shape": np.array([1, 6, 3, 4], np.int64)})
    check_gpu(m)


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("GlobalAveragePool", {}),
    ("GlobalMaxPool", {}),
])
def test_pooling(op, attrs):
    check_gpu(make_model([node(op, ["x"], ["y"], **attrs)], {"x": [2, 3, 9, 10]}, ["y"]))


@pytest.mark.parametrize("op,attrs", [
    ("ReduceSum", dict(keepdims=1)), ("ReduceMean", dict(keepdims=0)), ("ReduceMax", dict(keepdims=1)),
    ("ReduceMin", dict(keepdims=1)), ("ReduceProd", dict(keepdims=1)),
])
def test_reduce(op, attrs):
    axes = np.array([1, 2], np.int64)
    if op in ("ReduceSum",):
        m = make_model([node(op, ["x", "axes"], ["r"], **attrs), node("Sqrt", ["r"], ["y"])] if False else
                       [node(op, ["x", "axes"], ["y"], **attrs)], {"x": [3, 4, 5, 6]}, ["y"], {"axes": axes}, opset=18)
    else:
        m = make_model([node(op, ["x", "axes"], ["y"], **attrs)], {"x": [3, 4, 5, 6]}, ["y"], {"axes": axes}, opset=18)
    check_gpu(m, tolerance=1e-4 if op == "ReduceProd" else TOL)


@pytest.mark.parametrize("op,last", [("ArgMax", 0), ("ArgMin", 0), ("ArgMax", 1)])
def test_arg_reduce(op, last):
    check_gpu(make_model([node(op, ["x"], ["y"], axis=1, keepdims=1, select_last_index=last)],
                         {"x": [3, 40, 5]}, ["y"], opset=13))


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_and_log_softmax(axis):
    check_gpu(make_model([node("Softmax", ["x"], ["s"], axis=axis), node("LogSoftmax", ["x"], ["l"], axis=axis),
                          node("Add", ["s", "l"], ["y"])], {"x": [2, 7, 37]}, ["y"]))


def test_layer_norm():
    check_gpu(make_model([node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)],
                         {"x": [4, 5, 48]}, ["y"], {"g": rand(48, seed=1), "b": rand(48, seed=2)}))


def test_lrn():
    check_gpu(make_model([node("LRN", ["x"], ["y"], size=3, alpha=1e-2, beta=0.75, bias=1.0)], {"x": [1, 6, 4, 5]}, ["y"]))


def test_concat_of_computed_inputs():
    m = make_model([node("Exp", ["a"], ["ea"]), node("Transpose", ["b"], ["tb"], perm=[0, 2, 1]),
                    node("Concat", ["ea", "tb"], ["y"], axis=1)], {"a": [2, 3, 4], "b": [2, 4, 5]}, ["y"])
    check_gpu(m)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad(mode):
    pads = np.array([0, 1, 2, 0, 2, 1], np.int64)
    m = make_model([node("Pad", ["x", "pads", "v"], ["y"], mode=mode)], {"x": [2, 4, 5]}, ["y"],
                   {"pads": pads, "v": np.array(1.5, np.float32)}, opset=18)
    check_gpu(m)


def test_gather_with_negative_indices():
    idx = np.array([[0, -1], [2, 1]], np.int64)
    m = make_model([node("Gather", ["x", "i"], ["g"], axis=1), node("Neg", ["g"], ["y"])], {"x": [3, 4, 5]}, ["y"], {"i": idx})
    check_gpu(m)


def test_integer_and_boolean_pointwise():
    nodes = [node("Cast", ["x"], ["i"], to=TensorProto.INT32), node("Div", ["i", "d"], ["q"]),
             node("Greater", ["q", "z"], ["g"]), node("Where", ["g", "x", "y0"], ["y"])]
    m = make_model(nodes, {"x": [3, 8], "y0": [3, 8]}, ["y"],
                   {"d": np.array([3], np.int32), "z": np.array([0], np.int32)})
    check_gpu(m)


def test_fp16_mode_matches_fp32_reference():
    w = rand(16, 8, 3, 3, seed=2, scale=0.3)
    m = make_model([node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                    node("Sigmoid", ["c"], ["s"]), node("Mul", ["c", "s"], ["y"])],
                   {"x": [1, 8, 6, 7]}, ["y"], {"w": w, "b": rand(16, seed=3)})
    program = parse_onnx(m)
    compiled = api.compile(program, "gpu", tune=False, fp16=True)
    x = np.random.default_rng(1).standard_normal((1, 8, 6, 7)).astype(np.float32)
    got = compiled.run({"x": x})["y"]
    assert got.dtype == np.float16
    assert rel_err(got, api.run(program, {"x": x})["y"]) < 1e-2


def test_memory_plan_reuses_the_arena():
    nodes, prev = [], "x"
    for k in range(6):
        nodes.append(node("Conv", [prev, f"w{k}"], [f"c{k}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
        prev = f"c{k}"
    m = make_model(nodes, {"x": [1, 4, 6, 6]}, [prev], {f"w{k}": rand(4, 4, 3, 3, seed=k, scale=0.3) for k in range(6)})
    c = check_gpu(m)
    # six kernels, five intermediates, at most two alive at once
    assert len(c.kernels) == 6
    assert c.plan.arena_bytes <= 2 * 4 * 36 * 4 + 512
    assert c.plan.lower_bound <= c.plan.arena_bytes


def test_split_k_sums_partials_in_a_fixed_order_and_resets_its_counters():
    """A small feature map with a long k loop takes split-k configs; each tile's last program
    adds the partial sums slot by slot and runs the epilogue. The slots need no clearing (they
    are NaN-poisoned before each run), the counters must be zero again for the next run,
    and two runs on the same input give the same bits."""
    m = make_model([node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                    node("Sigmoid", ["c"], ["s"]), node("Mul", ["c", "s"], ["y"])],
                   {"x": [1, 64, 4, 4]}, ["y"], {"w": rand(32, 64, 3, 3, seed=2, scale=0.1), "b": rand(32, seed=3)})
    program = parse_onnx(m)
    compiled = api.compile(program, "gpu", tune=False)
    (k,) = compiled.kernels
    split = [c for c in k.src.configs if c["SPLIT"] > 1]
    assert split, k.src.configs
    k.config = split[0]
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 64, 4, 4)).astype(np.float32)
    runs = []
    for _ in range(2):
        compiled.poison()
        got = compiled.run({"x": x})["y"]
        assert rel_err(got, api.run(program, {"x": x})["y"]) < TOL
        runs.append(got)
    assert np.array_equal(runs[0], runs[1])
    cnt = compiled.bound.tensor(compiled.plan.scratch["cnt"])
    assert not cnt.any()


def _conv(x, w, y, pads=1, stride=1):
    k = 3 if pads else 1
    return node("Conv", [x, w], [y], kernel_shape=[k, k], pads=[pads] * 4, strides=[stride, stride])


def test_feature_maps_between_convolutions_are_channels_last():
    """conv -> (concat of two convs and a max pool) -> stride-2 conv -> global average pool:
    every intermediate a convolution touches is stored NHWC, the concat's slices included,
    and the pool, the channel slices and the reduction read and write through that layout."""
    ws = {"w0": rand(16, 4, 3, 3, seed=1, scale=0.3), "w1": rand(16, 16, 1, 1, seed=2, scale=0.3),
          "w2": rand(48, 48, 3, 3, seed=3, scale=0.1)}
    nodes = [_conv("x", "w0", "a"), node("Relu", ["a"], ["r"]), _conv("r", "w1", "b", pads=0),
             node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
             node("Concat", ["r", "b", "p"], ["cat"], axis=1), _conv("cat", "w2", "d", stride=2),
             node("Sigmoid", ["d"], ["s"]), node("GlobalAveragePool", ["s"], ["y"])]
    c = check_gpu(make_model(nodes, {"x": [1, 4, 7, 9]}, ["y"], ws))
    feature_maps = [b for b in c.plan.buffers if b.kind == "arena" and b.shape.ndim == 4]
    assert feature_maps and all(b.perm == (0, 2, 3, 1) for b in feature_maps)
    assert all(b.perm is None for b in c.plan.buffers if b.kind == "output")


def test_channels_last_feature_map_read_through_a_flattening_reshape():
    """A matrix product reads a conv's NHWC output flattened in NCHW order (the reshape is
    folded into its load map), while another conv reads the same buffer as a feature map."""
    nodes = [_conv("x", "w", "c"), _conv("c", "w2", "y2"), node("Reshape", ["c", "shape"], ["r"]),
             node("MatMul", ["r", "m"], ["y"])]
    m = make_model(nodes, {"x": [1, 4, 3, 5]}, ["y", "y2"],
                   {"w": rand(8, 4, 3, 3, seed=1, scale=0.3), "w2": rand(8, 8, 3, 3, seed=3, scale=0.3),
                    "shape": np.array([1, 8 * 3 * 5], np.int64), "m": rand(8 * 3 * 5, 6, seed=2, scale=0.1)})
    c = check_gpu(m)
    assert [b.perm for b in c.plan.buffers if b.kind == "arena"] == [(0, 2, 3, 1)]
