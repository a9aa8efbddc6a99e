"""tools/tuning_summary.py: the default tune's best against the best of all, per kernel."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from tuning_summary import main, rows  # noqa: E402


def _line(kernel: str, first: int, ms: list[float]) -> str:
    configs = [{"BM": 16 << j} for j in range(len(ms))]
    return json.dumps({"kernel": kernel, "flops": 1, "grid": [], "default_tune": first, "configs": configs, "ms": ms})


def test_a_kernel_whose_best_config_lies_past_the_default_tune_comes_first_with_the_time_it_leaves():
    table = rows([_line("k_same", 2, [0.004, 0.005, 0.006]), _line("k_missed", 2, [0.010, 0.012, 0.003])])
    (lost0, row0), (lost1, row1) = table
    assert row0.startswith("| k_missed | 3 | 10.0 | BM=16 | 3.0 | BM=64 |") and abs(lost0 - 7.0) < 1e-9
    assert row1.startswith("| k_same | 3 | 4.0 | BM=16 | 4.0 | BM=16 |") and lost1 == 0


def test_a_config_that_failed_to_build_never_wins(tmp_path, capsys):
    report = tmp_path / "report.jsonl"
    report.write_text(_line("k", 1, [0.002, float("inf")]) + "\n")
    assert main([str(report)]) == 0
    out = capsys.readouterr().out
    assert "| k | 2 | 2.0 | BM=16 | 2.0 | BM=16 | 0.0 |" in out and "leaves 0.0 us" in out
