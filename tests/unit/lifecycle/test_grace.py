"""The grace period of a service's new worker pods (pure), and the runtimes it is worked out from."""

from __future__ import annotations

import pytest

from celery_event_operator.core.lifecycle.grace import Grace, grace
from celery_event_operator.core.monitoring.runtimes import WINDOW_SECONDS, RuntimeWindow


@pytest.mark.parametrize(
    ("given", "seconds", "basis"),
    [
        pytest.param({}, 30, "no task runtime observed yet: Kubernetes' default", id="nothing-seen"),
        pytest.param(
            {"observed": 8.0}, 30,
            "what 99 % of the tasks of the last hour ran, and 10 s for the worker to exit",
            id="short-tasks-kubernetes-default",
        ),
        pytest.param(
            {"observed": 512.0, "longest_running": 100.0},
            600,
            "what 99 % of the tasks of the last hour ran, and 10 s for the worker to exit",
            id="observed",
        ),
        pytest.param(
            {"observed": 64.0, "longest_running": 700.0},
            1200,
            "a task running now, longer than the tasks of the last hour, and 10 s for the worker to exit",
            id="a-long-task-running-now",
        ),
        pytest.param(
            {"observed": 64.0, "time_limit": 900}, 1200,
            "workers.celery.timeLimitSeconds 900 s, and 10 s for the worker to exit", id="the-time-limit",
        ),
        pytest.param(
            {"max_task_runtime": 120, "time_limit": 900}, 180,
            "workers.maxTaskRuntimeSeconds 120 s, and 10 s for the worker to exit", id="the-users-own-limit",
        ),
        pytest.param(
            {"observed": 8192.0}, 3600,
            "what 99 % of the tasks of the last hour ran: capped by workers.maxGracePeriodSeconds 3600 s",
            id="capped",
        ),
        pytest.param({"observed": 5000.0, "maximum": 86_400}, 7200, None, id="hours-beyond-the-steps"),
    ],
)  # fmt: skip
def test_the_grace_period_covers_the_tasks_within_the_users_maximum(
    given: dict[str, float], seconds: int, basis: str | None
) -> None:
    arguments = {"max_task_runtime": None, "time_limit": None, "observed": None, "longest_running": None,
                 "maximum": 3600} | given  # fmt: skip
    found = grace(**arguments)  # type: ignore[arg-type]
    assert found.seconds == seconds
    if basis is not None:
        assert found.basis == basis


def test_the_basis_stays_the_same_while_the_grace_does() -> None:
    """A task running on (its age in powers of two: 1, 2, 4 … 32 s) rewrites no status while the grace covers it:
    the basis changes with the grace, or with what decides it."""
    given = {"max_task_runtime": None, "time_limit": None, "maximum": 3600}
    seen = {grace(**given, observed=32.0, longest_running=running) for running in (None, 1.0, 3.0, 9.0, 17.0, 31.0)}
    assert seen == {Grace(60, "what 99 % of the tasks of the last hour ran, and 10 s for the worker to exit")}
    longer = grace(**given, observed=32.0, longest_running=33.0)
    assert longer == Grace(
        120, "a task running now, longer than the tasks of the last hour, and 10 s for the worker to exit"
    )  # fmt: skip


def test_the_runtimes_of_the_last_hour_or_two_in_powers_of_two() -> None:
    window = RuntimeWindow()
    assert window.percentile(0.99, 0.0) is None
    for _ in range(98):
        window.observe(0.3, 0.0)
    window.observe(300.0, 10.0)
    window.observe(700.0, 20.0)
    assert window.percentile(0.5, 30.0) == 1.0
    assert window.percentile(0.99, 30.0) == 512.0, "a bucket's upper bound: never below what ran"
    assert window.percentile(0.999, 30.0) == 1024.0
    window.observe(2.0, WINDOW_SECONDS + 1)
    assert window.percentile(0.999, WINDOW_SECONDS + 1) == 1024.0, "the previous half still counts"
    assert window.percentile(0.99, 2 * WINDOW_SECONDS + 2) == 2.0, "older than the window: forgotten"
    assert window.percentile(0.99, 4 * WINDOW_SECONDS) is None
