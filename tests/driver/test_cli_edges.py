"""The command line's edges as a new user meets them: listings, --version, options that do
not apply or are given twice, and a gpu target that cannot run here."""

from __future__ import annotations

import sys

import pytest

from fusegraph import zoo
from fusegraph.driver.cli import main


def test_zoo_lists_each_model_once(capsys):
    assert main(["zoo"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == zoo.names()
    text = "\n".join(lines)
    for name in zoo.names():
        # the name opens its own line and occurs nowhere else as a whole word
        assert sum(word.rstrip(":") == name for word in text.split()) == 1, name


def test_version(capsys):
    import tomllib
    from pathlib import Path

    import fusegraph

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    declared = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out == f"fusegraph {declared}\n"
    assert fusegraph.__version__ == declared


@pytest.mark.parametrize("argv, option", [
    (["run", "light_squeezenet", "--seed", "1", "--seed", "2"], "--seed"),
    (["verify", "light_squeezenet", "--target", "ref", "--target", "gpu"], "--target"),
    (["verify", "light_squeezenet", "--tolerance", "1e-3", "--tolerance", "1e-2"], "--tolerance"),
    (["perf", "light_squeezenet", "-n", "5", "--iterations", "6"], "-n/--iterations"),
])
def test_a_repeated_option_is_an_error(argv, option, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"fusegraph: error: argument {option}: given more than once")


def test_repeatable_options_stay_repeatable(capsys):
    argv = ["read", "light_squeezenet", "--input-dim", "data_0:1,3,224,224", "--input-dim", "data_0:1,3,224,224"]
    assert main(argv) == 0
    assert "data_0" in capsys.readouterr().out


@pytest.mark.parametrize("flags", [["--fp16"], ["--bf16"], ["--allow-tf32"], ["--no-tune"], ["--fp16", "--no-tune"]])
def test_gpu_options_on_the_ref_target_are_an_error(flags, capsys):
    assert main(["verify", "light_squeezenet", *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith(f"fusegraph: error: {' and '.join(flags)} applies to the gpu target only")
    assert "--target gpu" in captured.err


def _relu_file(tmp_path):
    import onnx
    from onnx import helper

    from tests.helpers import make_model

    path = tmp_path / "relu.onnx"
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"], name="r")], {"x": [2, 3]}, ["y"]), str(path))
    return str(path)


def _no_compile(monkeypatch):
    """Make any compile or model load fail loudly: the checks must come first."""
    from fusegraph import api

    def boom(*a, **k):
        raise AssertionError("compiled or loaded before the availability check")

    monkeypatch.setattr(api, "parse_onnx", boom)


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("fusegraph: error: ")
    return captured.err


@pytest.mark.parametrize("blocked", ["triton", "torch"])
def test_gpu_target_without_the_package_says_what_to_install(blocked, tmp_path, monkeypatch, capsys):
    import fusegraph

    monkeypatch.setitem(sys.modules, blocked, None)  # `import triton` now raises ImportError
    program = fusegraph.parse_onnx(_relu_file(tmp_path))
    with pytest.raises(fusegraph.errors.TargetUnavailableError, match=f"needs {blocked}.*pip install 'fusegraph\\[gpu\\]'"):
        fusegraph.compile(program, target="gpu")
    assert main(["verify", _relu_file(tmp_path), "--target", "gpu"]) == 2
    assert "pip install 'fusegraph[gpu]'" in _one_error_line(capsys)
    _no_compile(monkeypatch)
    assert main(["perf", _relu_file(tmp_path)]) == 2
    assert f"perf needs {blocked}" in _one_error_line(capsys)


def test_perf_without_a_gpu_fails_before_compiling(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _no_compile(monkeypatch)
    assert main(["perf", _relu_file(tmp_path)]) == 2
    err = _one_error_line(capsys)
    assert "perf needs an NVIDIA GPU" in err and "--target gpu" in err


def test_perf_under_the_interpreter_says_to_unset_it(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _no_compile(monkeypatch)
    assert main(["perf", _relu_file(tmp_path)]) == 2
    assert "unset TRITON_INTERPRET" in _one_error_line(capsys)


def test_no_gpu_and_no_interpreter_says_what_to_set(tmp_path, monkeypatch, capsys):
    import torch
    import triton  # noqa: F401  (imported already, so the interpreter can no longer be switched on)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert main(["verify", _relu_file(tmp_path), "--target", "gpu"]) == 2
    assert "set TRITON_INTERPRET=1" in _one_error_line(capsys)
