"""The tuner's timing policy (`autotune._queued_replay_times`) on a stand-in CUDA: every replay
is queued behind one sleep before any is timed, and a sleep that ended before the queue was
full (the GPU waited for the CPU inside the timed region) is made four times longer and the
batch timed again, up to a limit. No GPU needed: torch.cuda's event, sleep and synchronize
calls are replaced by recorders."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegraph.targets.gpu import autotune  # noqa: E402


class _Cuda:
    """Records the calls in order; the marker event reports the sleep done `starved` times."""

    def __init__(self, starved: int) -> None:
        self.calls: list[str] = []
        self.sleeps: list[int] = []
        self.starved = starved
        self.clock = 0.0
        cuda = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.timing, self.at = enable_timing, None

            def record(self) -> None:  # "start" for either timing event, "marker" for the sleep's
                cuda.calls.append("start" if self.timing else "marker")
                self.at = cuda.clock

            def query(self) -> bool:
                done = cuda.starved > 0
                cuda.starved -= 1
                return done

            def elapsed_time(self, end: "Event") -> float:
                return end.at - self.at

        self.Event = Event

    def sleep(self, cycles: int) -> None:
        self.calls.append("sleep")
        self.sleeps.append(cycles)

    def synchronize(self) -> None:
        self.calls.append("sync")


class _Graph:
    def __init__(self, cuda: _Cuda, ms: float) -> None:
        self.cuda, self.ms = cuda, ms

    def replay(self) -> None:
        self.cuda.calls.append("replay")
        self.cuda.clock += self.ms


@pytest.fixture
def fake_cuda(monkeypatch):
    def install(starved: int) -> _Cuda:
        cuda = _Cuda(starved)
        monkeypatch.setattr(torch.cuda, "Event", cuda.Event)
        monkeypatch.setattr(torch.cuda, "_sleep", cuda.sleep)
        monkeypatch.setattr(torch.cuda, "synchronize", cuda.synchronize)
        return cuda
    return install


def test_every_replay_is_queued_behind_one_sleep_before_the_wait(fake_cuda):
    cuda = fake_cuda(starved=0)
    times = autotune._queued_replay_times(_Graph(cuda, 0.25), 3)
    assert times == [0.25, 0.25, 0.25]
    # one sleep and its marker, then each replay between its two timing events, then one wait
    assert cuda.calls == ["sleep", "marker"] + ["start", "replay", "start"] * 3 + ["sync"]


def test_a_sleep_that_ended_too_soon_is_made_longer_and_the_batch_timed_again(fake_cuda):
    cuda = fake_cuda(starved=2)
    times = autotune._queued_replay_times(_Graph(cuda, 0.5), 4)
    assert len(times) == 4 and cuda.calls.count("sleep") == 3 and cuda.calls.count("replay") == 12
    assert cuda.sleeps[1] == 4 * cuda.sleeps[0] and cuda.sleeps[2] == 16 * cuda.sleeps[0]


def test_a_cpu_that_never_keeps_up_still_gets_its_times_at_the_longest_sleep(fake_cuda):
    cuda = fake_cuda(starved=10**6)
    times = autotune._queued_replay_times(_Graph(cuda, 1.0), 2)
    assert times == [1.0, 1.0]
    assert cuda.sleeps[-1] >= autotune._MAX_SLEEP_US * autotune._SLEEP_CYCLES_PER_US / 4
    assert cuda.sleeps[-1] <= 4 * autotune._MAX_SLEEP_US * autotune._SLEEP_CYCLES_PER_US
