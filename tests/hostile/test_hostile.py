"""Runs the hostile-input corpus: every bad input is refused with a clear error naming the culprit
(the expected FusegraphError, or for the command line exit code 2 and one `fusegraph: error: `
line), never a traceback, crash or hang; every unusual valid input runs and gives NumPy's answer."""

from __future__ import annotations

import io
import signal
import warnings
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from functools import lru_cache

import numpy as np
import onnx
import pytest

from fusegraph import api, parse_onnx, zoo
from fusegraph.driver.cli import main
from fusegraph.driver.inputs import random_inputs
from fusegraph.errors import FusegraphError
from tests.hostile.make_corpus import Case, generate

SECONDS_PER_CASE = 20


@lru_cache(maxsize=1)
def _yolo() -> onnx.ModelProto:
    return zoo.load("yolov5s")


def _run_model(case: Case) -> dict:
    program = parse_onnx(case.source(), input_dims=case.input_dims)
    inputs = case.inputs() if case.inputs else random_inputs(program.input_shapes, 0)
    outputs = api.run(program, inputs)
    if case.check:
        case.check(inputs, outputs)
    return outputs


def _outcome_api(case: Case) -> tuple[str, str]:
    try:
        _run_model(case)
    except FusegraphError as e:
        return type(e).__name__, str(e)
    return "accept", ""


def _outcome_cli(case: Case) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(case.argv)
        except SystemExit as e:  # argparse refusing the command line
            code = e.code
    if case.after:
        case.after()
    lines = [line for line in err.getvalue().splitlines() if not line.startswith("fusegraph: warning: ")]
    if code == 0:
        return "accept", out.getvalue()
    # one error line; only the list of unsupported ops continues on indented lines
    if code == 2 and lines and lines[0].startswith("fusegraph: error: ") and \
            all(line.startswith("  ") for line in lines[1:]):
        return "exit2", "\n".join(lines)
    return f"exit {code}", err.getvalue()


def _outcome(case: Case) -> tuple[str, str]:
    """(outcome, message); a crash of any other kind is an outcome too, so the report lists it."""
    def timeout(*_: object) -> None:
        raise TimeoutError(f"no answer in {SECONDS_PER_CASE} s")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(SECONDS_PER_CASE)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _outcome_cli(case) if case.kind == "cli" else _outcome_api(case)
    except Exception as e:  # noqa: BLE001  (the corpus looks for exactly these)
        return f"crash {type(e).__name__}", str(e)[:300]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_hostile_corpus(tmp_path):
    cases = generate(tmp_path, _yolo)
    expected = Counter(f"{c.kind}: {c.expect}" for c in cases)
    got: Counter[str] = Counter()
    wrong = []
    for case in cases:
        outcome, message = _outcome(case)
        ok = outcome == case.expect and case.needle in message
        if ok:
            got[f"{case.kind}: {outcome}"] += 1
        else:
            wrong.append(f"{case.name}: expected {case.expect} naming {case.needle!r}, got {outcome}: {message}")
    print(f"\n{len(cases)} hostile cases:")
    for kind, n in sorted(expected.items()):
        print(f"  {kind:32s} {got[kind]:4d} / {n}")
    assert not wrong, f"{len(wrong)} case(s) wrong:\n" + "\n".join(wrong)
    assert got == expected
    assert len(cases) >= 150


def test_corpus_is_deterministic(tmp_path):
    def files() -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(tmp_path.iterdir()) if p.is_file()}

    first = [c.name for c in generate(tmp_path, _yolo)]
    written = files()
    assert [c.name for c in generate(tmp_path, _yolo)] == first
    assert files() == written
