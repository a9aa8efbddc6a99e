"""Block-size selection, remembered on disk.

Each kernel comes with a few candidate configs. On a GPU every candidate is timed on the
real buffers (kernels only write their own outputs, so timing them repeatedly is harmless)
and the fastest is kept in `tuning.json` under the cache directory, keyed by the kernel's
source hash, the GPU's name and the Triton version: a second compile of the same model
reads the choices back instead of timing again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from fusegraph.targets.gpu.kernel_source import Config


class TuningCache:
    def __init__(self, path: Path, device_name: str) -> None:
        import triton

        self.path = path
        self.prefix = f"{device_name}|triton-{triton.__version__}"
        try:
            self.entries: dict[str, Config] = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError):
            self.entries = {}
        self.dirty = False

    def get(self, digest: str) -> Config | None:
        return self.entries.get(f"{self.prefix}|{digest}")

    def put(self, digest: str, config: Config) -> None:
        key = f"{self.prefix}|{digest}"
        if self.entries.get(key) != config:
            self.entries[key] = config
            self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.entries, indent=0, sort_keys=True))
        tmp.replace(self.path)
        self.dirty = False


def best_config(configs: list[Config], run: Callable[[Config], None], repeats: int = 10,
                replays: int = 10) -> tuple[Config, list[float]]:
    """The fastest config by GPU time (ms per launch); configs that fail to compile are skipped.

    Each candidate is captured `repeats` times into a CUDA graph and the graph replayed between
    events: launched one by one from Python, a kernel of a few microseconds would measure the
    launch's CPU cost, the same for every config, and the choice would be noise.
    """
    import torch

    times: list[float] = []
    for c in configs:
        try:
            run(c)  # compile and warm up
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(repeats):
                    run(c)
            graph.replay()
            samples = _queued_replay_times(graph, replays)
            samples.sort()
            times.append(samples[len(samples) // 2] / repeats)
        except Exception:  # noqa: BLE001 - a config the compiler rejects (too much shared memory, ...)
            torch.cuda.synchronize()
            times.append(float("inf"))
    k = min(range(len(configs)), key=lambda i: times[i])
    return configs[k], times


def _queued_replay_times(graph: Any, replays: int) -> list[float]:
    """GPU ms of each of `replays` graph replays, all queued behind a sleep kernel first.

    Timed one by one, each replay's start event fires on an idle GPU and the graph then waits
    for the CPU to launch it: while build workers keep every core busy, that wait varied from
    run to run and could pick a slower config. The sleep holds the GPU until the CPU has queued
    every replay; if it ended first (the marker completed), the batch is timed again with a
    longer sleep.
    """
    import torch

    sleep_us = 50.0 * replays
    while True:
        torch.cuda._sleep(int(sleep_us * _SLEEP_CYCLES_PER_US))
        marker = torch.cuda.Event()
        marker.record()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(replays)]
        for s, e in events:
            s.record()
            graph.replay()
            e.record()
        starved = marker.query()
        torch.cuda.synchronize()
        if not starved or sleep_us >= _MAX_SLEEP_US:
            return [s.elapsed_time(e) for s, e in events]
        sleep_us *= 4


_SLEEP_CYCLES_PER_US = 2000  # torch.cuda._sleep spins in clock cycles; GPU clocks are about 2 GHz
_MAX_SLEEP_US = 20_000.0


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
