"""What happens next, as every service condition that is not True says it (core/service/next_steps.py)."""

from __future__ import annotations

import pytest

from celery_event_operator.core import errors
from celery_event_operator.core.broker.address import ManagementURLRejectedError
from celery_event_operator.core.service.next_steps import NEXT_STEPS, Rhythm, next_step, with_next_step

RHYTHM = Rhythm(resync_seconds=30, api_retry_seconds=5, status_seconds=15)


def operator_errors(kind: type[errors.OperatorError] = errors.OperatorError) -> list[type[errors.OperatorError]]:
    found = []
    for subclass in kind.__subclasses__():
        found += [subclass, *operator_errors(subclass)]
    return found


def test_every_error_reason_has_its_next_step() -> None:
    """A failure's reason (errors.py, and the address's) reaches a condition as it is: each has its line."""
    reasons = {kind.reason for kind in operator_errors()} | {ManagementURLRejectedError.reason}
    assert reasons - set(NEXT_STEPS) == set()


@pytest.mark.parametrize(
    ("reason", "then"),
    [
        ("InvalidSpec", "nothing is done until the spec is corrected"),
        ("BrokerUnreachable", "tried again within 30 s"),
        ("BrokerSecretInvalid", "the Secret is read again within 30 s"),
        ("BrokerRefused", "tried again within 30 s; the broker's user needs the rights to declare it"),
        ("KubernetesAPIUnavailable", "asked again within 5 s"),
        ("KubernetesAPIForbidden", "tried again within 30 s; the operator's RBAC must allow it"),
        ("BrokerAlarm", "publishers stay blocked until RabbitMQ clears it; checked every 15 s"),
        ("ScaleTargetNotFound", "looked for again within 30 s"),
        ("NotChecked", "checked again every 15 s"),
        ("EventsNotConsumed", "the consumer connects again by itself, at most 60 s apart"),
        ("ServiceNameConflict", None),  # its message says it: taken over once the owner is gone
        ("TasksRerun", None),  # its message ends with what to change
        ("SomethingNew", None),  # unknown here: the message as it is, never an error
    ],
)
def test_what_follows_each_reason(reason: str, then: str | None) -> None:
    assert next_step(reason, RHYTHM) == then


def test_the_step_follows_the_message_and_stands_alone_without_one() -> None:
    assert with_next_step("cannot reach the broker", "BrokerUnreachable", RHYTHM) == (
        "cannot reach the broker; tried again within 30 s"
    )
    assert with_next_step("", "BrokerUnreachable", RHYTHM) == "tried again within 30 s"
    assert with_next_step("taken", "ServiceNameConflict", RHYTHM) == "taken"


def test_a_slower_resync_is_said_as_such() -> None:
    assert next_step("BrokerUnreachable", Rhythm(300, 5, 60)) == "tried again within 300 s"
