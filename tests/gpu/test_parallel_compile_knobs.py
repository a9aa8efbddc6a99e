"""Worker processes build with the parent's Triton settings (targets/gpu/parallel_compile.py):
a setting made in the parent's memory (as torch.compile makes Triton's libdevice path) must
reach the spawned workers, or their binaries' cache keys differ and go unused."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
knobs = pytest.importorskip("triton.knobs")

from fusegraph.targets.gpu.parallel_compile import explicit_knobs, worker_pool  # noqa: E402


def _worker_setting() -> object:
    from triton import knobs as worker_knobs

    return vars(worker_knobs.nvidia).get("libdevice_path"), vars(worker_knobs.compilation).get("disable_line_info")


def test_settings_made_in_memory_reach_the_workers(tmp_path):
    path = str(tmp_path / "libdevice.10.bc")
    saved_nvidia, saved_compilation = dict(vars(knobs.nvidia)), dict(vars(knobs.compilation))
    try:
        vars(knobs.nvidia)["libdevice_path"] = path  # in memory only, as a setter that skips the environment would
        vars(knobs.compilation)["disable_line_info"] = True
        assert explicit_knobs()["nvidia"]["libdevice_path"] == path
        with worker_pool(1) as pool:
            assert pool.submit(_worker_setting).result(timeout=120) == (path, True)
    finally:
        vars(knobs.nvidia).clear()
        vars(knobs.nvidia).update(saved_nvidia)
        vars(knobs.compilation).clear()
        vars(knobs.compilation).update(saved_compilation)

