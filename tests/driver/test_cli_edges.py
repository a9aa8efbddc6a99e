"""The command line's edges as a new user meets them: listings, --version, options that do
not apply or are given twice, and a gpu target that cannot run here."""

from __future__ import annotations

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
