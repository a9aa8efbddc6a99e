"""Every code block of README.md runs here, so the README cannot drift from the code.

```python blocks run with exec, each in a fresh namespace. Shell blocks (```console, ```bash,
```sh, ```shell, and indented blocks whose lines start with `fusegraph `) run their fusegraph
commands in-process through `main(argv)`; in a console block the lines after a `$ ` command are
its output as shown, which must appear in the real output, loosely: numbers may differ (timings,
errors, instruction numbers), `...` stands for anything, and lines that are only `...` mark
elided output. A block whose first line is a comment `# needs a GPU` is skipped without one, and
one whose first line is `# needs nvidia-pytriton` without that wheel installed.
Any other fenced block is an error here, so a new kind of block gets a decision.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shlex
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

from fusegraph.driver.cli import main
from tests.helpers import has_gpu

README = Path(__file__).resolve().parents[1] / "README.md"
SHELL = {"console", "bash", "sh", "shell"}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.M | re.S)
NEEDS_GPU = re.compile(r"#\s*needs a GPU\b")
NEEDS_TRITON = re.compile(r"#\s*needs nvidia-pytriton\b")
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")
PROGRAMS = ("fusegraph", ".venv/bin/fusegraph")


@dataclass(frozen=True)
class Block:
    kind: str  # "python" or "shell"
    text: str
    line: int  # where the block's text starts in README.md

    @property
    def needs_gpu(self) -> bool:
        first = next((ln for ln in self.text.splitlines() if ln.strip()), "")
        return bool(NEEDS_GPU.match(first.strip()))

    @property
    def needs_triton(self) -> bool:
        first = next((ln for ln in self.text.splitlines() if ln.strip()), "")
        return bool(NEEDS_TRITON.match(first.strip()))


def _blocks() -> list[Block]:
    text = README.read_text()
    blocks = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start(2)) + 1
        lang = m.group(1)
        if lang not in SHELL | {"python"}:
            raise AssertionError(f"README.md:{line}: a ```{lang} block; test_readme.py runs python and shell blocks only")
        blocks.append(Block("python" if lang == "python" else "shell", m.group(2), line))
    blanked = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for m in re.finditer(r"(?:^(?: {4}.*)?\n)+", blanked, re.M):
        body = [ln[4:] for ln in m.group(0).splitlines()]
        if any(ln.startswith(tuple(p + " " for p in PROGRAMS)) for ln in body):
            # an indented block is commands only, without shown output
            blocks.append(Block("shell", "".join(f"$ {ln}\n" for ln in body if ln.strip()),
                                text.count("\n", 0, m.start()) + 1))
    return blocks


def _pattern(shown: str) -> re.Pattern[str]:
    """A shown output line as a regex: any number for each number, anything for `...`."""
    pieces = []
    for part in shown.strip().split("..."):
        words = NUMBER.split(part.strip())
        pieces.append(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?".join(re.escape(w) for w in words))
    return re.compile(re.sub(r"(\\ )+", r"\\s+", ".*".join(pieces)))


@lru_cache(maxsize=None)
def _run(argv: tuple[str, ...]) -> tuple[int, str]:
    """Exit code and output (stdout then stderr) of one command, run once per test session."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:  # --help, --version and argparse errors exit
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue() + err.getvalue()


def _commands(block: Block) -> list[tuple[list[str], list[str]]]:
    """(argv, shown output lines) of each `$ ` command; in a block without prompts every
    line is a command."""
    lines = [ln for ln in block.text.splitlines() if ln.strip() and not NEEDS_GPU.match(ln.strip())]
    if not any(ln.startswith("$ ") for ln in lines):
        lines = [f"$ {ln}" for ln in lines if not ln.lstrip().startswith("#")]
    commands: list[tuple[list[str], list[str]]] = []
    for ln in lines:
        if ln.startswith("$ "):
            commands.append((shlex.split(ln[2:]), []))
        elif not commands:
            raise AssertionError(f"README.md:{block.line}: output before any `$ ` command: {ln!r}")
        elif ln.strip() != "...":
            commands[-1][1].append(ln)
    return commands


def _check_shell(block: Block) -> None:
    for argv, shown in _commands(block):
        where = f"README.md:{block.line}: `{shlex.join(argv)}`"
        assert argv[0] in PROGRAMS, f"{where} is not a fusegraph command (only those run here)"
        code, output = _run(tuple(argv[1:]))
        errors = any(s.startswith("fusegraph: error:") for s in shown)
        assert code == (2 if errors else 0), f"{where} exited {code}:\n{output[-2000:]}"
        real = [ln.strip() for ln in output.splitlines()]
        for s in shown:
            pattern = _pattern(s)
            assert any(pattern.fullmatch(r) for r in real), f"{where}: the README shows\n  {s}\nbut the output has no such line"


BLOCKS = _blocks()


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.kind}-line{b.line}" for b in BLOCKS])
def test_readme_block(block: Block) -> None:
    if block.needs_gpu and not has_gpu():
        pytest.skip("the README marks this block `# needs a GPU`")
    if block.needs_triton and importlib.util.find_spec("pytriton") is None:
        pytest.skip("the README marks this block `# needs nvidia-pytriton`, which is not installed")
    if block.kind == "python":
        exec(compile(block.text, f"README.md:{block.line}", "exec"), {"__name__": "__readme__"})
    else:
        _check_shell(block)


def test_the_readme_has_blocks_of_each_kind() -> None:
    """Guards the extraction itself: a regex that found nothing would pass every block."""
    kinds = [b.kind for b in BLOCKS]
    assert kinds.count("python") >= 2 and kinds.count("shell") >= 5
    assert sum(len(_commands(b)) for b in BLOCKS if b.kind == "shell") >= 8


def test_the_loose_match_keeps_words_and_frees_numbers() -> None:
    p = _pattern("  output0: [1, 25200, 85] max abs error 6.042e-03 ... PASS")
    assert p.fullmatch("output0: [1, 1575, 85] max abs error 9.216e-03, relative norm error 2.6e-06: PASS")
    assert not p.fullmatch("output0: [1, 1575, 85] max abs error 9.216e-03, relative norm error 2.6e-06: FAIL")
    assert not p.fullmatch("output0: [1, 25200, 85] max rel error 6.042e-03 PASS")
