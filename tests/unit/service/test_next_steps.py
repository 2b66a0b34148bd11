"""What happens next, as every service condition that is not True says it (core/service/next_steps.py)."""

from __future__ import annotations

import pytest

from celery_event_operator.core import errors
from celery_event_operator.core.broker.address import ManagementURLRejectedError
from celery_event_operator.core.service.next_steps import NEXT_STEPS, Rhythm, next_step, with_next_step

RHYTHM = Rhythm(resync_seconds=30, status_seconds=15)


def operator_errors(kind: type[errors.OperatorError] = errors.OperatorError) -> list[type[errors.OperatorError]]:
    found = []
    for subclass in kind.__subclasses__():
        found += [subclass, *operator_errors(subclass)]
    return found


# A replay's own (its conditions say what follows themselves), and the base class nothing raises.
NOT_A_SERVICE_CONDITION = {errors.ArchiveNotFoundError.reason, errors.OperatorError.reason}


def test_every_error_reason_has_its_next_step() -> None:
    """A failure's reason (errors.py, and the address's) reaches a condition as it is: each has its line."""
    reasons = {kind.reason for kind in operator_errors()} | {ManagementURLRejectedError.reason}
    assert reasons - NOT_A_SERVICE_CONDITION - set(NEXT_STEPS) == set()


@pytest.mark.parametrize(
    ("reason", "then"),
    [
        ("InvalidSpec", "nothing is done until the spec is corrected"),
        (
            "BrokerUnreachable",
            "tried again at the next resync (about every 30 s), and no more often than its backoff allows (up to 60 s)",
        ),
        ("BrokerSecretInvalid", "the Secret is read again at the next resync (about every 30 s)"),
        (
            "BrokerRefused",
            "tried again at the next resync (about every 30 s); what the broker refused must change first",
        ),
        ("KubernetesAPIUnavailable", "asked again in a few seconds"),
        (
            "KubernetesAPIForbidden",
            "tried again at the next resync (about every 30 s); the operator's RBAC must allow it first",
        ),
        ("BrokerAlarm", "publishers stay blocked until RabbitMQ clears it; checked about every 15 s"),
        ("ScaleTargetNotFound", "looked for again at the next resync (about every 30 s)"),
        ("NotChecked", None),  # each text says what it waits for (core/lifecycle/stuck.py)
        (
            "EventsNotConsumed",
            "consumed by itself once the broker can be reached and allows it (retried, backing off up to 60 s)",
        ),
        ("ServiceNameConflict", None),  # its message says it: taken over once the owner is gone
        ("TasksRerun", None),  # its message ends with what to change
        ("SomethingNew", None),  # unknown here: the message as it is, never an error
    ],
)
def test_what_follows_each_reason(reason: str, then: str | None) -> None:
    assert next_step(reason, RHYTHM) == then


def test_the_step_follows_the_message_and_stands_alone_without_one() -> None:
    step = "written again at the next resync (about every 30 s)"
    assert with_next_step("HTTP 500", "ConfigMapFailed", RHYTHM) == f"HTTP 500; {step}"
    assert with_next_step("", "ConfigMapFailed", RHYTHM) == step
    assert with_next_step("taken", "ServiceNameConflict", RHYTHM) == "taken"
    # Ready carries WorkersConfigured's message over (WorkersNotConfigured): its step is said once.
    assert with_next_step(f"HTTP 500; {step}", "WorkersNotConfigured", RHYTHM) == f"HTTP 500; {step}"


def test_a_slower_resync_is_said_as_such() -> None:
    slower = Rhythm(resync_seconds=300, status_seconds=60)
    assert next_step("ScaleTargetNotFound", slower) == "looked for again at the next resync (about every 300 s)"
