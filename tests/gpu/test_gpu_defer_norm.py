"""A deferred layernorm (passes/defer_norm.py) under Triton's interpreter (or on a GPU): the
`row_rstd` reduction kernel and the product that reads x raw and scales its rows in the
epilogue, on NaN-poisoned buffers against the NumPy reference target, fp32 and fp16."""

from __future__ import annotations

import numpy as np
import pytest

from fusegraph import api, parse_onnx
from tests.gpu.test_gpu_kernels import TOL, check_gpu
from tests.helpers import rel_err
from tests.passes.test_defer_norm import (K, ROWS, _norm_then_products, _shifted_rows, convnext_block, norm_then_conv,
                                         post_norm_block, residual_block)

FP16_TOL = 2e-2  # fp16 operands and outputs against the fp32 reference


@pytest.fixture(autouse=True)
def deferring(monkeypatch):
    """The rule is off by default (`DEFER_NORMS_ENV`, default `free`): these tests turn it on."""
    from fusegraph.passes.defer_norm import DEFER_NORMS_ENV
    monkeypatch.setenv(DEFER_NORMS_ENV, "1")


@pytest.mark.parametrize("norm", ["LayerNormalization", "RMSNormalization"])
@pytest.mark.parametrize("fp16", [False, True])
def test_row_statistics_then_a_product_of_the_raw_rows(norm, fp16):
    compiled = check_gpu(_norm_then_products(norm), tolerance=FP16_TOL if fp16 else TOL, fp16=fp16)
    assert [k.src.template for k in compiled.kernels] == ["reduction", "gemm", "gemm"]  # (returned: not merged)
    assert "row_rstd" in compiled.kernels[0].src.name


def test_rows_far_from_zero():
    """A mean of 300 and a spread of 1 summed raw in float32 by the product."""
    compiled = check_gpu(_shifted_rows(["y", "xs"]), tolerance=1e-4)
    assert sorted(k.src.template for k in compiled.kernels) == ["flat", "gemm", "reduction"]


@pytest.mark.parametrize("reshaped", [False, True])
@pytest.mark.parametrize("fp16", [False, True])
def test_row_statistics_in_the_epilogue_of_the_product_writing_the_rows(fp16, reshaped):
    """Two products: the first stores its rows and their statistics (each column tile's parts
    combined by the last to arrive), the second reads the rows raw and scales them."""
    compiled = check_gpu(residual_block(reshaped=reshaped), tolerance=FP16_TOL if fp16 else TOL, fp16=fp16)
    assert [k.src.template for k in compiled.kernels] == ["gemm", "gemm"]
    assert compiled.kernels[0].src.parts is not None and "pcnt" in compiled.kernels[0].src.args


def test_row_statistics_under_every_default_config():
    """Column tiles of 16 to 128 over 208 columns (a last tile part empty), row tiles past the
    rows' end, on fresh inputs against the reference; counters left at zero for the next run."""
    program = parse_onnx(residual_block())
    compiled = api.compile(program, "gpu", tune=False)
    first = compiled.kernels[0].src
    assert all(c["SPLIT"] == 1 for c in first.configs)
    widths = sorted({c["BN"] for c in first.configs})
    assert len(widths) > 1, widths
    rng = np.random.default_rng()
    for bn in widths:
        compiled.kernels[0].config = next(c for c in first.configs if c["BN"] == bn)
        for _ in range(2):  # a second run finds the counters cleared
            x = rng.standard_normal((1, ROWS, K)).astype(np.float32)
            compiled.poison()
            got = compiled.run({"x": x})["y"]
            assert not np.isnan(got).any() and rel_err(got, api.run(program, {"x": x})["y"]) < TOL, bn


