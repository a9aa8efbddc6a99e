"""The pass manager (passes/manager.py): passes run in the given order on the main module, each
timed and marked changed or not, and with `trace` the program is printed after each one."""

from __future__ import annotations

import io

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Module, Program
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.source import add_literal, add_param
from fusegraph.ops.views import MultiBroadcast
from fusegraph.passes.dead_code import DeadCodeElimination
from fusegraph.passes.eliminate_identity import EliminateIdentity
from fusegraph.passes.manager import run_passes
from tests.helpers import assert_same_results, op_names


class Recorder:
    """A pass that notes the module it saw and reports a given answer."""

    def __init__(self, name: str, changes: bool, log: list) -> None:
        self.name, self.changes, self.log = name, changes, log

    def apply(self, module: Module) -> bool:
        self.log.append((self.name, module))
        return self.changes


def times_one() -> Program:
    """exp(x) * 1, with a dead neg(x)."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [3]))
    m.add(make_op("neg"), [x])
    one = m.add(MultiBroadcast((3,)), [add_literal(m, np.float32(1.0))])
    m.set_returns([m.add(make_op("mul"), [m.add(make_op("exp"), [x]), one])], ["y"])
    return p


def test_passes_run_in_order_on_the_main_module_and_are_reported():
    p, log = Program(), []
    report = run_passes(p, [Recorder("first", True, log), Recorder("second", False, log)])
    assert log == [("first", p.main), ("second", p.main)]
    assert [(t.name, t.changed) for t in report.timings] == [("first", True), ("second", False)]
    assert report.total == sum(t.seconds for t in report.timings) >= 0
    lines = str(report).splitlines()
    assert lines[0] == "passes:" and lines[-1].split()[0] == "total"
    assert lines[1].split()[0] == "first" and "(no change)" not in lines[1]
    assert lines[2].split()[0] == "second" and lines[2].endswith("(no change)")


def test_real_passes_rewrite_the_program_and_trace_prints_each_step():
    before, after = times_one(), times_one()
    out = io.StringIO()
    report = run_passes(after, [EliminateIdentity(), DeadCodeElimination(), DeadCodeElimination()], trace=True, out=out)
    assert [t.changed for t in report.timings] == [True, True, False]
    assert op_names(after.main) == ["@param", "exp"]
    text = out.getvalue()
    headers = [line for line in text.splitlines() if line.startswith("===")]
    assert [h.split()[2] for h in headers] == ["eliminate_identity", "dead_code_elimination", "dead_code_elimination"]
    assert headers[-1].endswith(", no change) ===") and not headers[0].endswith(", no change) ===")
    assert text.endswith(str(after) + "\n")
    assert_same_results(before, after, tolerance=0.0)


def test_without_trace_nothing_is_printed_and_unchanged_programs_stay():
    p = times_one()
    run_passes(p, [EliminateIdentity(), DeadCodeElimination()])
    text, out = str(p), io.StringIO()
    report = run_passes(p, [EliminateIdentity(), DeadCodeElimination()], out=out)
    assert not any(t.changed for t in report.timings)
    assert str(p) == text and out.getvalue() == ""
