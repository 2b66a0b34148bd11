"""A service's load from its running totals (pure): the samples kept, the rates of the windows, the waits measured."""

from __future__ import annotations

import math

import pytest

from celery_event_operator.core.scaling import load
from celery_event_operator.core.scaling.load import LoadSample


def sample(at: float, sent: int = 0, started: int = 0, runtime: float = 0.0, ended: int = 0, backlog: int = 0,
           waits: tuple[int, ...] = ()) -> LoadSample:  # fmt: skip
    return LoadSample(at, sent, started, runtime, ended, backlog, waits)


def keep(*samples: LoadSample) -> tuple[LoadSample, ...]:
    kept: tuple[LoadSample, ...] = ()
    for each in samples:
        kept = load.kept(kept, each)
    return kept


def test_a_minute_and_the_sample_before_it_are_kept() -> None:
    kept = keep(*(sample(t, sent=t) for t in range(0, 200, 5)))
    assert [s.at for s in kept] == list(range(195 - 65, 200, 5))  # 135 is a window's start; 130 precedes it


def test_samples_are_bounded_at_any_interval() -> None:
    assert len(keep(*(sample(t / 10, sent=t) for t in range(1000)))) == load.MAX_SAMPLES


@pytest.mark.parametrize(
    "later",
    [
        pytest.param(sample(20, sent=5, started=50, ended=40), id="sent-reset"),
        pytest.param(sample(20, sent=50, started=5, ended=40), id="started-reset"),
        pytest.param(sample(20, sent=50, started=50, ended=4), id="runtimes-reset"),
        pytest.param(sample(10, sent=50, started=50, ended=40), id="clock-not-moving"),
    ],
)
def test_totals_that_go_down_start_the_samples_afresh(later: LoadSample) -> None:
    assert keep(sample(0), sample(10, sent=10, started=10, ended=10), later) == (later,)


def test_nothing_measured_from_one_sample() -> None:
    assert load.load((sample(0),)) is None


def test_arrivals_by_task_sent_while_the_brokers_counts_lag() -> None:
    # 4/s published, 2/s started, the backlog's count not moved yet (the broker's statistics lag seconds)
    samples = keep(*(sample(t, sent=4 * t, started=2 * t, backlog=0) for t in range(0, 61, 5)))
    assert load.load(samples) == load.Load(arrivals=4.0, runtime=None, backlog=0)


@pytest.mark.parametrize(
    "sent_per_second",
    [pytest.param(0, id="no-task-sent"), pytest.param(0.1, id="task-sent-of-the-services-own-producers-only")],
)
def test_arrivals_by_starts_and_the_backlogs_growth_when_task_sent_says_less(sent_per_second: float) -> None:
    # Producers send task-sent to their own service's events: those of other services are never seen here.
    samples = keep(*(sample(t, sent=int(sent_per_second * t), started=3 * t, backlog=t) for t in range(0, 61, 5)))
    found = load.load(samples)
    assert found is not None
    assert found.arrivals == pytest.approx(4.0)


def test_a_step_shows_in_the_short_window_and_a_lull_lowers_nothing_for_a_minute() -> None:
    steady = [sample(t, sent=4 * t) for t in range(0, 61, 5)]
    step = [sample(60 + t, sent=240 + 40 * t) for t in range(5, 16, 5)]
    found = load.load(keep(*steady, *step))
    assert found is not None
    assert found.arrivals == pytest.approx(40.0)  # the short window (15 s) saw nothing but the step
    lull = [sample(75 + t, sent=840 + 4 * t) for t in range(5, 31, 5)]
    found = load.load(keep(*steady, *step, *lull))
    assert found is not None
    assert found.arrivals > 10  # the minute still holds the step


def test_the_runtime_is_the_longer_of_the_two_windows_means() -> None:
    quick = [sample(t, ended=2 * t, runtime=0.5 * 2 * t) for t in range(0, 61, 5)]
    slow = [sample(60 + t, ended=120 + t, runtime=60 + 2.5 * t) for t in range(5, 16, 5)]
    found = load.load(keep(*quick, *slow))
    assert found is not None
    assert found.runtime == pytest.approx(2.5)


@pytest.mark.parametrize(
    ("first", "last", "expected"),
    [
        pytest.param((0, 0, 0), (90, 8, 2), (5.0, 100), id="within-the-second-bucket"),
        pytest.param((0, 0, 0), (100, 0, 0), (1.0, 100), id="all-in-the-first"),
        pytest.param((0, 0, 0), (90, 0, 10), (math.inf, 100), id="past-the-last-bound"),
        pytest.param((5, 5, 5), (5, 5, 5), None, id="none-measured"),
    ],
)
def test_the_measured_wait_is_the_bucket_of_the_95th_percentile(
    first: tuple[int, ...], last: tuple[int, ...], expected: tuple[float, int] | None
) -> None:
    samples = keep(sample(0, waits=first), sample(30, waits=last))
    assert load.measured_wait(samples, (1.0, 5.0)) == expected
