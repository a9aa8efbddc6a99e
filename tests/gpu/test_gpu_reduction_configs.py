"""The reduction template's candidates: blocks of rows, and where those leave multiprocessors
idle, rows spread one or a few to a program (templates/reduction.py). Every candidate runs
under Triton's interpreter (or on a GPU) against the reference target on fresh inputs."""

from __future__ import annotations

import numpy as np

from fusegraph import api, parse_onnx
from fusegraph.targets.gpu.device import current_device
from fusegraph.targets.gpu.templates.reduction import LONG_ROW, SPREAD_MIN_ELEMENTS, _configs
from tests.gpu.test_gpu_kernels import TOL, _run_configs, node
from tests.helpers import make_model, rand, rel_err


def test_few_long_rows_also_try_a_program_per_row():
    """BERT-base's layernorms at batch 1: 128 rows of 768 in blocks of 4 make 32 programs."""
    first, *_, spread = _configs(128, 768)
    assert first["BO"] == 4 and -(-128 // first["BO"]) < current_device().sm_count
    assert spread == {"BO": 1, "BR": 1024, "num_warps": 4, "num_stages": 1}


def test_spreading_stops_where_every_multiprocessor_has_a_program():
    sms = current_device().sm_count
    configs = _configs(3136, 96)  # Swin-T's first-stage rows: 98 blocks of 32
    assert [c["BO"] for c in configs] == [32, 16] and -(-3136 // 16) >= sms


def test_long_rows_also_try_wide_chunks_under_eight_warps():
    """A diffusion UNet's GroupNorm at batch 1: 32 groups of 40960 elements."""
    assert _configs(32, 40960)[-1] == {"BO": 1, "BR": LONG_ROW // 2, "num_warps": 8, "num_stages": 1}
    assert _configs(4096, 2 * LONG_ROW)[-1]["BO"] == 2  # many long rows: at most two a program
    assert all(c["BR"] <= 1024 for c in _configs(128, LONG_ROW - 1))


def test_many_rows_and_tiny_reductions_keep_their_candidates():
    assert all(c["BO"] > 1 for c in _configs(4096, 768))  # batch 32: 1024 programs already
    assert 8 * 16 < SPREAD_MIN_ELEMENTS and _configs(8, 16) == [{"BO": 8, "BR": 16, "num_warps": 4, "num_stages": 1}]


def test_a_layernorm_under_every_candidate():
    model = make_model([node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)], {"x": [1, 128, 768]},
                       ["y"], {"g": rand(768, seed=1), "b": rand(768, seed=2)})
    program = parse_onnx(model)
    compiled = api.compile(program, "gpu", tune=False)
    (k,) = compiled.kernels
    assert [c["BO"] for c in k.src.configs] == [4, 8, 1]
    _run_configs(program, compiled, k.src.configs, np.random.default_rng())


def test_group_statistics_over_long_rows_under_every_candidate():
    """A mean over 8 groups of 8192 elements, GroupNorm's first statistic: 2 programs of 4 rows,
    or one a row."""
    model = make_model([node("Reshape", ["x", "shape"], ["g"]), node("ReduceMean", ["g"], ["y"], axes=[2], keepdims=1)],
                       {"x": [1, 32, 32, 64]}, ["y"], {"shape": np.array([1, 8, 8192], np.int64)})
    program = parse_onnx(model)
    compiled = api.compile(program, "gpu", tune=False)
    (k,) = compiled.kernels
    assert k.src.template == "reduction" and [c["BO"] for c in k.src.configs][-1] == 1
    _run_configs(program, compiled, k.src.configs, np.random.default_rng())


def test_group_norm_statistics_of_long_rows_under_every_candidate():
    """GroupNorm's row_moments kernel (each group's mean and 1 / std, two stores a row) over two
    groups of 8192 elements, under each candidate, the wide-chunk one included."""
    model = make_model([node("GroupNormalization", ["x", "g", "b"], ["y"], num_groups=2, epsilon=1e-5)],
                       {"x": [1, 16, 32, 32]}, ["y"], {"g": rand(16, seed=1), "b": rand(16, seed=2)}, opset=21)
    program = parse_onnx(model)
    compiled = api.compile(program, "gpu", tune=False)
    moments = compiled.kernels[0]
    assert "row_moments" in moments.src.name and moments.src.configs[-1]["BR"] == LONG_ROW // 2
    rng = np.random.default_rng()
    for config in moments.src.configs:
        moments.config = config
        x = (rng.standard_normal((1, 16, 32, 32)) * 3 + 5).astype(np.float32)  # far from zero: the two passes matter
        compiled.poison()
        got = compiled.run({"x": x})["y"]
        assert not np.isnan(got).any(), config
        assert rel_err(got, api.run(program, {"x": x})["y"]) < TOL, config
