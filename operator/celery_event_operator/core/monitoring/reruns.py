"""Tasks run again, and why (pure): the same task id started again before its run ended, or after its run was cut.

A run is cut when the worker it runs on shuts down or its pod is deleted (a rollout, a scale-in or an eviction whose
grace period was shorter than the task), when its worker process dies (Celery's WorkerLostError) or restarts. A worker
says it goes offline when its warm shutdown begins (SIGTERM), and its runs go on until they end or the kubelet kills it
at the end of the grace period: such a run lasted until its pod was gone, or until its task was delivered again (which
the broker does once the process's connection closed), whichever came first. A task
started again while its first run still goes on, or after a run that outlasted the broker's delivery-acknowledgement
timeout (`consumer_timeout`: the broker closes the channel and gives the message to a worker again, while the first
still runs it), was delivered again by the broker: by that timeout when the first run had lasted about as long, else
after its worker's connection was lost. Each re-run is counted per task name and cause, and the recent ones are kept
for the service's status. Bounded: RUNS_CUT_KEPT cut runs, RUNS_TIMED_OUT_KEPT timed-out runs and RECENT_KEPT recent
re-runs.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Literal

Cause = Literal["ack_timeout", "pod_stopped", "worker_lost"]
CAUSES: tuple[Cause, ...] = ("ack_timeout", "pod_stopped", "worker_lost")
RUNS_CUT_KEPT = 10_000
RUNS_TIMED_OUT_KEPT = 1_000
RECENT_KEPT = 1_000
# A first run that lasted at least this share of the broker's acknowledgement timeout ended by it (the broker checks
# the timeout about once a minute, so a run outlasts it by up to that much, never falls short of it).
ACK_TIMEOUT_SHARE = 0.9


@dataclasses.dataclass(frozen=True)
class Rerun:
    task: str | None  # its name (None: not known)
    cause: Cause
    first_run_seconds: float  # how long the first run had run when it was cut, or when the task started again
    at: float


@dataclasses.dataclass(frozen=True)
class _Cut:
    cause: Cause
    task: str | None
    started_at: float
    cut_at: float | None  # None: its worker was going (offline), and the run went on until the process ended
    going: str | None = None  # that worker


class Reruns:
    def __init__(self) -> None:
        self._cut: collections.OrderedDict[str, _Cut] = collections.OrderedDict()
        # Runs that ended after outlasting the acknowledgement timeout: their message was given out again meanwhile.
        self._timed_out: collections.OrderedDict[str, tuple[str | None, float]] = collections.OrderedDict()
        self.recent: collections.deque[Rerun] = collections.deque(maxlen=RECENT_KEPT)
        self._going: dict[str, set[str]] = {}  # worker → its runs cut while it shuts down, not ended yet

    def succeeded(self, uuid: str, task: str | None, runtime: float, ack_timeout: float | None) -> None:
        """A run ended well after `runtime` seconds (the worker's own measure: right for the solo pool too, whose
        events come late): past the acknowledgement timeout, its task runs again where the broker gave it."""
        if ack_timeout is not None and runtime >= ACK_TIMEOUT_SHARE * ack_timeout:
            self._timed_out[uuid] = (task, runtime)
            while len(self._timed_out) > RUNS_TIMED_OUT_KEPT:
                self._timed_out.popitem(last=False)

    def cut(
        self,
        uuid: str,
        cause: Cause,
        task: str | None,
        started_at: float,
        now: float,
        *,
        ack_timeout: float | None,
        going: str | None = None,
    ) -> None:
        """A run ended without its task's end: it is run again when its message is delivered again. A run cut after
        outlasting the acknowledgement timeout was cut by the broker whatever the worker said: it closes the
        channel, which the worker takes for a lost connection (worker-offline, then online as it reconnects).
        `going`: the worker said it goes offline (its warm shutdown began): the run goes on until `ended(going)`
        or its task is delivered again."""
        if ack_timeout is not None and now - started_at >= ACK_TIMEOUT_SHARE * ack_timeout:
            cause, going = "ack_timeout", None
        self._cut[uuid] = _Cut(cause, task, started_at, None if going is not None else now, going)
        self._cut.move_to_end(uuid)
        if going is not None:
            self._going.setdefault(going, set()).add(uuid)
        while len(self._cut) > RUNS_CUT_KEPT:
            self._forget_going(*self._cut.popitem(last=False))

    def _forget_going(self, uuid: str, cut: _Cut) -> None:
        if cut.going is not None:
            self._going.get(cut.going, set()).discard(uuid)

    def ended(self, worker: str, now: float) -> None:
        """The worker's process has ended (its pod is gone): so have the runs it went on with after going offline."""
        for uuid in self._going.pop(worker, ()):
            cut = self._cut.get(uuid)
            if cut is not None and cut.cut_at is None:
                self._cut[uuid] = dataclasses.replace(cut, cut_at=now)

    def started(
        self, uuid: str, task: str | None, running_since: float | None, now: float, ack_timeout: float | None
    ) -> Rerun | None:
        """A task started: the re-run it is, if it is one. `running_since`: when its earlier run started, when that
        run has not ended; `ack_timeout`: the broker's acknowledgement timeout (None: unknown)."""
        found: Rerun | None = None
        if running_since is not None:
            ran = now - running_since
            timed_out = ack_timeout is not None and ran >= ACK_TIMEOUT_SHARE * ack_timeout
            found = Rerun(task, "ack_timeout" if timed_out else "worker_lost", ran, now)
        elif uuid in self._timed_out:
            named, ran = self._timed_out.pop(uuid)
            found = Rerun(task or named, "ack_timeout", ran, now)
        else:
            cut = self._cut.pop(uuid, None)
            if cut is not None:
                self._forget_going(uuid, cut)
                # Delivered again: a run its worker went on with had ended by now.
                ended = cut.cut_at if cut.cut_at is not None else now
                found = Rerun(task or cut.task, cut.cause, ended - cut.started_at, now)
        if found is not None:
            self.recent.append(found)
        return found

    def since(self, start: float) -> list[Rerun]:
        """The re-runs from `start` on."""
        return [rerun for rerun in self.recent if rerun.at >= start]
