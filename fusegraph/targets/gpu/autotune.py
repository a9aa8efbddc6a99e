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
            samples = []
            for _ in range(replays):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                graph.replay()
                e.record()
                e.synchronize()
                samples.append(s.elapsed_time(e) / repeats)
            samples.sort()
            times.append(samples[len(samples) // 2])
        except Exception:  # noqa: BLE001 - a config the compiler rejects (too much shared memory, ...)
            torch.cuda.synchronize()
            times.append(float("inf"))
    k = min(range(len(configs)), key=lambda i: times[i])
    return configs[k], times


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
