"""tools/tune_sweep.py's small models: each holds the kernels it is meant to sweep and computes
what ONNX Runtime computes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from tune_sweep import case_model, main  # noqa: E402

from fusegraph import api, parse_onnx  # noqa: E402
from fusegraph.passes.pipeline import fuse  # noqa: E402
from tests.helpers import ort_run, rel_err  # noqa: E402


@pytest.mark.parametrize("case,kernels", [("convnext_head", ["reduce_mean", "layernorm_dot_add"]),
                                          ("convnext_s4", ["conv_add_transpose_row_rstd", "dot_mul_add_div_erf",
                                                           "dot_add_mul_transpose"])])
def test_a_case_fuses_to_the_kernels_it_sweeps_and_matches_onnx_runtime(case, kernels):
    model = case_model(case)
    program = parse_onnx(model)
    fuse(program)
    assert [i.op.attrs["kernel"] for i in program.main if i.op.name == "fused"] == kernels
    (name, shape), = parse_onnx(model).input_shapes.items()
    x = np.random.default_rng().standard_normal(shape.lens).astype(np.float32)
    assert rel_err(api.run(program, {name: x})["y"], ort_run(model, {name: x})[0]) < 1e-5


def test_an_unknown_case_names_the_known_ones(tmp_path):
    with pytest.raises(SystemExit, match="convnext_head, convnext_s1"):
        main(["--cases", "convnext_s9", "--write-only", str(tmp_path)])
