"""ONNX conformance on the reference target: ONNX's own backend tests through `FusegraphBackend`.

Each node test of the installed onnx (generated in memory by `onnx.backend.test`) and each of the
nine light models shipped in the onnx package is one test, compared with onnx's own rtol/atol:

- a model fusegraph declines (an op without a parser, or a ParseError for an attribute value,
  element type or shape it does not support) is SKIPPED, with the reason (`pytest -rs`);
- a case listed in tests/conformance/exclusions.py XFAILs with its reason, and fails once it
  passes, so the list stays true;
- any other failure of a supported op is a FAILURE.

The per-op table (pass/skip/fail/excluded) is printed at the end of the session;
tools/conformance_report.py prints the same table next to ONNX Runtime's results.
"""

from __future__ import annotations

import pytest

from conformance import harness
from conformance.exclusions import EXCLUDED, ORDER_DEPENDENT
from conformance.summary import ConformanceResults, conformance_results  # noqa: F401  (fixture)

NODE_CASES = harness.node_cases()
LIGHT_CASES = harness.light_cases()


def _check(case: harness.Case, results: ConformanceResults) -> None:
    outcome = harness.run_fusegraph(case)
    if outcome.status is harness.Status.SKIP:
        results.record(case, "skip")
        pytest.skip("unsupported: " + " ".join(outcome.message.split()))
    if case.name in EXCLUDED:
        if outcome.status is harness.Status.PASS:
            results.record(case, "pass")
            if case.name in ORDER_DEPENDENT:
                return
            pytest.fail(f"{case.name} passes now: remove it from tests/conformance/exclusions.py", pytrace=False)
        results.record(case, "excluded")
        pytest.xfail(EXCLUDED[case.name])
    results.record(case, outcome.status.value)
    if outcome.status is harness.Status.FAIL:
        pytest.fail(outcome.message, pytrace=False)


@pytest.mark.parametrize("case", NODE_CASES, ids=lambda c: c.name)
def test_node(case: harness.Case, conformance_results: ConformanceResults) -> None:  # noqa: F811
    _check(case, conformance_results)


@pytest.mark.parametrize("case", LIGHT_CASES, ids=lambda c: c.name)
def test_light_model(case: harness.Case, conformance_results: ConformanceResults) -> None:  # noqa: F811
    _check(case, conformance_results)


def test_exclusions_name_real_cases() -> None:
    names = {c.name for c in NODE_CASES + LIGHT_CASES}
    assert not sorted(set(EXCLUDED) - names), "exclusions.py lists cases onnx does not have"
    assert ORDER_DEPENDENT <= set(EXCLUDED)


def test_collected_the_whole_suite() -> None:
    """Guards against an onnx upgrade silently generating no cases (or losing the light models)."""
    assert len(NODE_CASES) > 1000
    assert len(LIGHT_CASES) == 9


@pytest.mark.parametrize("case", NODE_CASES + LIGHT_CASES, ids=lambda c: c.name)
def test_fused_equals_unfused(case: harness.Case) -> None:
    """Every case the reference target passes also passes after the whole pass pipeline."""
    if case.name in EXCLUDED or harness.run_fusegraph(case).status is not harness.Status.PASS:
        pytest.skip("not passing unfused")
    outcome = harness.run_fusegraph(case, fused=True)
    assert outcome.status is harness.Status.PASS, outcome.message
