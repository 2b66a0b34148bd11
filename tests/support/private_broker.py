"""A RabbitMQ node of a test's own, for tests that stop or restart a broker.

It is of the test run's RabbitMQ version (`CEO_RABBITMQ_VERSION`, set by `./dev test`; the newest otherwise), from
that version's root filesystem (devcluster/rabbitmq), with its own node name, ports, epmd, config, data and log
directories: stopping it never touches the run's shared broker or the machine's own.
"""

from __future__ import annotations

import pathlib
import secrets
import shutil

from celery_event_devcluster import rabbitmq
from tests.support.operator_process import free_port


class PrivateRabbit:
    def __init__(
        self,
        base: pathlib.Path,
        tls: tuple[pathlib.Path, pathlib.Path] | None = None,
        client_ca: pathlib.Path | None = None,
        management: bool = False,
        consumer_timeout_seconds: int | None = None,
        config: str = "",
        version: str | None = None,
    ) -> None:
        """`tls`: a certificate (also the CA) and its key, for an amqps:// listener beside the plain one;
        `client_ca`: the listener then requires a client certificate signed by it; `management`: the management
        API on a port of its own (`management_url`); `consumer_timeout_seconds`: the delivery-acknowledgement
        timeout (rabbitmq.conf `consumer_timeout`; 30 minutes by default); `config`: more rabbitmq.conf lines;
        `version`: another RabbitMQ version than the run's."""
        self.base = base
        self.version = version or rabbitmq.selected()
        self.tls = tls
        self.tls_port = free_port()
        self.client_ca = client_ca
        self.consumer_timeout_seconds = consumer_timeout_seconds
        self.node = rabbitmq.Node.on_loopback(
            self.version,
            base,
            f"ceo-private-{secrets.token_hex(3)}",
            management_port=free_port() if management else None,
            more_ports=(self.tls_port,) if tls else (),
        )
        self.node.config = self._configure() + config
        self.name = self.node.name
        self.port = self.node.port
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/"
        self.tls_url = f"amqps://guest:guest@127.0.0.1:{self.tls_port}/"
        self.management_port = self.node.management_port
        self.management_url = f"http://127.0.0.1:{self.management_port}" if management else None

    def _configure(self) -> str:
        """The rabbitmq.conf lines of the options (certificates copied into the node's directory)."""
        base = self.base
        base.mkdir(parents=True, exist_ok=True)
        config = ""
        if self.consumer_timeout_seconds is not None:
            config += f"consumer_timeout = {self.consumer_timeout_seconds * 1000}\n"
            # The broker checks the timeout at each channel tick, every minute by default: each second here.
            self.node.advanced = "[{rabbit, [{channel_tick_interval, 1000}]}]."
        if self.tls is not None:
            certificate, key = (pathlib.Path(shutil.copy(path, base / path.name)) for path in self.tls)
            authorities = base / "ca.pem"
            authorities.write_text(certificate.read_text() + (self.client_ca.read_text() if self.client_ca else ""))
            verify = "verify_peer" if self.client_ca else "verify_none"
            inside = self.node.inside
            config += (
                f"listeners.ssl.local = 127.0.0.1:{self.tls_port}\nssl_options.cacertfile = {inside(authorities)}\n"
                f"ssl_options.certfile = {inside(certificate)}\nssl_options.keyfile = {inside(key)}\n"
                f"ssl_options.verify = {verify}\n"
                f"ssl_options.fail_if_no_peer_cert = {'true' if self.client_ca else 'false'}\n"
            )
        return config

    def start(self, timeout: float = 120) -> PrivateRabbit:
        self.node.start(timeout=timeout)
        return self

    def stop(self, timeout: float = 60) -> None:
        self.node.stop(timeout=timeout)

    def server_version(self) -> str:
        """The full version the node reports (e.g. 4.3.6)."""
        return self.node.server_version()

    def set_memory_watermark(self, fraction: float) -> None:
        """`rabbitmqctl set_vm_memory_high_watermark`: a tiny fraction raises the memory alarm (the broker blocks
        publishers), 0.4 (the default) clears it."""
        self.node.ctl("set_vm_memory_high_watermark", str(fraction))

    def wipe(self) -> None:
        """Forget every queue and exchange, as a replaced broker would (only while stopped)."""
        shutil.rmtree(self.base / "mnesia")
