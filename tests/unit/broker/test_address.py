from __future__ import annotations

import pytest

from celery_event_operator.broker import address as broker_address
from celery_event_operator.errors import BrokerSecretError


@pytest.mark.parametrize(
    ("raw", "override", "expected_urls", "vhost"),
    [
        pytest.param("amqp://u:p@h:5672/", None, ("amqp://u:p@h:5672/%2F",), "/", id="default-vhost"),
        pytest.param("amqp://u:p@h/shop", None, ("amqp://u:p@h/shop",), "shop", id="url-vhost"),
        pytest.param("amqp://u:p@h/%2Fshop", None, ("amqp://u:p@h/%2Fshop",), "/shop", id="encoded-vhost"),
        pytest.param(
            "amqp://u:p@h1/a; amqp://u:p@h2/a", None, ("amqp://u:p@h1/a", "amqp://u:p@h2/a"), "a", id="failover-list"
        ),
        pytest.param(
            "amqp://u:p@h1/a;amqp://u:p@h2/b",
            "c",
            ("amqp://u:p@h1/c", "amqp://u:p@h2/c"),
            "c",
            id="override-unifies-vhosts",
        ),
    ],
)
def test_parse(raw: str, override: str | None, expected_urls: tuple[str, ...], vhost: str) -> None:
    address = broker_address.parse(raw, failover_strategy="round-robin", vhost_override=override)
    assert address.urls == expected_urls
    assert address.vhost == vhost


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        pytest.param("", "no URL", id="empty"),
        pytest.param("redis://u:secret@h/0", "not an amqp", id="wrong-scheme"),
        pytest.param("amqp://u:secret@h1/a;amqp://u:secret@h2/b", "different vhosts", id="ambiguous-vhost"),
    ],
)
def test_parse_rejects_without_echoing_secrets(raw: str, problem: str) -> None:
    with pytest.raises(BrokerSecretError, match=problem) as error:
        broker_address.parse(raw, failover_strategy="shuffle", vhost_override=None)
    assert "secret" not in str(error.value)


def test_display_key_and_redaction_keep_credentials_out() -> None:
    address = broker_address.parse(
        "amqp://user:s3cr%40t@h1:5673/a;amqps://user:s3cr%40t@h2/a",
        failover_strategy="round-robin",
        vhost_override=None,
    )
    assert address.display == "h1:5673, h2:5671 vhost 'a'"
    assert "s3cr" not in address.key
    text = f"failed: {address.urls[0]} said s3cr@t and s3cr%40t"
    assert "s3cr" not in address.redact(text)
    other = broker_address.parse("amqp://user:other@h1:5673/a", failover_strategy="round-robin", vhost_override=None)
    assert other.key != address.key


SECRET = "s3cr3t-P4ss"


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(f"amqp://user:{SECRET}/x@h:5672/", id="slash-in-password"),
        pytest.param(f"amqp://user:{SECRET}#x@h:5672/", id="hash-in-password"),
        pytest.param(f"amqp://user:{SECRET}?x@h:5672/", id="question-mark-in-password"),
        pytest.param(f"amqp://user:{SECRET}@x@h:5672/", id="at-in-password"),
        pytest.param(f"amqp://user:{SECRET}%zz@h:5672/", id="bad-percent-escape"),
        pytest.param(f"amqp://user:pw@h:{SECRET}/", id="port-not-a-number"),
        pytest.param("amqp://user:pw@h:99999/", id="port-out-of-range"),
        pytest.param(f"amqp://user:{SECRET}@h:5672/a/b", id="unescaped-slash-in-vhost"),
        pytest.param(f"http://user:{SECRET}@h/", id="not-amqp"),
        pytest.param(f"amqp://user:{SECRET}@/", id="no-host"),
        pytest.param(f"amqp://user:{SECRET}@h:5672/x y", id="space-in-vhost"),
        pytest.param(SECRET, id="not-a-url"),
    ],
)
def test_urls_that_do_not_round_trip_are_refused_without_any_part_of_them(raw: str) -> None:
    """Issue #12, finding 2: `urls.parse` accepted these, and a ValueError with the password escaped later."""
    with pytest.raises(BrokerSecretError) as error:
        broker_address.parse(raw)
    assert SECRET not in str(error.value)
    assert "99999" not in str(error.value)
    assert error.value.__cause__ is None


@pytest.mark.parametrize(
    ("raw", "configured", "expected"),
    [
        pytest.param("amqp://u:p@rabbit:5672/", None, "http://rabbit:15672", id="derived-plain"),
        pytest.param("amqps://u:p@rabbit/", None, "https://rabbit:15671", id="derived-tls-is-https"),
        pytest.param("amqp://u:p@rabbit/", "http://rabbit:8080/mgmt/", "http://rabbit:8080/mgmt", id="same-host"),
        pytest.param("amqp://u:p@a/;amqp://u:p@b/", "http://b:15672", "http://b:15672", id="any-failover-host"),
    ],
)
def test_management_url_names_the_broker(raw: str, configured: str | None, expected: str) -> None:
    assert broker_address.parse(raw).management_url(configured) == expected


@pytest.mark.parametrize(
    ("raw", "configured", "problem"),
    [
        pytest.param(
            "amqp://u:p@rabbit/", "http://attacker.example:15672", "none of the broker's hosts", id="other-host"
        ),
        pytest.param("amqps://u:p@rabbit/", "http://rabbit:15672", "https", id="clear-text-for-tls-broker"),
        pytest.param("amqp://u:p@rabbit/", "http://x:y@rabbit:15672", "without credentials", id="credentials"),
        pytest.param("amqp://u:p@rabbit/", "ftp://rabbit/", "http", id="scheme"),
        pytest.param("amqp://u:p@rabbit/", "http://rabbit:port/", "http", id="bad-port"),
    ],
)
def test_management_url_elsewhere_is_refused(raw: str, configured: str, problem: str) -> None:
    """Issue #12, finding 1: a resource author could make the operator send the credentials anywhere."""
    with pytest.raises(broker_address.ManagementURLRejectedError, match=problem):
        broker_address.parse(raw).management_url(configured)
