"""The per-op summary printed at the end of a pytest session that ran conformance cases.

`conformance_results` is a session fixture: the conformance tests record each outcome in it, and
on first use it registers a small plugin whose `pytest_terminal_summary` prints the table (pass,
skip, fail and excluded counts per op, with totals) after pytest's own summary.
"""

from __future__ import annotations

from typing import Any

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
