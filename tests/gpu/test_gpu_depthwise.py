"""The depthwise-convolution template, under Triton's interpreter, against the reference target.

A convolution with one input channel per group and at most DEPTHWISE_MAX_MULTIPLIER output
channels per group lowers to the depthwise template (`Convolution.template_family`), others to
implicit GEMM. Each model runs with every buffer poisoned with NaN, on fresh random inputs:
fp32 to 2e-5, fp16 to 1e-2 (relative L2 error against the float32 reference).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fusegraph import api, parse_onnx
from fusegraph.ir.dtypes import DType
from fusegraph.ir.shape import Shape
from fusegraph.ops.anchors import DEPTHWISE_MAX_MULTIPLIER, Convolution
from fusegraph.targets.gpu.templates.depthwise import channel_widths, depthwise_configs
from tests.gpu.test_gpu_kernels import TOL, check_gpu, node
from tests.helpers import make_model, rand, rel_err

FP16_TOL = 1e-2


def _dw(x: str, y: str, k: int, stride: int = 1, pad: int = 0, dilation: int = 1, group: int = 8, bias: bool = True):
    ins = [x, f"w_{y}"] + ([f"b_{y}"] if bias else [])
    return node("Conv", ins, [y], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
                dilations=[dilation, dilation], group=group)


def _silu(x: str, y: str):
    return [node("Sigmoid", [x], [f"{y}_s"]), node("Mul", [x, f"{y}_s"], [y])]


def _weights(y: str, channels: int, out: int, k: int, seed: int) -> dict[str, np.ndarray]:
    return {f"w_{y}": rand(out, 1, k, k, seed=seed, scale=0.3), f"b_{y}": rand(out, seed=seed + 1)}


def _templates(compiled) -> list[str]:
    return [k.src.template for k in compiled.kernels]


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("k,stride,pad,dilation,multiplier,batch", [
    (3, 1, 1, 1, 1, 1),
    (5, 2, 2, 1, 1, 1),
    (3, 1, 2, 2, 1, 1),  # dilation 2
    (3, 1, 1, 1, 2, 1),  # two output channels per input channel
    (3, 2, 1, 1, 1, 2),  # batch 2
])
def test_depthwise_silu_reads_a_channels_last_map(k, stride, pad, dilation, multiplier, batch, half):
    """1x1 conv -> depthwise conv -> SiLU: the depthwise kernel reads the NHWC buffer the GEMM
    writes and writes the program's NCHW output through its epilogue."""
    c, h, w = 16, 7, 9
    nodes = [node("Conv", ["x", "w0"], ["a"], kernel_shape=[1, 1]),
             _dw("a", "d", k, stride, pad, dilation, group=c), *_silu("d", "y")]
    inits = {"w0": rand(c, 4, 1, 1, seed=1, scale=0.5), **_weights("d", c, c * multiplier, k, seed=2)}
    compiled = check_gpu(make_model(nodes, {"x": [batch, 4, h, w]}, ["y"], inits),
                         tolerance=FP16_TOL if half else TOL, fp16=half)
    assert _templates(compiled) == ["gemm", "depthwise"]
    (fmap,) = [b for b in compiled.plan.buffers if b.kind == "arena"]
    assert fmap.perm == (0, 2, 3, 1)
    weights = [b for b in compiled.plan.buffers if b.kind == "literal" and b.shape.lens == (c * multiplier, 1, k, k)]
    assert [b.perm for b in weights] == [(2, 3, 1, 0)]  # [kh, kw, 1, M]: a tap's channels contiguous


@pytest.mark.parametrize("half", [False, True])
def test_convnext_depthwise_7x7_bias_and_nhwc_transpose(half):
    """ConvNeXt's block opens with a 7x7 depthwise conv (bias, pad 3) whose output is permuted
    to NHWC for a LayerNorm over channels: one kernel, the transpose folded into its store, and
    the NHWC buffer keeps its layout (its channels are already last), so the store runs along
    contiguous channels."""
    c = 8
    nodes = [node("Conv", ["x", "w0"], ["a"], kernel_shape=[1, 1]), _dw("a", "d", 7, pad=3, group=c),
             node("Transpose", ["d"], ["t"], perm=[0, 2, 3, 1]),
             node("LayerNormalization", ["t", "g", "beta"], ["y"], axis=-1, epsilon=1e-6)]
    inits = {"w0": rand(c, 3, 1, 1, seed=1, scale=0.5), **_weights("d", c, c, 7, seed=3), "g": rand(c, seed=5),
             "beta": rand(c, seed=6)}
    compiled = check_gpu(make_model(nodes, {"x": [1, 3, 9, 10]}, ["y"], inits), tolerance=FP16_TOL if half else TOL, fp16=half)
    assert _templates(compiled) == ["gemm", "depthwise", "reduction"]
    layouts = {b.shape.lens: b.perm for b in compiled.plan.buffers if b.kind == "arena"}
    assert layouts == {(1, c, 9, 10): (0, 2, 3, 1), (1, 9, 10, c): None}
    dw = compiled.kernels[1].src
    assert "tl.static_range(49)" in dw.body
    assert f"tl.store(out + ((rc[None, :]) + ({c} * rp[:, None]))" in dw.body
    assert dw.flops == 2 * 9 * 10 * c * 49


