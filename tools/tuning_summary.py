"""What an exhaustive tune found that the default tune would miss, kernel by kernel.

Reads a tuning report (`FUSEGRAPH_TUNING_REPORT=FILE fusegraph perf MODEL --exhaustive-tune`,
one JSON line per tuned kernel with every candidate's time) and prints, per kernel, the best
of the candidates the default tune times (the first `default_tune`) against the best of all,
with both configs, sorted by the time the default order leaves: the order of the candidate
lists (`templates/gemm_configs.py`, `templates/depthwise.py`) is the policy this checks.

    python3 tools/tuning_summary.py REPORT.jsonl [--top 30]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the source tree's fusegraph

from fusegraph.targets.gpu.kernel_source import DEFAULT_TUNE_CONFIGS  # noqa: E402


def _short(config: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(config.items()))


def rows(lines: list[str]) -> list[tuple[float, str]]:
    """(microseconds the default order leaves, table row) per tuned kernel."""
    out = []
    for line in lines:
        r = json.loads(line)
        times = [t if math.isfinite(t) else math.inf for t in r["ms"]]
        first = r.get("default_tune", DEFAULT_TUNE_CONFIGS)  # reports written before it was recorded
        d = min(range(min(first, len(times))), key=times.__getitem__)
        b = min(range(len(times)), key=times.__getitem__)
        lost = (times[d] - times[b]) * 1e3
        out.append((lost, f"| {r['kernel']} | {len(times)} | {times[d] * 1e3:.1f} | {_short(r['configs'][d])} "
                          f"| {times[b] * 1e3:.1f} | {_short(r['configs'][b])} | {lost:.1f} |"))
    return sorted(out, key=lambda x: -x[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="a FUSEGRAPH_TUNING_REPORT file")
    parser.add_argument("--top", type=int, default=30, help="kernels to list, most time left first")
    args = parser.parse_args(argv)
    with open(args.report) as f:
        table = rows([line for line in f if line.strip()])
    print("| kernel | candidates | default-tune best us | its config | best us | its config | left us |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for _, row in table[:args.top]:
        print(row)
    print(f"\n{len(table)} kernels; the default order leaves {sum(t for t, _ in table):.1f} us in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
