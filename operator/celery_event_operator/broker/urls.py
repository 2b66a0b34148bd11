"""Broker URLs from Secrets (pure): failover lists, vhost override, and text safe to show."""

from __future__ import annotations

import dataclasses
import hashlib
import urllib.parse

ALLOWED_SCHEMES = frozenset({"amqp", "amqps", "pyamqp"})


class BrokerUrlError(ValueError):
    """The URL cannot be used; the message never contains credentials."""


@dataclasses.dataclass(frozen=True)
class BrokerAddress:
    """Where and how to connect. `urls` hold credentials: never log or show them, use `display`."""

    urls: tuple[str, ...]
    failover_strategy: str
    vhost: str

    @property
    def key(self) -> str:
        """Identifies one broker connection without carrying the credentials."""
        material = "\n".join((*self.urls, self.failover_strategy, self.vhost))
        return hashlib.sha256(material.encode()).hexdigest()[:16]

    @property
    def display(self) -> str:
        hosts = ", ".join(_host_port(url) for url in self.urls)
        return f"{hosts} vhost {self.vhost!r}"


def _host_port(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.hostname}:{parts.port or (5671 if parts.scheme == 'amqps' else 5672)}"


def _vhost_of(url: str) -> str:
    path = urllib.parse.urlsplit(url).path
    if path in ("", "/"):
        return "/"
    return urllib.parse.unquote(path[1:])


def _with_vhost(url: str, vhost: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + urllib.parse.quote(vhost, safe="")))


def parse(raw: str, *, failover_strategy: str, vhost_override: str | None) -> BrokerAddress:
    """`amqp://u:p@h1/vh;amqp://u:p@h2/vh` → an address; every URL gets the same vhost."""
    urls = [part.strip() for part in raw.strip().split(";") if part.strip()]
    if not urls:
        raise BrokerUrlError("the broker Secret holds no URL")
    for index, url in enumerate(urls):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ALLOWED_SCHEMES or not parts.hostname:
            raise BrokerUrlError(f"broker URL #{index + 1} is not an amqp[s]://host URL")
    vhosts = {_vhost_of(url) for url in urls}
    if vhost_override is None and len(vhosts) > 1:
        raise BrokerUrlError("the failover URLs name different vhosts; set spec.broker.vhost")
    vhost = vhost_override if vhost_override is not None else vhosts.pop()
    return BrokerAddress(tuple(_with_vhost(url, vhost) for url in urls), failover_strategy, vhost)


def redact(text: str, address: BrokerAddress) -> str:
    """Remove anything secret an error text from a client library might echo."""
    for url in address.urls:
        parts = urllib.parse.urlsplit(url)
        text = text.replace(url, _host_port(url))
        for secret in (parts.password, urllib.parse.unquote(parts.password or "")):
            if secret:
                text = text.replace(secret, "***")
    return text
