"""A RabbitMQ node of a test's own, for tests that stop or restart a broker.

It has its own node name, ports, config, data and log directories, so stopping it never touches the
shared broker other tests and CI use. Debian's wrapper runs the server as the `rabbitmq` user, so
the directories belong to that user. The machine's rabbitmq.conf names the shared node's listener,
so the node gets a config file of its own.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import secrets
import shutil
import subprocess

from tests.support import waiting
from tests.support.operator_process import accepts, free_port


class PrivateRabbit:
    def __init__(
        self,
        base: pathlib.Path,
        tls: tuple[pathlib.Path, pathlib.Path] | None = None,
        client_ca: pathlib.Path | None = None,
        management: bool = False,
        consumer_timeout_seconds: int | None = None,
        extra_config: str = "",
    ) -> None:
        """`tls`: a certificate (also the CA) and its key, for an amqps:// listener beside the plain one;
        `client_ca`: the listener then requires a client certificate signed by it; `management`: the management
        API on a port of its own (`management_url`); `consumer_timeout_seconds`: the delivery-acknowledgement
        timeout (rabbitmq.conf `consumer_timeout`; 30 minutes by default); `extra_config`: more rabbitmq.conf lines."""
        self.base = base
        self.consumer_timeout_seconds = consumer_timeout_seconds
        self.extra_config = extra_config
        self.client_ca = client_ca
        self.name = f"ceo-private-{secrets.token_hex(3)}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/"
        self.tls = tls
        self.tls_port = free_port()
        self.tls_url = f"amqps://guest:guest@127.0.0.1:{self.tls_port}/"
        self.management_port = free_port() if management else None
        self.management_url = f"http://127.0.0.1:{self.management_port}" if management else None

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": str(self.base / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.base / "advanced.config"),
            "RABBITMQ_MNESIA_BASE": str(self.base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.base / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.base / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.base / "node.pid"),
        }

    def _prepare(self) -> None:
        for directory in ("mnesia", "log"):
            (self.base / directory).mkdir(parents=True, exist_ok=True)
        config = f"listeners.tcp.local = 127.0.0.1:{self.port}\nloopback_users = none\n"
        advanced = "[]."
        if self.consumer_timeout_seconds is not None:
            config += f"consumer_timeout = {self.consumer_timeout_seconds * 1000}\n"
            # The broker checks the timeout at each channel tick, every minute by default: each second here.
            advanced = "[{rabbit, [{channel_tick_interval, 1000}]}]."
        (self.base / "advanced.config").write_text(advanced + "\n")
        if self.tls is not None:
            certificate, key = (shutil.copy(path, self.base / path.name) for path in self.tls)
            authorities = self.base / "ca.pem"
            authorities.write_text(
                pathlib.Path(certificate).read_text() + (self.client_ca.read_text() if self.client_ca else "")
            )
            verify = "verify_peer" if self.client_ca else "verify_none"
            config += (
                f"listeners.ssl.local = 127.0.0.1:{self.tls_port}\nssl_options.cacertfile = {authorities}\n"
                f"ssl_options.certfile = {certificate}\nssl_options.keyfile = {key}\n"
                f"ssl_options.verify = {verify}\n"
                f"ssl_options.fail_if_no_peer_cert = {'true' if self.client_ca else 'false'}\n"
            )
        plugins = "[]"
        if self.management_port is not None:
            config += f"management.tcp.port = {self.management_port}\nmanagement.tcp.ip = 127.0.0.1\n"
            plugins = "[rabbitmq_management]"
        (self.base / "rabbitmq.conf").write_text(config + self.extra_config)
        (self.base / "enabled_plugins").write_text(f"{plugins}.\n")
        shutil.chown(self.base, "rabbitmq", "rabbitmq")
        for path in self.base.rglob("*"):
            shutil.chown(path, "rabbitmq", "rabbitmq")

    def _accepts(self) -> bool:
        """Whether every listener accepts: the TLS one opens after the plain one (ssl started, certificates read)."""
        ports = (self.port,) if self.tls is None else (self.port, self.tls_port)
        if self.management_port is not None:
            ports += (self.management_port,)
        return all(accepts(port) for port in ports)

    def start(self, timeout: float = 90) -> PrivateRabbit:
        if shutil.which("rabbitmq-server") is None:
            raise RuntimeError("rabbitmq-server is not installed (./dev setup installs it)")
        self._prepare()
        subprocess.run(["rabbitmq-server", "-detached"], env=self._env(), check=True, timeout=60, capture_output=True)
        waiting.eventually(
            self._accepts,
            timeout=timeout,
            interval=0.5,
            message=f"the private RabbitMQ node did not start; see {self.base / 'log'}",
        )
        return self

    def stop(self, timeout: float = 60) -> None:
        vm = self._vm_pid()
        subprocess.run(
            ["rabbitmqctl", "-n", self.name, "stop"], env=self._env(), check=False, timeout=timeout, capture_output=True
        )
        # rabbitmqctl returns, and the listener closes, before the VM has exited: a start of the same node name or
        # a wipe right after would race the exiting VM. Best effort: a VM that lingers past the deadline is left.
        with contextlib.suppress(AssertionError):
            waiting.eventually(
                lambda: not self._accepts() and (vm is None or not _alive(vm)), timeout=timeout, interval=0.2
            )

    def set_memory_watermark(self, fraction: float) -> None:
        """`rabbitmqctl set_vm_memory_high_watermark`: a tiny fraction raises the memory alarm (the broker blocks
        publishers), 0.4 (the default) clears it."""
        subprocess.run(
            ["rabbitmqctl", "-n", self.name, "set_vm_memory_high_watermark", str(fraction)],
            env=self._env(),
            check=True,
            timeout=60,
            capture_output=True,
        )

    def _vm_pid(self) -> int | None:
        try:
            return int((self.base / "node.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def wipe(self) -> None:
        """Forget every queue and exchange, as a replaced broker would (only while stopped)."""
        shutil.rmtree(self.base / "mnesia")


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie left for an init that does not reap counts as gone)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
