"""A Secret's broker URL and a spec's managementURL, written by users: parsed, or refused with the documented error
(BrokerSecretError, ManagementURLRejected) whose message carries no part of the URL's password; an accepted
management API URL names one of the broker's hosts, over https when the broker speaks TLS."""

from __future__ import annotations

import contextlib
import urllib.parse

from hypothesis import given
from hypothesis import strategies as st

from celery_event_operator.core.broker import address
from celery_event_operator.core.errors import BrokerSecretError
from tests.fuzz.strategies import TEXT, UTF8_TEXT

# A Secret's value is UTF-8 text (others are left out when it is read), a resource's JSON too.
SCHEMES = st.one_of(st.sampled_from(["amqp", "amqps", "pyamqp", "pyamqps", "AMQP", "http", ""]), UTF8_TEXT)
HOSTS = st.one_of(st.sampled_from(["rabbit", "10.0.0.1", "[::1]", "[::1", "::1]", "Rabbit.Example", ""]), UTF8_TEXT)
PORTS = st.one_of(st.none(), st.integers(min_value=0, max_value=99_999).map(str), UTF8_TEXT)
# A password unlike anything the messages say, so that finding it in one is a leak; with characters that break URLs.
PASSWORDS = st.builds(
    "Zq7{}Zq7".format, st.one_of(UTF8_TEXT, st.sampled_from(["/", "#", "?", "@", "%", "%4", ":", "[", " "]))
)
QUERIES = st.one_of(st.none(), st.sampled_from(["ssl=1", "ssl_cert_reqs=required", "heartbeat=30", "ssl="]), UTF8_TEXT)


@st.composite
def urls(draw: st.DrawFn) -> tuple[str, str]:
    """(a URL, its password as written)."""
    password = draw(PASSWORDS)
    user = draw(st.one_of(st.just("user"), UTF8_TEXT))
    port = draw(PORTS)
    vhost = draw(st.one_of(st.none(), st.sampled_from(["", "/", "shop", "%2Fshop", "a/b"]), UTF8_TEXT))
    query = draw(QUERIES)
    url = f"{draw(SCHEMES)}://{user}:{password}@{draw(HOSTS)}"
    url += f":{port}" if port is not None else ""
    url += f"/{vhost}" if vhost is not None else ""
    url += f"?{query}" if query is not None else ""
    return url, password


@given(url=urls(), more=st.lists(urls(), max_size=2), override=st.one_of(st.none(), UTF8_TEXT))
def test_a_broker_url_is_parsed_or_refused_without_its_password(
    url: tuple[str, str], more: list[tuple[str, str]], override: str | None
) -> None:
    raw = ";".join(written for written, _ in [url, *more])
    passwords = [password for _, password in [url, *more]]
    try:
        parsed = address.parse(raw, vhost_override=override)
    except BrokerSecretError as exc:
        refusal = str(exc)
    else:
        refusal = None
    if refusal is not None:
        assert not any(password in refusal for password in passwords)
        return
    shown = " ".join([parsed.display, parsed.key, repr(parsed), *(repr(endpoint) for endpoint in parsed.endpoints)])
    assert not any(password in shown for password in passwords)
    redacted = parsed.redact(f"connection to {raw} failed: {raw!r} {urllib.parse.quote(raw)}")
    assert not any(urllib.parse.unquote(password) in redacted for password in passwords if password != "guest")


@given(text=TEXT)
def test_any_text_is_a_broker_url_or_refused(text: str) -> None:
    with contextlib.suppress(BrokerSecretError):
        address.parse(text)


@given(
    broker=st.sampled_from(["amqp://u:p@rabbit/", "amqps://u:p@rabbit/", "amqp://u:p@[::1]/;amqp://u:p@b/"]),
    scheme=st.one_of(st.sampled_from(["http", "https", "ftp", ""]), UTF8_TEXT),
    host=HOSTS,
    rest=st.one_of(st.sampled_from(["", ":15672", ":port", ":99999", "/api/", "@x", "]:1"]), UTF8_TEXT),
)
def test_a_management_url_names_the_broker_or_is_refused(broker: str, scheme: str, host: str, rest: str) -> None:
    parsed = address.parse(broker)
    configured = f"{scheme}://{host}{rest}"
    try:
        found = parsed.management_url(configured)
    except address.ManagementURLRejectedError:
        return
    parts = urllib.parse.urlsplit(found)
    assert parts.hostname in {endpoint.host for endpoint in parsed.endpoints}
    assert parts.scheme == "https" or not parsed.tls
    assert not parts.username
    assert not parts.password
