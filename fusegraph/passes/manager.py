"""The pass manager: runs a pipeline, optionally printing the program after each pass and
timing each pass."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence, TextIO

from fusegraph.ir.program import Module, Program


class Pass(Protocol):
    name: str

    def apply(self, module: Module) -> bool: ...


@dataclass
class PassTiming:
    name: str
    seconds: float
    changed: bool


@dataclass
class PassReport:
    timings: list[PassTiming] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(t.seconds for t in self.timings)

    def __str__(self) -> str:
        lines = [f"  {t.name:24s} {t.seconds * 1e3:8.1f} ms{'' if t.changed else '  (no change)'}" for t in self.timings]
        return "\n".join(["passes:", *lines, f"  {'total':24s} {self.total * 1e3:8.1f} ms"])


def run_passes(program: Program, passes: Sequence[Pass], trace: bool = False, out: TextIO | None = None) -> PassReport:
    """Apply `passes` in order to the main module."""
    out = out or sys.stdout
    report = PassReport()
    for p in passes:
        start = time.perf_counter()
        changed = p.apply(program.main)
        elapsed = time.perf_counter() - start
        report.timings.append(PassTiming(p.name, elapsed, changed))
        if trace:
            print(f"=== after {p.name} ({elapsed * 1e3:.1f} ms{'' if changed else ', no change'}) ===", file=out)
            print(program, file=out)
    return report
