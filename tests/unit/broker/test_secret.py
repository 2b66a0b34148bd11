"""A service's broker settings from its Secret's data (pure): URL, management URL, TLS material."""

from __future__ import annotations

import pytest

from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.broker.address import ManagementURLRejectedError
from celery_event_operator.core.broker.settings import settings_from_secret
from celery_event_operator.core.errors import BrokerSecretError

SPEC = parse_spec({"broker": {"secretRef": {"name": "rabbitmq"}}})


def settings(data: dict[str, str], spec: object = SPEC) -> object:
    return settings_from_secret(data, namespace="shop", secret="rabbitmq", spec=spec)  # type: ignore[arg-type]


def test_url_management_url_and_tls_come_from_the_secret() -> None:
    found = settings_from_secret(
        {
            "url": "amqps://u:p@rabbit/",
            "managementURL": "https://rabbit:8443",
            "ca.crt": "CA",
            "tls.crt": "C",
            "tls.key": "K",
        },
        namespace="shop",
        secret="rabbitmq",
        spec=SPEC,
    )
    assert found.address.display == "rabbit:5671 vhost '/'"
    assert found.management_url == "https://rabbit:8443"
    assert (found.tls.ca, found.tls.cert, found.tls.key) == ("CA", "C", "K")
    assert "CA" not in repr(found)
    assert "p@" not in repr(found)


def test_the_key_changes_with_the_password_without_showing_it() -> None:
    one = settings_from_secret({"url": "amqp://u:first@rabbit/"}, namespace="s", secret="r", spec=SPEC)
    two = settings_from_secret({"url": "amqp://u:second@rabbit/"}, namespace="s", secret="r", spec=SPEC)
    assert one.key != two.key
    assert "first" not in one.key


@pytest.mark.parametrize(
    ("data", "error", "problem"),
    [
        pytest.param({}, BrokerSecretError, "has no key 'url'", id="no-key"),
        pytest.param({"url": "amqp://u:a/b@h/"}, BrokerSecretError, "percent-encoded", id="unescaped"),
        pytest.param({"url": "amqp://u:p@h/", "tls.crt": "C"}, BrokerSecretError, "without the other", id="half-tls"),
        pytest.param(
            {"url": "amqp://u:p@h/", "managementURL": "http://evil/"},
            ManagementURLRejectedError,
            "key 'managementURL'",
            id="management-elsewhere",
        ),
    ],
)
def test_unusable_secrets_are_named_not_shown(data: dict[str, str], error: type[Exception], problem: str) -> None:
    with pytest.raises(error, match=problem) as raised:
        settings(data)
    assert "Secret shop/rabbitmq" in str(raised.value)
    assert "a/b" not in str(raised.value)


def test_the_spec_management_url_must_name_the_broker() -> None:
    spec = parse_spec({"broker": {"secretRef": {"name": "rabbitmq"}, "managementURL": "http://attacker:15672"}})
    with pytest.raises(ManagementURLRejectedError, match=r"spec\.broker\.managementURL"):
        settings({"url": "amqp://u:p@rabbit/"}, spec)
