"""tools/tune_sweep.py's small models: each holds the kernels it is meant to sweep and computes
what ONNX Runtime computes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from tune_sweep import case_model, main, run_case  # noqa: E402

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


def test_a_case_past_its_time_is_stopped_with_the_processes_it_started(tmp_path):
    """A command that starts a child and hangs (as a build worker on a config that never ends
    compiling): both are gone once the case's time is up, and the sweep is told so."""
    import os
    import time

    pid_file = tmp_path / "child.pid"
    script = ("import subprocess, sys, time; "
              f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); open({str(pid_file)!r}, 'w').write(str(c.pid)); "
              "print('started', flush=True); time.sleep(60)")
    start = time.monotonic()
    status = run_case([sys.executable, "-c", script], dict(os.environ), tmp_path / "case.log", 3.0)
    assert status == "stopped after 3 s" and time.monotonic() - start < 20
    assert "started" in (tmp_path / "case.log").read_text()
    child = int(pid_file.read_text())

    def running(pid: int) -> bool:  # a killed child left unreaped (a zombie) runs no more
        try:
            return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
        except OSError:
            return False

    for _ in range(50):
        if not running(child):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"child {child} still runs")
    assert run_case([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ), tmp_path / "ok.log", 30.0) == "rc=3"