def test_row_statistics_over_more_column_tiles_than_one_load_of_parts():
    """560 columns in the narrowest tiles, 32 wide: 18 column blocks (the last half empty), more
    than the last program loads at once (gemm_reduce.PART_ROWS), so it merges them in two trips."""
    from fusegraph.targets.gpu.templates.gemm_reduce import PART_ROWS

    program = parse_onnx(residual_block(k=560))
    compiled = api.compile(program, "gpu", tune=False)
    first = compiled.kernels[0]
    first.config = min(first.src.configs, key=lambda c: (c["BN"], c["SPLIT"]))
    assert first.config["SPLIT"] == 1 and -(-560 // first.config["BN"]) > PART_ROWS
    x = (np.random.default_rng().standard_normal((1, ROWS, 560)) + 3.0).astype(np.float32)  # rows off zero
    compiled.poison()
    got = compiled.run({"x": x})["y"]
    assert not np.isnan(got).any() and rel_err(got, api.run(program, {"x": x})["y"]) < TOL


@pytest.mark.parametrize("fp16", [False, True])
def test_a_post_norm_block(fp16):
    """The first product stores h, its rows' mean and 1 / std; the second scales its rows and
    normalizes h for its residual add as it reads it."""
    compiled = check_gpu(post_norm_block(), tolerance=FP16_TOL if fp16 else TOL, fp16=fp16)
    assert [k.src.template for k in compiled.kernels] == ["gemm", "gemm"]


def test_row_statistics_under_split_k():
    """K of 640 over 128 rows: candidates split the k loop; only each tile's last program (the
    one that runs its epilogue) adds the rows' parts. Split and unsplit candidates of the first
    product, twice each (the counters cleared for the next run), against the reference."""
    program = parse_onnx(post_norm_block(k=640))
    compiled = api.compile(program, "gpu", tune=False)
    first = compiled.kernels[0].src
    splits = [c for c in first.configs if c["SPLIT"] > 1]
    assert splits, first.configs
    rng = np.random.default_rng()
    for config in splits[:3] + [c for c in first.configs if c["SPLIT"] == 1][:1]:
        compiled.kernels[0].config = config
        for _ in range(2):
            x = rng.standard_normal((1, 128, 640)).astype(np.float32)
            compiled.poison()
            got = compiled.run({"x": x})["y"]
            assert not np.isnan(got).any() and rel_err(got, api.run(program, {"x": x})["y"]) < TOL, config


@pytest.mark.parametrize("kernel,stride,pad", [(2, 2, 0), (3, 1, 1)])
@pytest.mark.parametrize("fp16", [False, True])
def test_a_convolution_normalizing_in_its_loads(kernel, stride, pad, fp16):
    """ConvNeXt's downsampling layernorm: the statistics in the epilogue of the product writing
    the rows, the normalization (affine kept) in the convolution's A loads, zero in its padding."""
    compiled = check_gpu(norm_then_conv(kernel, stride, pad), tolerance=FP16_TOL if fp16 else TOL, fp16=fp16)
    assert [k.src.template for k in compiled.kernels] == ["gemm", "gemm"]
    assert compiled.kernels[0].src.parts is not None


def test_a_computed_a_counts_every_tile_it_loads_against_shared_memory():
    """The normalizing convolution loads x, its mean and 1 / std, gamma and beta per element of
    A: every candidate config keeps that many [BM, BK] tiles in flight within the block's shared
    memory (64x16x64 at 4 stages took 274432 bytes in float32 on an H200, past its 232448)."""
    from fusegraph.targets.gpu.templates.gemm_configs import pipeline_budget, pipeline_bytes

    compiled = api.compile(parse_onnx(norm_then_conv(3, 1, 1)), "gpu", tune=False)
    conv = compiled.kernels[1].src
    assert all(pipeline_bytes(c, 4, 5 * 4) <= pipeline_budget() for c in conv.configs)
    assert any(pipeline_bytes(c, 4) <= pipeline_budget() < pipeline_bytes(c, 4, 5 * 4)
               for c in api.compile(parse_onnx(residual_block()), "gpu", tune=False).kernels[1].src.configs)


def test_the_statistics_rendezvous_comes_before_the_tile_is_stored():
    """The counter's acq_rel atomic releases every store before it: placed ahead of the output
    tile's stores, it waits for the two small parts alone."""
    lines = api.compile(parse_onnx(residual_block()), "gpu", tune=False).kernels[0].src.body.splitlines()
    (rendezvous,) = [k for k, line in enumerate(lines) if "tl.atomic_add(pcnt" in line]
    tile_stores = [k for k, line in enumerate(lines) if "tl.store(out" in line and "rn[None, :]" in line]
    assert tile_stores and min(tile_stores) > rendezvous


@pytest.mark.parametrize("channels,fp16", [(96, False), (64, True)])
def test_row_statistics_in_a_depthwise_convolution_holding_every_channel(channels, fp16):
    """ConvNeXt's block head (a 3x3 window for the interpreter's sake): the depthwise kernel's
    tile takes all channels (96 of 128 lanes, or exactly 64) and stores the rows' 1 / std; the
    product scales its raw rows."""
    compiled = check_gpu(convnext_block(channels, kernel=3), tolerance=FP16_TOL if fp16 else TOL, fp16=fp16)
    assert [k.src.template for k in compiled.kernels] == ["depthwise", "gemm"]
    dw = compiled.kernels[0].src
    assert "pcnt" not in dw.args and all(c["BC"] >= channels for c in dw.configs)


def test_depthwise_row_statistics_under_every_config():
    """Pixel blocks of 2 to 32 (81 pixels: the last block part empty) on fresh inputs."""
    program = parse_onnx(convnext_block(kernel=3))
    compiled = api.compile(program, "gpu", tune=False)
    dw = compiled.kernels[0].src
    assert len({c["BP"] for c in dw.configs}) > 2, dw.configs
    rng = np.random.default_rng()
    for config in dw.configs:
        compiled.kernels[0].config = config
        x = rng.standard_normal((1, 96, 9, 9)).astype(np.float32)
        compiled.poison()
        got = compiled.run({"x": x})["y"]
        assert not np.isnan(got).any() and rel_err(got, api.run(program, {"x": x})["y"]) < TOL, config