def test_depthwise_with_residual_add_reads_an_nchw_input():
    """x + dwconv(x) on the program's NCHW input: read through its strides, the residual in
    the epilogue."""
    c = 6
    nodes = [_dw("x", "d", 3, pad=1, group=c), node("Add", ["d", "x"], ["y"])]
    compiled = check_gpu(make_model(nodes, {"x": [1, c, 5, 8]}, ["y"], _weights("d", c, c, 3, seed=4)))
    assert _templates(compiled) == ["depthwise"]


def test_depthwise_reads_through_a_transposed_view():
    """An NHWC program input transposed to NCHW in front of the conv: the transpose is the
    load's index map, so the kernel reads the input's channels contiguously."""
    c = 8
    nodes = [node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]), _dw("t", "d", 3, stride=2, pad=1, group=c, bias=False),
             node("Relu", ["d"], ["y"])]
    inits = {"w_d": rand(c, 1, 3, 3, seed=5, scale=0.3)}
    compiled = check_gpu(make_model(nodes, {"x": [1, 7, 6, c]}, ["y"], inits))
    assert _templates(compiled) == ["depthwise"]
    assert "x0 + " in compiled.kernels[0].src.body


def test_large_window_loops_over_its_taps():
    """Windows wider than the unrolled limit (9x9 = 81 taps) loop at run time."""
    c = 4
    compiled = check_gpu(make_model([_dw("x", "y", 9, pad=4, group=c)], {"x": [1, c, 6, 5]}, ["y"],
                                    _weights("y", c, c, 9, seed=6)))
    assert _templates(compiled) == ["depthwise"]
    assert "for tap in range(81):" in compiled.kernels[0].src.body


@pytest.mark.parametrize("x_shape,kernel,stride,pads,multiplier", [
    ([2, 6, 11], [5], [1], [2, 2], 1),  # 1-d (a Conformer's depthwise conv), batch 2
    ([1, 3, 4, 5, 3], [3, 3, 3], [2, 1, 1], [1] * 6, 2),  # 3-d, two outputs per channel
])
def test_depthwise_over_other_spatial_ranks(x_shape, kernel, stride, pads, multiplier):
    c = x_shape[1]
    nodes = [node("Conv", ["x", "w", "b"], ["y"], kernel_shape=kernel, strides=stride, pads=pads, group=c)]
    inits = {"w": rand(c * multiplier, 1, *kernel, seed=10, scale=0.3), "b": rand(c * multiplier, seed=11)}
    assert _templates(check_gpu(make_model(nodes, {"x": x_shape}, ["y"], inits))) == ["depthwise"]


def test_every_config_computes_the_same():
    """Each tile candidate (pixel and channel blocks that overrun the map and the channels)
    gives the reference's result."""
    c = 24
    nodes = [_dw("x", "d", 3, pad=1, group=c), *_silu("d", "y")]
    program = parse_onnx(make_model(nodes, {"x": [1, c, 5, 7]}, ["y"], _weights("d", c, c, 3, seed=7)))
    compiled = api.compile(program, "gpu", tune=False)
    (kernel,) = compiled.kernels
    assert len(kernel.src.configs) > 2
    x = np.random.default_rng(8).standard_normal((1, c, 5, 7)).astype(np.float32)
    want = api.run(program, {"x": x})["y"]
    for config in kernel.src.configs:
        kernel.config = config
        compiled.poison()
        got = compiled.run({"x": x})["y"]
        assert rel_err(got, want) <= TOL, config


