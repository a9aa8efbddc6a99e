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
