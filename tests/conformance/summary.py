"""The per-op summary printed at the end of a pytest session that ran conformance cases.

`conformance_results` is a session fixture: the conformance tests record each outcome in it, and
on first use it registers a small plugin whose `pytest_terminal_summary` prints the table (pass,
skip, fail and excluded counts per op, with totals) after pytest's own summary.
`gpu_conformance_results` does the same for the gpu target (tests/test_conformance_gpu.py), with
a column for cases skipped because the GPU target has no template for one of their ops.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Any, Callable

import pytest

from conformance.harness import Case, format_table, op_table

_PLUGIN_NAME = "fusegraph-conformance-summary"


class ConformanceResults:
    """Outcomes recorded during the session, printed as the per-op table at its end."""

    def __init__(self) -> None:
        self.rows: list[tuple[Case, str]] = []

    def record(self, case: Case, column: str) -> None:
        self.rows.append((case, column))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.rows:
            return
        terminalreporter.write_sep("=", "ONNX conformance per op (reference target)")
        for line in format_table(op_table(self.rows)).splitlines():
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def conformance_results(request: pytest.FixtureRequest) -> ConformanceResults:
    manager = request.config.pluginmanager
    plugin = manager.get_plugin(_PLUGIN_NAME)
    if plugin is None:
        plugin = ConformanceResults()
        manager.register(plugin, _PLUGIN_NAME)
    return plugin


# the gpu target ---------------------------------------------------------------------------------

GPU_COLUMNS = ("pass", "skip", "no-template", "fail", "excluded")
#: the key of the outcome a gpu conformance test attaches to its report's `user_properties`
GPU_PROPERTY = "fusegraph-conformance-gpu"
_GPU_PLUGIN_NAME = "fusegraph-conformance-gpu-summary"


def missing_template(reason: str) -> str:
    """The short name of what the GPU target lacks, from a CodegenError's message: the fusegraph
    op without a template, or the op left unfused (which the GPU target cannot run)."""
    if m := re.search(r"no template for op (\w+)", reason):
        return f"no template: {m.group(1)}"
    if m := re.search(r"\((\w+)\) was left unfused", reason):
        return f"left unfused: {m.group(1)}"
    return reason[:100]


class GpuConformanceResults:
    """The gpu target's outcomes, printed at the end as the per-op table (with a no-template
    column) and the list of what the GPU target lacks, with how many cases each costs.

    Each test attaches its outcome to its own report (`record` -> `user_properties`), and this
    plugin reads them from the reports (`pytest_runtest_logreport`) rather than being told
    directly: reports are what pytest-xdist sends from its workers to the controller, so the same
    plugin, registered in the controller (from a conftest's `pytest_configure`), sees every
    outcome of a distributed run.
    """

    def __init__(self) -> None:
        self.rows: list[tuple[Any, str]] = []  # (_Row, column): what op_table reads of a Case
        self.lacking: Counter[str] = Counter()
        self.runs_on: set[str] = set()

    @staticmethod
    def record(record_property: Callable[[str, object], None], case: Case, column: str, reason: str = "",
               runs_on: str = "") -> None:
        """Attach a test's outcome to its report; `record_property` is pytest's fixture of that name."""
        record_property(GPU_PROPERTY, (case.name, case.op, column, reason, runs_on))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for key, value in report.user_properties:
            if key != GPU_PROPERTY:
                continue
            name, op, column, reason, runs_on = value
            self.rows.append((_Row(name, op), column))
            if column == "no-template":
                self.lacking[missing_template(reason)] += 1
            if runs_on:
                self.runs_on.add(runs_on)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.rows:
            return
        where = ", ".join(sorted(self.runs_on)) or "gpu target"
        terminalreporter.write_sep("=", f"ONNX conformance per op (gpu target: {where})")
        for line in format_table(op_table(self.rows), columns=GPU_COLUMNS).splitlines():
            terminalreporter.write_line(line)
        if self.lacking:
            terminalreporter.write_sep("-", "what the gpu target lacks (CodegenError), cases skipped for each")
            for what, n in self.lacking.most_common():
                terminalreporter.write_line(f"{n:>5}  {what}")


@dataclasses.dataclass(frozen=True)
class _Row:
    """What the table needs of a case that ran in another process: its name and op."""

    name: str
    op: str


def register_gpu_summary(config: pytest.Config) -> GpuConformanceResults:
    """The session's GpuConformanceResults, registered as a plugin on first use."""
    plugin = config.pluginmanager.get_plugin(_GPU_PLUGIN_NAME)
    if plugin is None:
        plugin = GpuConformanceResults()
        config.pluginmanager.register(plugin, _GPU_PLUGIN_NAME)
    return plugin


@pytest.fixture(scope="session")
def gpu_conformance_results(request: pytest.FixtureRequest) -> GpuConformanceResults:
    return register_gpu_summary(request.config)
