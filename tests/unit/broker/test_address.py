from __future__ import annotations

import pytest
from kombu.connection import Connection

from celery_event_operator.core.broker import address as broker_address
from celery_event_operator.core.errors import BrokerSecretError


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
        pytest.param(f"amqp://user:{SECRET}@h:5672///", id="two-slashes-in-vhost"),
        pytest.param(f"amqp://user:{SECRET}@h:5672//a/b", id="unescaped-slash-after-the-leading-one"),
        pytest.param(f"http://user:{SECRET}@h/", id="not-amqp"),
        pytest.param(f"amqp://user:{SECRET}@/", id="no-host"),
        pytest.param(f"amqp://user:{SECRET}@h:5672/x y", id="space-in-vhost"),
        pytest.param(SECRET, id="not-a-url"),
        # an unescaped '/' or '?' in the user cut the userinfo short: the password was taken for the vhost (shown in
        # status) or the query (found by tests/fuzz)
        pytest.param(f"amqp://u/:{SECRET}@h", id="slash-in-user"),
        pytest.param(f"amqp://u?:{SECRET}@h:5672/", id="question-mark-in-user"),
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
        # The CRD's pattern allows it; urlsplit raised a bare ValueError outside the check (issue 40, finding 5).
        pytest.param("amqp://u:p@rabbit/", "http://[rabbit:15672/", "http", id="unbalanced-bracket"),
        pytest.param("amqp://u:p@rabbit/", "http://rabbit]:15672/", "http", id="closing-bracket"),
    ],
)
def test_management_url_elsewhere_is_refused(raw: str, configured: str, problem: str) -> None:
    """Issue #12, finding 1: a resource author could make the operator send the credentials anywhere."""
    with pytest.raises(broker_address.ManagementURLRejectedError, match=problem):
        broker_address.parse(raw).management_url(configured)


# The broker URLs of Celery's and kombu's documentation (and of the issue that asked for them), as a team
# pastes its CELERY_BROKER_URL: each must mean to the operator exactly what it means to kombu.
DOCUMENTED_URLS = [
    pytest.param("pyamqp://guest@localhost//", id="celery-first-steps"),
    pytest.param("amqp://myuser:mypassword@localhost:5672/myvhost", id="celery-using-rabbitmq"),
    pytest.param("amqp://guest:guest@localhost:5672//", id="celery-and-kombu-default-url"),
    pytest.param("amqp://guest@localhost//", id="user-without-password"),
    pytest.param("amqp://localhost//foo", id="kombu-vhost-with-a-leading-slash"),
    pytest.param("amqp://localhost/foo", id="kombu-vhost"),
    pytest.param("amqp://localhost/myvhost?ssl=1", id="kombu-query-ssl"),
    pytest.param("amqp://u:p@localhost/?ssl_cert_reqs=required", id="kombu-query-ssl-option"),
    pytest.param("amqp://u:p@localhost//?heartbeat=30", id="kombu-query-option"),
    pytest.param("amqps://guest:guest@localhost//", id="amqps"),
    pytest.param("AMQP://guest:guest@localhost//", id="scheme-in-capitals"),
    pytest.param("amqp://broker1:5672", id="kombu-failover-host"),
    pytest.param("pyamqp://guest:guest@127.0.0.1:5672//", id="issue-pyamqp-double-slash"),
    pytest.param("amqp://guest:guest@127.0.0.1:5672//", id="issue-amqp-double-slash"),
    pytest.param("amqp://guest:guest@127.0.0.1//", id="issue-no-port"),
    pytest.param("pyamqp://guest:guest@127.0.0.1:5672/%2F", id="issue-pyamqp-encoded-slash"),
    pytest.param("amqp://:@[::1]:5673/%2Fshop", id="ipv6-empty-credentials"),
]


@pytest.mark.parametrize("url", DOCUMENTED_URLS)
def test_documented_urls_mean_what_they_mean_to_kombu(url: str) -> None:
    info = Connection(url).info()
    [endpoint] = broker_address.parse(url).endpoints
    expected_host = info["hostname"].strip("[]")
    assert (endpoint.host, endpoint.port, endpoint.user, endpoint.password) == (
        expected_host,
        info["port"],
        info["userid"],
        info["password"],
    )
    assert broker_address.parse(url).vhost == info["virtual_host"]
    assert endpoint.tls == bool(info["ssl"])


@pytest.mark.parametrize("url", DOCUMENTED_URLS)
def test_the_operator_hands_kombu_the_same_broker_without_the_query(url: str) -> None:
    """The operator's own connections: the URL's endpoint and vhost, the operator's own options (its timeouts,
    heartbeat, and TLS from the scheme or the query, verified); the query stays in the workers' URL."""
    address = broker_address.parse(url)
    [operators] = address.urls
    assert "?" not in operators
    info, original = Connection(operators).info(), Connection(url).info()
    for field in ("hostname", "userid", "password", "virtual_host"):
        assert info[field] == original[field], field
    assert info["port"] == original["port"] or address.tls  # TLS: the port follows the `ssl` kombu is given
    assert broker_address.parse(operators).vhost == address.vhost


def test_failover_list_of_celery_urls() -> None:
    address = broker_address.parse("amqp://u:p@h1:5672//;amqp://u:p@h2:5672//")
    assert [endpoint.host_port for endpoint in address.endpoints] == ["h1:5672", "h2:5672"]
    assert address.vhost == "/"
    assert address.urls == ("amqp://u:p@h1:5672/%2F", "amqp://u:p@h2:5672/%2F")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        pytest.param("pyamqp://guest@localhost//", "pyamqp://guest@localhost/shop", id="celery-first-steps"),
        pytest.param("amqp://u:p@h//?heartbeat=30", "amqp://u:p@h/shop?heartbeat=30", id="query-kept"),
        pytest.param("amqp://u:p@h1//;amqp://u:p@h2", "amqp://u:p@h1/shop;amqp://u:p@h2/shop", id="failover"),
    ],
)
def test_the_workers_vhost_override_keeps_their_url_as_written(url: str, expected: str) -> None:
    assert broker_address.with_vhost(url, "shop") == expected
    assert Connection(expected.split(";", maxsplit=1)[0]).info()["virtual_host"] == "shop"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        pytest.param(f"pyamqps://u:{SECRET}@h//", "write amqps://", id="pyamqps-is-no-kombu-transport"),
        pytest.param(f"librabbitmq://u:{SECRET}@h//", "its scheme is 'librabbitmq'", id="other-transport"),
        pytest.param(f"amqp://u:{SECRET}@h/a/b", "vhost", id="ambiguous-vhost"),
    ],
)
def test_refusals_say_what_to_write(raw: str, problem: str) -> None:
    with pytest.raises(BrokerSecretError, match=problem) as error:
        broker_address.parse(raw)
    assert SECRET not in str(error.value)
