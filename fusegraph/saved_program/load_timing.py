"""The phases of a load and their times, printed on stderr when FUSEGRAPH_TIMING=1 (or
`fusegraph.load(path, verbose=True)`), to see where a load's time goes: one line with every
phase and, for each step done per kernel, a line with its mean and slowest kernels."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator

#: the slowest kernels named in a per-kernel line
SLOWEST = 4


class Phases:
    def __init__(self, verbose: bool = False) -> None:
        self.on = verbose or os.environ.get("FUSEGRAPH_TIMING") == "1"
        self.times: list[tuple[str, float]] = []
        self.per_kernel: list[tuple[str, list[tuple[str, float]]]] = []
        self.notes: list[str] = []
        self._start = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times.append((name, time.perf_counter() - start))

    def add(self, name: str, seconds: float) -> None:
        """A phase timed elsewhere."""
        self.times.append((name, seconds))

    def add_kernels(self, name: str, seconds: list[tuple[str, float]], total: bool = True) -> None:
        """A step done per kernel: each kernel's seconds (their sum a phase when `total`)."""
        self.per_kernel.append((name, seconds))
        if total:
            self.add(name, sum(s for _, s in seconds))

    def total(self) -> float:
        return time.perf_counter() - self._start

    def report(self, where: str) -> None:
        if not self.on:
            return
        notes = f" ({'; '.join(self.notes)})" if self.notes else ""
        parts = ", ".join(f"{name} {seconds * 1e3:.0f} ms" for name, seconds in self.times)
        lines = [f"fusegraph: load {where}: {parts}; total {self.total() * 1e3:.0f} ms{notes}"]
        for name, per in self.per_kernel:
            if per:
                slow = sorted(per, key=lambda p: -p[1])[:SLOWEST]
                lines.append(f"  per kernel, {name}: {len(per)} kernels, mean {sum(s for _, s in per) / len(per) * 1e3:.2f} ms, "
                             f"slowest " + ", ".join(f"{k} {s * 1e3:.1f} ms" for k, s in slow))
        print("\n".join(lines), file=sys.stderr)
