"""Broker addresses (pure, stdlib only): the one place that parses a broker URL.

A Secret's URL means what it means to kombu (a team pastes its CELERY_BROKER_URL): the schemes of kombu's
py-amqp transport (`amqp://`, `pyamqp://`, `amqps://`), `//` for the vhost `/` (`//shop` for `/shop`), the
default port, user and password (guest) where the URL leaves them out, TLS from `amqps://` or from the
query's `ssl`/`ssl_*` options. It is parsed strictly all the same: a URL that would not come back the same
from a parser (a `/`, `#`, `?` or `@` left unescaped in the password, a `/` inside the vhost, a port that is
no number) is refused with a message that names the problem and never any part of the URL. Used by the
operator, the command line and the worker runtime (which imports nothing but this module of the operator's).

The operator's own connections take the endpoint, credentials and vhost from the URL and nothing else of
its query (their timeouts and heartbeat are the operator's; TLS is always verified); the workers' URL keeps
its query as written.

Credentials go to no host but the broker's: the management API's URL is derived from the broker URL
(https on 15671 for amqps://, http on 15672 otherwise), or given explicitly — and then its host must be
one of the broker's hosts and its scheme https when the broker speaks TLS.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import urllib.parse

from celery_event_operator.core.errors import BrokerSecretError, OperatorError

# kombu's aliases of its py-amqp transport (kombu.transport.TRANSPORT_ALIASES), by TLS.
SCHEMES = {"amqp": False, "pyamqp": False, "amqps": True}
PORTS = {False: 5672, True: 5671}  # by TLS, as kombu's py-amqp transport defaults them
MANAGEMENT_PORTS = {False: 15672, True: 15671}  # by TLS
DEFAULT_LOGIN = "guest"  # kombu's user and password where the URL gives none (or an empty one)

# scheme://[user[:password]@]host[:port][/vhost][?query] with every reserved character of the user,
# password and vhost percent-encoded. `:` may appear in the password (only the first one separates).
# kombu's vhost is the path after its first '/': `//` is the vhost '/' and `//shop` is '/shop' (Celery's
# and kombu's documented forms); any other '/' must be encoded, as `/a/b` is 'a/b' to kombu but 'a' to
# other clients and no vhost at all to RabbitMQ's URI spec.
_URL = re.compile(
    r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://"
    r"(?:(?P<user>[^:@/?#\[\]\s]*)(?::(?P<password>[^@/?#\[\]\s]*))?@)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^:@/?#\[\]\s]+)"
    r"(?::(?P<port>[0-9]{1,5}))?"
    r"(?P<path>//?[^/?#@\s]*)?"  # an '@' after the host: the user or password held an unescaped '/' or '?'
    r"(?:\?(?P<query>[^#@\s]*))?$"  # (which would put the password in the vhost or the query, shown or passed on)
)
_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
URL_FORM = (
    "amqp[s]://[user[:password]@]host[:port][/vhost] (or pyamqp://; `//` is the vhost '/'), with '/', '#', "
    "'?', '@', '[', ']' and '%' in the user, password or vhost percent-encoded"
)


class ManagementURLRejectedError(OperatorError):
    """An explicit management API URL that would send the credentials to another host, or in clear text."""

    reason = "ManagementURLRejected"


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One broker URL, parsed. `user` and `password` are decoded; never show them."""

    scheme: str
    host: str
    port: int
    user: str = dataclasses.field(repr=False)
    password: str = dataclasses.field(repr=False)
    vhost: str
    query: str = dataclasses.field(repr=False)  # the Secret's: a typo can put the password there
    tls: bool
    written: str = dataclasses.field(repr=False)  # the URL as the Secret has it

    @property
    def host_port(self) -> str:
        return f"{self.host}:{self.port}"


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def parse_url(raw: str, *, position: int = 1) -> Endpoint:
    """One URL; BrokerSecretError (naming its position in the list, never its content) when unusable."""
    what = f"broker URL #{position}"
    match = _URL.match(raw)
    if match is None:
        raise BrokerSecretError(f"{what} is not of the form {URL_FORM}")
    scheme = match["scheme"].lower()
    if scheme == "pyamqps":
        raise BrokerSecretError(f"{what}: kombu has no pyamqps:// transport; write amqps:// for AMQP over TLS")
    if scheme not in SCHEMES:
        raise BrokerSecretError(f"{what} is not an amqp[s]:// or pyamqp:// URL (its scheme is {scheme!r})")
    for part in ("user", "password", "path", "query"):
        if match[part] and _PERCENT.search(match[part]):
            raise BrokerSecretError(f"{what}: a '%' in the {part} is not followed by two hex digits; encode it as %25")
    query = match["query"] or ""
    tls = SCHEMES[scheme] or _query_asks_for_tls(query)
    port = int(match["port"]) if match["port"] else PORTS[tls]
    if not 0 < port < 65536:
        raise BrokerSecretError(f"{what} has a port out of range")
    return Endpoint(
        scheme=scheme,
        host=match["host"].strip("[]").lower(),
        port=port,
        user=urllib.parse.unquote(match["user"] or "") or DEFAULT_LOGIN,
        password=urllib.parse.unquote(match["password"] or "") or DEFAULT_LOGIN,
        vhost=urllib.parse.unquote((match["path"] or "/")[1:]) or "/",
        query=query,
        tls=tls,
        written=raw,
    )


