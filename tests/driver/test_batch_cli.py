"""`--batch` on the command line: N re-batches the model, `compile --batch LO..HI -o FILE.fgx`
writes a dynamic batch whose `run` and `verify` take the request's batch. Answers are checked
against ONNX Runtime running the batch-1 model one sample at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import fusegraph
from fusegraph.driver.cli import main
from tests.helpers import conv_silu_add_model


@pytest.fixture
def model(tmp_path: Path) -> str:
    path = tmp_path / "m.onnx"
    onnx.save(conv_silu_add_model(5), path)
    return str(path)


def _per_sample(model: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"x": x[i:i + 1], "y": y[i:i + 1]})[0] for i in range(len(x))])


@pytest.mark.parametrize("target", ["ref", "gpu"])
def test_a_dynamic_batch_file_answers_each_request(model: str, target: str, tmp_path: Path, capsys) -> None:
    saved = str(tmp_path / "d.fgx")
    assert main(["compile", model, "--batch", "1..4", "-o", saved, "--target", target]) == 0
    assert f"saved {saved}: {target} target, fp32, batch 1..4 as sizes 1, 2, 4" in capsys.readouterr().out
    rng = np.random.default_rng()
    x, y = rng.standard_normal((3, 3, 8, 8), dtype=np.float32), rng.standard_normal((3, 4, 1, 1), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    (tmp_path / "out").mkdir()
    argv = ["run", saved, "--batch", "3", "--input", f"x={tmp_path}/x.npy", "--input", f"y={tmp_path}/y.npy"]
    assert main(argv + ["--save", str(tmp_path / "out")]) == 0
    got = np.load(tmp_path / "out" / "out.npy")
    assert got.shape == (3, 4, 8, 8)
    np.testing.assert_allclose(got, _per_sample(model, x, y), rtol=1e-5, atol=1e-5)
    assert main(["verify", saved, "--batch", "3", "--verbose"]) == 0
    out, err = capsys.readouterr()
    assert "batch 3 of the size-4 program" in out
    assert f"fusegraph: load {saved}: read and check the file" in err and "batch 4: compile" in err
    assert isinstance(fusegraph.load(saved), fusegraph.DynamicBatchProgram)


def test_batch_n_rebatches_for_compile_run_and_verify(model: str, tmp_path: Path, capsys) -> None:
    assert main(["verify", model, "--batch", "5"]) == 0  # ONNX Runtime runs the re-batched model too
    assert "out: [5, 4, 8, 8]" in capsys.readouterr().out
    assert main(["run", model, "--batch", "2"]) == 0
    assert "out: float32 [2, 4, 8, 8]" in capsys.readouterr().out
    assert main(["compile", model, "--batch", "3", "-o", str(tmp_path / "f.fgx"), "--target", "ref"]) == 0
    assert fusegraph.load(tmp_path / "f.fgx").input_shapes["x"].lens == (3, 3, 8, 8)


@pytest.mark.parametrize("argv, message", [
    (["compile", "{m}", "--batch", "0"], "argument --batch: expected positive batch sizes"),
    (["compile", "{m}", "--batch", "4..2"], "argument --batch: expected positive batch sizes with LO <= HI, got '4..2'"),
    (["run", "{m}", "--batch", "many"], "argument --batch: expected a batch size N or a range LO..HI"),
    (["compile", "{m}", "--batch", "1", "--batch", "2"], "argument --batch: given more than once"),
    (["compile", "{m}", "--batch", "1..4"], "--batch 1..4 compiles a dynamic batch: save it with -o FILE.fgx"),
    (["run", "{m}", "--batch", "1..4"], "--batch 1..4 compiles a dynamic batch: `fusegraph compile"),
    (["perf", "{m}", "--batch", "1..4"], "--batch 1..4 compiles a dynamic batch"),
    (["run", "{d}/fixed.fgx", "--batch", "2"], "--batch does not apply to .*fixed.fgx: it was compiled for one batch"),
    (["run", "{d}/dyn.fgx", "--batch", "5"], "batch 5 is outside 1..2"),
    (["run", "{d}/dyn.fgx", "--batch", "1..2"], "a request has one batch size"),
    (["compile", "{d}/fixed.onnx", "--batch", "2"], "no input has a first dimension of 1 or a symbolic one"),
    (["compile", "{m}", "--target", "ref"], "--target applies to the program compile saves: add -o"),
    (["perf", "{d}/dyn.fgx", "--fp16"], "--fp16 does not apply: .*dyn.fgx was compiled with its own options"),
])
def test_bad_batches_are_one_error_line(model: str, tmp_path: Path, capsys, argv: list[str], message: str) -> None:
    import re

    from onnx import helper

    from tests.helpers import make_model

    fusegraph.save(fusegraph.compile(fusegraph.parse_onnx(model), "ref"), tmp_path / "fixed.fgx")
    fusegraph.save(fusegraph.compile_dynamic_batch(model, (1, 2), "ref"), tmp_path / "dyn.fgx")
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["out"])], {"x": [8, 4]}, ["out"]), tmp_path / "fixed.onnx")
    try:
        code = main([a.format(m=model, d=tmp_path) for a in argv])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("fusegraph: error: "), err
    assert re.search(message, err), err
