"""Print fusegraph's ONNX conformance per op, next to ONNX Runtime's on the same cases.

Runs every node test of the installed onnx and the nine light models through fusegraph's
reference backend and through ONNX Runtime (CPU), with the harness and the exclusion list of
tests/conformance/test_conformance.py, and prints one row per op: fusegraph's pass/skip/fail/excluded
counts, how many cases ONNX Runtime passes, and how many of those fusegraph skips. Then it lists
every failure and exclusion with its reason, every case ONNX Runtime passes that fusegraph
fails (the goal is none), and the cases fusegraph declines although it has a parser for the op
(a ParseError: an attribute value, element type or input kind it does not support), by reason.

    .venv/bin/python tools/conformance_report.py            # table, totals, failures
    .venv/bin/python tools/conformance_report.py --no-ort   # fusegraph only
    .venv/bin/python tools/conformance_report.py --op Resize --skips   # one op, with skip reasons
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from conformance import harness  # noqa: E402
from conformance.exclusions import EXCLUDED  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-ort", action="store_true", help="do not run ONNX Runtime")
    parser.add_argument("--op", action="append", help="only cases of this op (repeatable)")
    parser.add_argument("--skips", action="store_true", help="also list every skipped case with its reason")
    args = parser.parse_args(argv)

    cases = [c for c in harness.node_cases() + harness.light_cases() if not args.op or c.op in args.op]
    if not args.no_ort:
        import onnxruntime

        onnxruntime.set_default_logger_severity(4)  # its own failures are counted, not logged

    rows: list[tuple[harness.Case, str]] = []
    ort_cols: dict[str, Counter[str]] = defaultdict(Counter)
    details: list[str] = []
    regressions: list[str] = []
    skips: list[str] = []
    declined: dict[str, Counter[str]] = defaultdict(Counter)  # reason -> {"cases", "ort pass"}
    for case in cases:
        outcome = harness.run_fusegraph(case)
        column = outcome.status.value
        if case.name in EXCLUDED:
            column = "excluded" if outcome.status is harness.Status.FAIL else column
            details.append(f"EXCLUDED {case.name} [{case.op}]: {EXCLUDED[case.name]}"
                           + ("" if column == "excluded" else f" -- but it is {column} now"))
        elif outcome.status is harness.Status.FAIL:
            details.append(f"FAIL     {case.name} [{case.op}]: {_one_line(outcome.message)}")
        elif outcome.status is harness.Status.SKIP:
            skips.append(f"SKIP     {case.name} [{case.op}]: {_one_line(outcome.message)}")
        reason = ""
        if outcome.status is harness.Status.SKIP and outcome.error != "UnsupportedOpError":
            reason = re.sub(r"node '[^']*' \((\w+)\)", r"\1", _one_line(outcome.message))
            reason = re.sub(r"^input '[^']*'", "input", reason)
            declined[reason]["cases"] += 1
        rows.append((case, column))
        if not args.no_ort:
            ort = harness.run_onnxruntime(case)
            if ort.status is harness.Status.PASS:
                if reason:
                    declined[reason]["ort pass"] += 1
                ort_cols[case.op]["ort pass"] += 1
                if outcome.status is harness.Status.SKIP:
                    ort_cols[case.op]["skip&ort"] += 1
                elif outcome.status is harness.Status.FAIL:
                    regressions.append(f"{case.name} [{case.op}]"
                                       + (" (excluded)" if case.name in EXCLUDED else ""))

    extra = () if args.no_ort else ("ort pass", "skip&ort")
    print(format_header(len(cases), args.no_ort))
    print(harness.format_table(harness.op_table(rows), ort_cols, extra))
    totals = Counter(column for _, column in rows)
    line = ", ".join(f"{totals[c]} {c}" for c in harness.COLUMNS)
    if not args.no_ort:
        ort_total = sum(c["ort pass"] for c in ort_cols.values())
        line += f"; ONNX Runtime passes {ort_total} of {len(cases)}"
    print(f"\nfusegraph: {line}")
    if not args.no_ort:
        print(f"cases ONNX Runtime passes that fusegraph fails: {len(regressions)}")
        for r in regressions:
            print(f"  {r}")
    if details:
        print()
        print("\n".join(details))
    if declined:
        print("\ndeclined (ParseError) cases, by reason: cases" + ("" if args.no_ort else " / of which ONNX Runtime passes"))
        for reason, counts in sorted(declined.items(), key=lambda kv: -kv[1]["cases"]):
            ort = "" if args.no_ort else f" / {counts['ort pass']}"
            print(f"  {counts['cases']:4d}{ort}  {reason}")
    if args.skips and skips:
        print()
        print("\n".join(skips))
    return 0


def format_header(n: int, no_ort: bool) -> str:
    cols = "pass/skip/fail/excluded: fusegraph's outcome"
    if not no_ort:
        cols += "; ort pass: ONNX Runtime (CPU) passes; skip&ort: fusegraph skips, ONNX Runtime passes"
    return f"ONNX conformance on the reference target, {n} cases ({cols})\n"


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 240 else line[:237] + "..."


if __name__ == "__main__":
    sys.exit(main())
