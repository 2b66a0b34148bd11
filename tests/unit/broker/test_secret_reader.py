"""The Secret reader through the API's passing faults: the last good data is served while the API does not answer,
the Secret is read again with backoff, and only a lasting silence is reported — as the API's fault, never as an
invalid Secret. A Secret that is gone is still the user's to fix."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from celery_event_operator.adapters.broker import secrets as secret_reading
from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.errors import BrokerSecretError, KubeForbiddenError, KubeUnavailableError, OperatorError

SPEC = parse_spec({"broker": {"secretRef": {"name": "rabbitmq"}}})
GOOD = {"url": "amqp://u:p@rabbit:5672/shop"}


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _Secrets:
    """AsyncKubeApi's shape: `read` answers from a script of results."""

    def __init__(self) -> None:
        self.api = self
        self.answer: dict[str, str] | OperatorError = GOOD
        self.reads = 0

    def read_secret_data(self, namespace: str, name: str) -> dict[str, str]:
        raise AssertionError("called through read() only")

    async def read(self, method: Callable[..., Any], namespace: str, name: str) -> dict[str, str]:
        self.reads += 1
        if isinstance(self.answer, OperatorError):
            raise self.answer
        return self.answer


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    found = _Clock()
    monkeypatch.setattr(secret_reading, "time", found)
    return found


def _reader(secrets: _Secrets) -> secret_reading.SecretReader:
    kube: Any = secrets
    return secret_reading.SecretReader(kube)


UNAVAILABLE = KubeUnavailableError("cannot read Secret shop/rabbitmq: HTTP 503 Service Unavailable")


async def test_the_last_good_data_is_served_while_the_api_does_not_answer(clock: _Clock) -> None:
    secrets = _Secrets()
    reader = _reader(secrets)
    first = await reader.settings("shop", SPEC)
    secrets.answer = UNAVAILABLE
    clock.now += secret_reading.CACHE_SECONDS + 1
    assert await reader.settings("shop", SPEC) == first
    assert secrets.reads == 2
    # Read again with backoff (1, 2, 4 … s), not on every call meanwhile.
    clock.now += 0.5
    await reader.settings("shop", SPEC)
    assert secrets.reads == 2
    clock.now += 1
    await reader.settings("shop", SPEC)
    assert secrets.reads == 3
    clock.now += 1
    await reader.settings("shop", SPEC)
    assert secrets.reads == 3, "the second pause is 2 s"
    # Lasting: said as the API's fault (the caller keeps its broker), never BrokerSecretInvalid.
    clock.now += secret_reading.UNAVAILABLE_GRACE_SECONDS
    with pytest.raises(KubeUnavailableError, match=r"does not answer \(for 60 s; the settings last read are kept\)"):
        await reader.settings("shop", SPEC)
    # The API answers again: all is as before.
    secrets.answer = GOOD
    clock.now += secret_reading.CACHE_SECONDS
    assert await reader.settings("shop", SPEC) == first


async def test_nothing_read_yet_is_said_at_once_and_read_again_soon(clock: _Clock) -> None:
    secrets = _Secrets()
    secrets.answer = UNAVAILABLE
    reader = _reader(secrets)
    with pytest.raises(KubeUnavailableError) as raised:
        await reader.settings("shop", SPEC)
    assert raised.value.reason == "KubernetesAPIUnavailable"
    secrets.answer = GOOD
    clock.now += secret_reading.UNAVAILABLE_BACKOFF_SECONDS
    assert (await reader.settings("shop", SPEC)).address.vhost == "shop"


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        pytest.param(BrokerSecretError("Secret shop/rabbitmq does not exist"), "BrokerSecretInvalid", id="gone"),
        pytest.param(
            KubeForbiddenError("cannot read Secret shop/rabbitmq: HTTP 403 Forbidden: the operator's RBAC lacks …"),
            "KubernetesAPIForbidden",
            id="forbidden",
        ),
    ],
)
async def test_a_secret_gone_or_forbidden_is_not_served_from_memory(
    clock: _Clock, failure: OperatorError, reason: str
) -> None:
    secrets = _Secrets()
    reader = _reader(secrets)
    await reader.settings("shop", SPEC)
    secrets.answer = failure
    clock.now += secret_reading.CACHE_SECONDS + 1
    with pytest.raises(OperatorError) as raised:
        await reader.settings("shop", SPEC)
    assert raised.value.reason == reason


async def test_forget_reads_again_and_keeps_the_data_through_a_fault(clock: _Clock) -> None:
    secrets = _Secrets()
    reader = _reader(secrets)
    first = await reader.settings("shop", SPEC)
    reader.forget("shop", "rabbitmq")
    secrets.answer = UNAVAILABLE
    assert await reader.settings("shop", SPEC) == first
    assert secrets.reads == 2


async def test_a_secret_no_service_asks_for_is_forgotten(clock: _Clock) -> None:
    secrets = _Secrets()
    reader = _reader(secrets)
    await reader.settings("shop", SPEC)
    other = parse_spec({"broker": {"secretRef": {"name": "other"}}})
    clock.now += secret_reading.FORGET_SECONDS + 1
    await reader.settings("shop", other)
    assert set(reader._read) == {("shop", "other")}
