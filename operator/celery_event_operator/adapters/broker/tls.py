"""TLS to the broker: the host name is verified, the CA and a client certificate may come from the Secret.

The optional Secret keys `ca.crt`, `tls.crt` and `tls.key` (the names of a `kubernetes.io/tls` Secret
and cert-manager's) hold PEM text. Python's ssl module loads a client certificate from files only, so
the material is written to a private directory (mode 0700, files 0600) for the lifetime of the broker's
connections and removed with them. Without `ca.crt`, the system's CAs are trusted.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import ssl
import tempfile

from celery_event_operator.core.broker.settings import CA_KEY, CERT_KEY, PRIVATE_KEY_KEY, TlsMaterial
from celery_event_operator.core.errors import BrokerSecretError


class TlsFiles:
    """The material written where ssl and py-amqp can load it from; `remove()` when done."""

    def __init__(self, material: TlsMaterial) -> None:
        if (material.cert is None) != (material.key is None):
            raise BrokerSecretError(f"the broker Secret has {CERT_KEY} or {PRIVATE_KEY_KEY} without the other")
        self._directory = pathlib.Path(tempfile.mkdtemp(prefix="celery-event-operator-tls-"))  # mode 0700
        self.ca_file = self._write(CA_KEY, material.ca)
        self.cert_file = self._write(CERT_KEY, material.cert)
        self.key_file = self._write(PRIVATE_KEY_KEY, material.key)
        try:
            client_context(self)  # refuse unusable material now, with a message that names the key, not its content
        except (ssl.SSLError, OSError, ValueError) as exc:
            self.remove()
            raise BrokerSecretError(
                f"the broker Secret's TLS material ({CA_KEY}/{CERT_KEY}/{PRIVATE_KEY_KEY}) cannot be loaded: "
                f"{type(exc).__name__}"
            ) from None

    @classmethod
    def of(cls, material: TlsMaterial) -> TlsFiles | None:
        """The files of a Secret's TLS material; None when it holds none (the system's CAs, no client certificate)."""
        return cls(material) if material.ca or material.cert else None

    def _write(self, name: str, content: str | None) -> str | None:
        if content is None:
            return None
        path = self._directory / name
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(content)
        return str(path)

    def context(self) -> ssl.SSLContext:
        return client_context(self)

    def remove(self) -> None:
        shutil.rmtree(self._directory, ignore_errors=True)


def client_context(tls: TlsFiles | None) -> ssl.SSLContext:
    """A client context that verifies the broker's chain (the Secret's CA, else the system's) and host name."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file if tls else None)
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    if tls is not None and tls.cert_file is not None:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context


def kombu_options(tls: TlsFiles | None, server_hostname: str) -> dict[str, object]:
    """py-amqp's `ssl` options for one endpoint: its chain and host name are checked, as for the events."""
    options: dict[str, object] = {"server_hostname": server_hostname, "cert_reqs": ssl.CERT_REQUIRED}
    if tls is not None and tls.ca_file is not None:
        options["ca_certs"] = tls.ca_file
    if tls is not None and tls.cert_file is not None:
        options |= {"certfile": tls.cert_file, "keyfile": tls.key_file}
    return options
