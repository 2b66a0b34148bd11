"""A service's broker settings from its Secret's data (pure): the URL, the management API, the TLS material.

The Secret holds the broker URL under `spec.broker.secretRef.key` and, optionally, `managementURL` (the
management API, when it is not at the URL derived from the broker's host), `ca.crt`, `tls.crt` and
`tls.key` (TLS; the names of a `kubernetes.io/tls` Secret and cert-manager's, PEM text). Nothing of it is ever
shown: errors name the Secret and the key, never a value.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping

from celery_event_operator.core.api.models import CeleryEventServiceSpec
from celery_event_operator.core.broker import address as broker_addresses
from celery_event_operator.core.errors import BrokerSecretError

MANAGEMENT_URL_KEY = "managementURL"
CA_KEY = "ca.crt"
CERT_KEY = "tls.crt"
PRIVATE_KEY_KEY = "tls.key"


@dataclasses.dataclass(frozen=True)
class TlsMaterial:
    """PEM text from the Secret; never show it."""

    ca: str | None = dataclasses.field(default=None, repr=False)
    cert: str | None = dataclasses.field(default=None, repr=False)
    key: str | None = dataclasses.field(default=None, repr=False)

    @property
    def fingerprint(self) -> tuple[bool, bool, int]:
        """Something that changes with the material without showing it (part of a broker's identity)."""
        return (self.ca is not None, self.cert is not None, hash((self.ca, self.cert, self.key)))


@dataclasses.dataclass(frozen=True)
class BrokerSettings:
    """Everything needed to talk to one broker as one user; `key` identifies it without showing it."""

    address: broker_addresses.BrokerAddress
    tls: TlsMaterial
    management_url: str

    @property
    def key(self) -> str:
        material = "\n".join((self.address.key, repr(self.tls.fingerprint), self.management_url))
        return hashlib.sha256(material.encode()).hexdigest()[:16]


def settings_from_secret(
    data: Mapping[str, str], *, namespace: str, secret: str, spec: CeleryEventServiceSpec
) -> BrokerSettings:
    """The settings a Secret's data gives a service; BrokerSecretError / ManagementURLRejectedError otherwise."""
    key = spec.broker.secret_ref.key
    where = f"Secret {namespace}/{secret}"
    if key not in data:
        raise BrokerSecretError(f"{where} has no key {key!r} (or its value is not UTF-8 text)")
    try:
        address = broker_addresses.parse(
            data[key], failover_strategy=spec.broker.failover_strategy, vhost_override=spec.broker.vhost
        )
    except BrokerSecretError as exc:
        raise BrokerSecretError(f"{where} key {key!r}: {exc}") from None
    explicit, source = (
        (data[MANAGEMENT_URL_KEY], f"{where} key {MANAGEMENT_URL_KEY!r}")
        if data.get(MANAGEMENT_URL_KEY)
        else (spec.broker.management_url, "spec.broker.managementURL")
    )
    try:
        management_url = address.management_url(explicit)
    except broker_addresses.ManagementURLRejectedError as exc:
        raise broker_addresses.ManagementURLRejectedError(f"{source}: {exc}") from None
    tls = TlsMaterial(ca=data.get(CA_KEY), cert=data.get(CERT_KEY), key=data.get(PRIVATE_KEY_KEY))
    if (tls.cert is None) != (tls.key is None):
        raise BrokerSecretError(f"{where} has {CERT_KEY} or {PRIVATE_KEY_KEY} without the other")
    return BrokerSettings(address, tls, management_url)