def _query_asks_for_tls(query: str) -> bool:
    """kombu's reading: an `ssl` option with any value, or any `ssl_*` option (the options become its `ssl`)."""
    options = urllib.parse.parse_qsl(query, keep_blank_values=True)
    return any((key == "ssl" and value) or key.startswith("ssl_") for key, value in options)


@dataclasses.dataclass(frozen=True)
class BrokerAddress:
    """Where and how to connect; the same broker for every URL of a failover list."""

    endpoints: tuple[Endpoint, ...]
    failover_strategy: str
    vhost: str

    @property
    def urls(self) -> tuple[str, ...]:
        """The operator's own URLs (with credentials: for client libraries only, never to show): as written, with
        the address's vhost and without the query, whose options are the workers' (the operator's connections
        set their own timeouts, heartbeat and verified TLS)."""
        return tuple(_replace_vhost(endpoint.written, self.vhost, query=False) for endpoint in self.endpoints)

    @property
    def tls(self) -> bool:
        return any(endpoint.tls for endpoint in self.endpoints)

    @property
    def key(self) -> str:
        """Identifies one broker login (hosts, credentials, vhost) without carrying the credentials."""
        material = "\n".join((*self.urls, self.failover_strategy, self.vhost))
        return hashlib.sha256(material.encode()).hexdigest()[:16]

    @property
    def display(self) -> str:
        hosts = ", ".join(endpoint.host_port for endpoint in self.endpoints)
        return f"{hosts} vhost {self.vhost!r}"

    def management_url(self, configured: str | None = None) -> str:
        """The management API's base URL: derived from the broker, or `configured` if it names the broker."""
        if not configured:
            first = self.endpoints[0]
            host = f"[{first.host}]" if ":" in first.host else first.host
            return f"{'https' if first.tls else 'http'}://{host}:{MANAGEMENT_PORTS[first.tls]}"
        malformed = ManagementURLRejectedError(
            "the management API URL must be http[s]://host[:port][/path] without credentials"
        )
        try:
            parts = urllib.parse.urlsplit(configured)  # raises on an unbalanced '[' or ']'
            host = (parts.hostname or "").lower()
            parts.port  # noqa: B018  (raises on a port that is no number)
        except ValueError:
            raise malformed from None
        if parts.scheme not in ("http", "https") or not host or parts.username or parts.password:
            raise malformed
        if host not in {endpoint.host for endpoint in self.endpoints}:
            raise ManagementURLRejectedError(
                f"the management API host {host!r} is none of the broker's hosts "
                f"({', '.join(sorted({e.host for e in self.endpoints}))}): the broker's credentials are sent "
                "to the broker only"
            )
        if self.tls and parts.scheme != "https":
            raise ManagementURLRejectedError(
                "the broker is reached over TLS (amqps://): its management API must be https:// too"
            )
        return configured.rstrip("/")

    def redact(self, text: str) -> str:
        """Remove anything secret that an error text from a client library might echo."""
        for endpoint, url in zip(self.endpoints, self.urls, strict=True):
            for form in (url, endpoint.written):
                if form:
                    text = text.replace(form, endpoint.host_port)
            written = _URL.match(endpoint.written)
            secrets = {endpoint.password, _quote(endpoint.password), urllib.parse.quote(endpoint.password)}
            if written is not None and written["password"]:
                secrets.add(written["password"])
            for secret in sorted(secrets, key=len, reverse=True):
                if secret and secret != "guest":
                    text = text.replace(secret, "***")
        return text


def parse(raw: str, *, failover_strategy: str = "round-robin", vhost_override: str | None = None) -> BrokerAddress:
    """`amqp://u:p@h1/vh;amqp://u:p@h2/vh` → an address; every URL gets the same vhost."""
    parts = [part.strip() for part in raw.strip().split(";") if part.strip()]
    if not parts:
        raise BrokerSecretError("the broker Secret holds no URL")
    endpoints = tuple(parse_url(part, position=index + 1) for index, part in enumerate(parts))
    vhosts = {endpoint.vhost for endpoint in endpoints}
    if vhost_override is None and len(vhosts) > 1:
        raise BrokerSecretError("the failover URLs name different vhosts; set spec.broker.vhost")
    vhost = vhost_override if vhost_override is not None else vhosts.pop()
    return BrokerAddress(endpoints, failover_strategy, vhost)


def _replace_vhost(written: str, vhost: str, *, query: bool = True) -> str:
    """The URL as written, with its vhost (its path) replaced, and its query unless `query` is False;
    `written` was accepted by parse_url."""
    match = _URL.match(written)
    assert match is not None
    if match["path"]:
        start, end = match.span("path")
    else:
        start = end = match.end("port") if match["port"] else match.end("host")
    rest = written[end:] if query else ""
    return f"{written[:start]}/{_quote(vhost)}{rest}"


def with_vhost(urls: str, vhost: str) -> str:
    """A `;`-separated URL list with each URL's vhost replaced, the rest as written (the worker runtime's
    vhost override)."""
    parts = [part.strip() for part in urls.split(";") if part.strip()]
    return ";".join(
        _replace_vhost(parse_url(part, position=index + 1).written, vhost) for index, part in enumerate(parts)
    )
