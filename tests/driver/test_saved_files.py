"""`.fgx` files on the command line: `compile -o` writes one, `run` and `verify` take one in
place of MODEL. Outputs are checked against the ref target running the ONNX model (saved as
.npy by `run --save`): bit for bit where the same program runs on the same target, within
`verify`'s stated tolerance otherwise."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import fusegraph
from fusegraph.driver.cli import main
from tests.helpers import make_model


def _model(tmp_path: Path) -> str:
    """x[1,3,8,8] -> Conv 3x3 -> Relu -> + y; written to tmp_path/m.onnx."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Add", ["r", "y"], ["out"])]
    path = tmp_path / "m.onnx"
    onnx.save(make_model(nodes, {"x": [1, 3, 8, 8], "y": [1, 4, 1, 1]}, ["out"], {"w": w}), path)
    return str(path)


def _outputs(argv: list[str], folder: Path) -> np.ndarray:
    folder.mkdir()
    assert main(argv + ["--seed", "3", "--save", str(folder)]) == 0
    return np.load(folder / "out.npy")


def test_compile_writes_a_gpu_program_that_run_and_verify_take(tmp_path: Path, capsys) -> None:
    model, saved = _model(tmp_path), str(tmp_path / "m.fgx")
    assert main(["compile", model, "-o", saved, "--fp16"]) == 0
    assert f"saved {saved}: gpu target, fp16" in capsys.readouterr().out
    loaded = fusegraph.load(saved)
    assert loaded.options["fp16"] and loaded.input_shapes["x"].dtype.numpy == np.float16
    ours = _outputs(["run", saved], tmp_path / "ours")
    assert "ran on the gpu target" in capsys.readouterr().out
    want = _outputs(["run", model], tmp_path / "want")
    assert ours.dtype == np.float16 and np.abs(ours.astype(np.float32) - want).max() < 1e-2 * np.abs(want).max()
    assert main(["verify", saved]) == 0
    out = capsys.readouterr().out
    assert f"fusegraph ({saved}: gpu target, fp16) vs ref target" in out and "tolerance 1e-02" in out


def test_a_saved_program_runs_as_its_model_does(tmp_path: Path, capsys) -> None:
    model, saved = _model(tmp_path), str(tmp_path / "p.fgx")
    fusegraph.save(fusegraph.parse_onnx(model), saved)
    want = _outputs(["run", model], tmp_path / "want")
    np.testing.assert_array_equal(_outputs(["run", saved], tmp_path / "ours"), want)
    fused = _outputs(["run", saved, "--fused"], tmp_path / "fused")
    assert np.abs(fused - want).max() <= 1e-5 * np.abs(want).max()
    for argv in (["verify", saved], ["verify", saved, "--fused"], ["verify", saved, "--target", "gpu", "--no-tune"]):
        assert main(argv) == 0, argv
        assert capsys.readouterr().out.endswith("PASS\n")


@pytest.mark.parametrize("argv, message", [
    (["run", "{d}/missing.fgx"], "missing.fgx: no such file"),
    (["run", "{d}/p.fgx", "--input-dim", "x:1,3,8,8"], "--input-dim does not apply"),
    (["compile", "{d}/m.onnx", "-o", "{d}/m.npy"], "must end in .fgx"),
    (["verify", "{d}/g.fgx", "--bf16"], "--bf16 does not apply: .*g.fgx was compiled with its own options"),
    (["run", "{d}/g.fgx", "--fused"], "--fused applies to a saved Program"),
])
def test_wrong_uses_are_one_line_errors(argv: list[str], message: str, tmp_path: Path, capsys) -> None:
    program = fusegraph.parse_onnx(_model(tmp_path))
    fusegraph.save(program, tmp_path / "p.fgx")
    fusegraph.save(fusegraph.compile(program, "gpu", tune=False), tmp_path / "g.fgx")
    assert main([a.format(d=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fusegraph: error: ") and len(err.splitlines()) == 1
    assert re.search(message, err), err
