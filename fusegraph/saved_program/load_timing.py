"""The phases of a load and their times, printed on stderr when FUSEGRAPH_TIMING=1 (or
`fusegraph.load(path, verbose=True)`), to see where a load's time goes."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator


class Phases:
    def __init__(self, verbose: bool = False) -> None:
        self.on = verbose or os.environ.get("FUSEGRAPH_TIMING") == "1"
        self.times: list[tuple[str, float]] = []
        self.notes: list[str] = []
        self._start = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times.append((name, time.perf_counter() - start))

    def report(self, where: str) -> None:
        if not self.on:
            return
        total = time.perf_counter() - self._start
        parts = ", ".join(f"{name} {seconds * 1e3:.0f} ms" for name, seconds in self.times)
        notes = f" ({'; '.join(self.notes)})" if self.notes else ""
        print(f"fusegraph: load {where}: {parts}; total {total * 1e3:.0f} ms{notes}", file=sys.stderr)
