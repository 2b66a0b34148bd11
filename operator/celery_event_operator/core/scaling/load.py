"""What a service's tasks ask of its workers, from the running totals its events give (pure).

Each status pass keeps one LoadSample: the totals of its handler tasks' events so far (task-sent, task-started, the
runtimes of the tasks that succeeded) and the backlog the broker shows. Rates are differences between samples over a
window: a short one (a step in load shows within seconds) and a minute (what a lull of a few seconds does not
undo). Arrivals are the starts plus the backlog's growth (what entered the queue started or still waits), or the
task-sent events when they say more (they come as tasks are published, where the broker's counts lag seconds; only
the producers that send events to this service's exchange send them).
"""

from __future__ import annotations

import dataclasses
import math

LONG_SECONDS = 60.0
SHORT_SECONDS = 15.0
# Samples kept per service: a minute at the shortest status interval (1 s), and a few more.
MAX_SAMPLES = 64


@dataclasses.dataclass(frozen=True)
class LoadSample:
    at: float  # seconds on the caller's clock
    sent: int  # task-sent events of the handler tasks so far
    started: int  # task-started events so far
    runtime_seconds: float  # runtimes of the tasks that succeeded so far, summed
    runtimes: int  # how many succeeded
    backlog: int  # messages waiting for a worker now
    waits: tuple[int, ...] = ()  # the measured waits so far per bucket of celery_task_queue_wait_time (not cumulative)


@dataclasses.dataclass(frozen=True)
class Load:
    """What the windows say; the larger of the short and the long window's figure, so a rise shows at once and a
    lull of a few seconds lowers nothing."""

    arrivals: float  # tasks per second
    runtime: float | None  # mean seconds per task; None: none ended in the last minute
    backlog: int


def kept(samples: tuple[LoadSample, ...], sample: LoadSample) -> tuple[LoadSample, ...]:
    """The samples to keep with `sample` added: the last minute's and one before it (a window's start), at most
    MAX_SAMPLES. Totals that went down (the series were reset: new settings, the operator restarted) start afresh."""
    if samples and (
        sample.sent < samples[-1].sent
        or sample.started < samples[-1].started
        or sample.runtimes < samples[-1].runtimes
        or sample.at <= samples[-1].at
    ):
        samples = ()
    recent = [s for s in samples if s.at >= sample.at - LONG_SECONDS]
    older = [s for s in samples if s.at < sample.at - LONG_SECONDS]
    kept_samples = (*older[-1:], *recent, sample)
    return kept_samples[-MAX_SAMPLES:]


def _since(samples: tuple[LoadSample, ...], seconds: float) -> LoadSample:
    """The sample a window of `seconds` ending at the newest starts from: the latest at or before its start, else the
    oldest."""
    start = samples[-1].at - seconds
    earlier = [s for s in samples if s.at <= start]
    return earlier[-1] if earlier else samples[0]


def _arrivals(first: LoadSample, last: LoadSample, *, by_sent: bool) -> float:
    elapsed = last.at - first.at
    if elapsed <= 0:
        return 0.0
    if by_sent:
        return (last.sent - first.sent) / elapsed
    return max(0.0, (last.started - first.started) + (last.backlog - first.backlog)) / elapsed


def _runtime(first: LoadSample, last: LoadSample) -> float | None:
    ended = last.runtimes - first.runtimes
    return (last.runtime_seconds - first.runtime_seconds) / ended if ended > 0 else None


def load(samples: tuple[LoadSample, ...], short_seconds: float = SHORT_SECONDS) -> Load | None:
    """None with fewer than two samples (nothing measured yet)."""
    if len(samples) < 2:
        return None
    last = samples[-1]
    long_start, short_start = _since(samples, LONG_SECONDS), _since(samples, short_seconds)
    # task-sent comes as tasks are published (the backlog moves with the broker's statistics, seconds late), but only
    # from the producers that publish to this service's events: the larger of the two measures.
    arrivals = max(
        _arrivals(start, last, by_sent=by_sent) for start in (long_start, short_start) for by_sent in (True, False)
    )
    runtimes = [r for r in (_runtime(long_start, last), _runtime(short_start, last)) if r is not None]
    return Load(arrivals, max(runtimes) if runtimes else None, last.backlog)


def measured_wait(samples: tuple[LoadSample, ...], bounds: tuple[float, ...]) -> tuple[float, int] | None:
    """(The upper bound of the bucket that holds the 95th percentile of the waits measured in the last minute — inf:
    past the last bound —, how many were measured); None: none was."""
    if len(samples) < 2:
        return None
    first, last = _since(samples, LONG_SECONDS), samples[-1]
    if len(first.waits) != len(last.waits):
        return None
    counts = [b - a for a, b in zip(first.waits, last.waits, strict=True)]
    total = sum(counts)
    if total <= 0:
        return None
    seen = 0
    for bound, count in zip((*bounds, math.inf), counts, strict=False):
        seen += count
        if seen >= 0.95 * total:
            return bound, total
    return math.inf, total