def _shapes(c_in: int, c_out: int, group: int, k: int = 3) -> list[Shape]:
    return [Shape.of(DType.float32, [1, c_in, 8, 8]), Shape.of(DType.float32, [c_out, c_in // group, k, k])]


@pytest.mark.parametrize("c_in,c_out,group,family", [
    (32, 32, 32, "depthwise"),  # one channel in and out per group
    (32, 64, 32, "depthwise"),  # a channel multiplier of 2
    (8, 8 * DEPTHWISE_MAX_MULTIPLIER, 8, "depthwise"),
    (8, 8 * (DEPTHWISE_MAX_MULTIPLIER + 1), 8, "gemm"),  # too many outputs per group: a product
    (1, 4, 1, "depthwise"),  # a single input channel is one group of one
    (32, 32, 16, "gemm"),  # two input channels per group
    (16, 32, 1, "gemm"),
])
def test_the_rule_choosing_the_depthwise_template(c_in, c_out, group, family):
    op = Convolution(padding=[1] * 4, stride=[1, 1], dilation=[1, 1], group=group)
    assert op.template_family(_shapes(c_in, c_out, group)) == family
    assert op.family == "gemm"  # the passes still see a product with weights


def test_a_group_2_convolution_stays_a_gemm():
    nodes = [node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1] * 4, group=4)]
    compiled = check_gpu(make_model(nodes, {"x": [1, 8, 5, 5]}, ["y"], {"w": rand(8, 2, 3, 3, seed=9, scale=0.3)}))
    assert _templates(compiled) == ["gemm"]


@pytest.mark.parametrize("pixels,channels,first", [
    (3136, 96, {"BP": 16, "BC": 64}),  # ConvNeXt-T's 96x56x56: two channel blocks, 392 programs
    (3600, 144, {"BP": 32, "BC": 64}),  # EfficientNet-B1's 144x60x60
    (49, 768, {"BP": 16, "BC": 64}),  # a 7x7 map: the narrowest pixel block
    (12544, 32, {"BP": 32, "BC": 32}),  # 32 channels: one block
    (20, 3, {"BP": 16, "BC": 4}),
])
def test_config_list_starts_with_the_best_guess(pixels, channels, first):
    configs = depthwise_configs(pixels, channels)
    assert {k: configs[0][k] for k in first} == first
    assert configs[0]["num_warps"] == 4 and all(c["num_stages"] == 1 for c in configs)
    assert len({tuple(sorted(c.items())) for c in configs}) == len(configs)
    assert all(c["BC"] & (c["BC"] - 1) == 0 and c["BP"] & (c["BP"] - 1) == 0 for c in configs)


@pytest.mark.parametrize("pixels,channels", [(784, 192), (3136, 96), (49, 768)])
def test_whole_row_sweep_candidates_hold_few_outputs_a_thread(pixels, channels):
    """The exhaustive tune's narrow whole-row blocks: each warp count, but no candidate whose
    threads would each hold more than SWEEP_OUTPUTS_PER_THREAD outputs (one such took minutes
    to compile)."""
    from fusegraph.targets.gpu.templates.depthwise import SWEEP_OUTPUTS_PER_THREAD, WHOLE_ROW_SWEEP_PIXELS

    configs = depthwise_configs(pixels, channels, whole_rows=True)
    width = 1 << (channels - 1).bit_length()
    assert all(c["BC"] == width for c in configs)
    sweep = [c for c in configs if c["BP"] <= WHOLE_ROW_SWEEP_PIXELS]
    assert {c["num_warps"] for c in sweep} == {1, 2, 4, 8}
    assert all(c["BP"] * c["BC"] <= SWEEP_OUTPUTS_PER_THREAD * 32 * c["num_warps"] for c in configs)
    assert len({tuple(sorted(c.items())) for c in configs}) == len(configs)


@pytest.mark.parametrize("channels,widths", [
    (96, [64, 32, 128]),  # 64 + 64 (half busy) before 3 x 32
    (144, [64, 16, 32, 128]),  # 16 divides 144, 64 is the best guess
    (32, [32, 16]),
    (136, [64, 8, 32, 128]),
    (5, [8]),
])
def test_channel_widths(channels, widths):
    assert channel_widths(channels) == widths


def _depthwise_jobs(half: bool) -> list:
    """(source, argument types) of the depthwise kernels of a small MobileNet/ConvNeXt-like
    model: 3x3, 5x5 stride 2, a channel multiplier of 2, 7x7 into an NHWC transpose, 9x9
    (looped taps); each under its default config and its largest tile."""
    from fusegraph.ops.base import is_fused
    from fusegraph.passes.pipeline import fuse
    from fusegraph.passes.to_half import ToHalf
    from fusegraph.targets.gpu.ahead_of_time import arg_dtypes
    from fusegraph.targets.gpu.codegen import generate, kernel_inputs, plan_program

    c = 96
    nodes = [node("Conv", ["x", "w0"], ["a"], kernel_shape=[1, 1]),
             _dw("a", "d3", 3, pad=1, group=c), *_silu("d3", "s3"),
             _dw("s3", "d5", 5, stride=2, pad=2, group=c), *_silu("d5", "s5"),
             _dw("s5", "m2", 3, pad=1, group=c),
             _dw("m2", "d7", 7, pad=3, group=2 * c), node("Transpose", ["d7"], ["t7"], perm=[0, 2, 3, 1]),
             _dw("s5", "d9", 9, pad=4, group=c)]
    inits = {"w0": rand(c, 3, 1, 1, seed=1), **_weights("d3", c, c, 3, 2), **_weights("d5", c, c, 5, 3),
             **_weights("m2", c, 2 * c, 3, 4), **_weights("d7", 2 * c, 2 * c, 7, 5), **_weights("d9", c, c, 9, 6)}
    program = parse_onnx(make_model(nodes, {"x": [1, 3, 56, 56]}, ["t7", "d9"], inits))
    if half:
        ToHalf(DType.float16).apply(program.main)
    fuse(program)
    plan = plan_program(program.main)
    jobs = []
    for pos, ins in enumerate(i for i in program.main if is_fused(i)):
        src = generate(ins, pos, kernel_inputs(ins, plan))
        if src.template == "depthwise":
            largest = max(src.configs, key=lambda cfg: cfg["BP"] * cfg["BC"])
            jobs += [(src, arg_dtypes(ins, src)), (replace(src, configs=[largest]), arg_dtypes(ins, src))]
    return jobs


@pytest.mark.slow
@pytest.mark.parametrize("half", [True, False])
def test_every_depthwise_kernel_compiles_for_sm90(half):
    """Built for the H200 without a GPU (ahead_of_time.py), so a kernel the real backend
    rejects fails here rather than on the GPU."""
    pytest.importorskip("triton")
    from fusegraph.targets.gpu.ahead_of_time import compile_many

    jobs = _depthwise_jobs(half)
    assert len(jobs) == 10
    for (src, _), r in zip(jobs, compile_many(jobs, workers=2)):
        assert r.cubin_bytes > 0 and r.ptx_lines > 0, src.name


def test_kernel_floor_of_a_depthwise_kernel(tmp_path, capsys):
    """bench/kernel_floors.py joins a perf line with the kernel's bytes and FLOPs: ConvNeXt's
    7x7 depthwise conv over 96x56x56 in fp16 moves 1.21 MB and its 29.5 MFLOP run at the
    float32 FMA rate (no tensor cores), which sets its floor."""
    import onnx

    from bench.kernel_floors import kernel_costs, main

    c = 96
    path = tmp_path / "dw7.onnx"
    onnx.save(make_model([_dw("x", "y", 7, pad=3, group=c)], {"x": [1, c, 56, 56]}, ["y"], _weights("y", c, c, 7, 1)), path)
    ((name, (kernel, nbytes, flops, _, _, template)),) = kernel_costs(str(path), True).items()
    assert template == "depthwise" and flops == 2 * 56 * 56 * c * 49
    assert nbytes == 2 * (2 * c * 56 * 56 + c * 49 + c)  # input and output once, the weights and bias
    log = tmp_path / "perf.log"
    log.write_text(f"{name} = {kernel}(@0,@1,@2) -> half_type, {{1, 96, 56, 56}}: 0.0020ms, 100%\n")
    assert main([str(log), "--model", str(path), "--vector-flops", "6.7e13"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {name} "))
    assert f"| {flops / 6.7e13 * 1e6:.2f} |" in row  # the floor: FLOPs over the vector rate


def test_the_registry_finds_the_depthwise_template_from_the_shapes():
    from fusegraph.targets.gpu.templates.depthwise import depthwise_kernel
    from fusegraph.targets.gpu.templates.gemm import gemm_kernel
    from fusegraph.targets.gpu.templates.registry import template_for

    op = Convolution(padding=[1] * 4, stride=[1, 1], dilation=[1, 1], group=32)
    assert template_for(op, _shapes(32, 32, 32)) is depthwise_kernel
    assert template_for(op) is gemm_kernel  # the class trait alone: the family the passes see
