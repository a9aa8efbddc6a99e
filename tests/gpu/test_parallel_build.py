"""Building in worker processes while the tuner goes on (targets/gpu/parallel_compile.py
`ParallelBuild`): a wait returns once the jobs it names are built, each build's time and
failure reach the report, progress moves with every build, and leaving the context waits for
the rest (or, on an error, drops what is still queued); a build past the limit is stopped."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from fusegraph.targets.gpu.errors import CodegenError
from fusegraph.targets.gpu.parallel_compile import (BUILD_LIMIT_ENV, DEFAULT_BUILD_LIMIT_S, ParallelBuild,
                                                    build_limit_s)


@dataclass(frozen=True)
class FakeSource:
    name: str


def fake_build(job) -> tuple[str | None, float]:
    """Sleeps the job's config's seconds; a config with `fail` set fails."""
    src, _, config = job
    time.sleep(config["seconds"])
    return (f"{src.name}: no fit" if config.get("fail") else None), config["seconds"]


def jobs(*seconds: float, fail: int = -1) -> list:
    return [(FakeSource(f"k{i}"), [], {"seconds": s, **({"fail": 1} if i == fail else {})}) for i, s in enumerate(seconds)]


def test_a_wait_returns_when_its_jobs_are_built_not_all():
    seen = []
    with ParallelBuild(jobs(0.0, 3.0, 0.0), lambda what, done, total: seen.append((done, total)),
                       workers=2, build=fake_build) as build:
        build.wait([0])
        assert [s for s, _ in build.report.seconds] in ([0.0], [0.0, 0.0])  # the 3 s job is still building
    assert sorted(s for s, _ in build.report.seconds) == [0.0, 0.0, 3.0]
    assert seen[-1] == (3, 3) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert build.report.wall_seconds >= 3.0 and build.report.failures == []


def test_failures_are_reported_and_an_error_drops_the_queue():
    with ParallelBuild(jobs(0.0, 0.0, fail=1), workers=1, build=fake_build) as build:
        pass
    assert build.report.failures == ["k1: no fit"]
    started = time.monotonic()
    with pytest.raises(RuntimeError), ParallelBuild(jobs(0.5, *[2.0] * 6), workers=1, build=fake_build) as build:
        build.wait([0])
        raise RuntimeError("every config failed")
    assert time.monotonic() - started < 6.0  # not the 12 s of the queued builds


def test_a_build_past_the_limit_is_stopped_and_named_while_the_others_finish():
    started = time.monotonic()
    with ParallelBuild(jobs(0.0, 60.0, 0.0), workers=2, build=fake_build, limit_s=1.0) as build:
        pass
    assert time.monotonic() - started < 30.0  # not the 60 s the build would take
    assert build.report.stopped == {1}
    (failure,) = build.report.failures
    assert failure.startswith("k1 ") and "stopped after 1 s" in failure and BUILD_LIMIT_ENV in failure
    assert sorted(s for s, _ in build.report.seconds)[:2] == [0.0, 0.0]


def test_the_build_limit_setting_is_checked(monkeypatch):
    monkeypatch.delenv(BUILD_LIMIT_ENV, raising=False)
    assert build_limit_s() == DEFAULT_BUILD_LIMIT_S
    monkeypatch.setenv(BUILD_LIMIT_ENV, "2.5")
    assert build_limit_s() == 2.5
    for bad in ("ten", "0", "-3"):
        monkeypatch.setenv(BUILD_LIMIT_ENV, bad)
        with pytest.raises(CodegenError, match=BUILD_LIMIT_ENV):
            build_limit_s()
