"""RabbitMQ nodes of the versions users run, from Debian's packages, started on this machine without touching its own.

Each version is a root filesystem built once by devcluster/rabbitmq/build.sh (mmdebstrap: bookworm's 3.10, trixie's
4.0, forky's 4.3). A node runs chrooted into it, in PID and mount namespaces of its own: its data, logs and config
live in a host directory bind-mounted at /node, and when the node's first process ends the kernel ends the rest
(epmd included) and drops the mounts — nothing is left behind.

`python -m celery_event_devcluster.rabbitmq run VERSION -- COMMAND...` starts a node of VERSION on the standard ports
(AMQP 5672, management 15672) in a network namespace of its own, joined to this one by a veth pair, runs COMMAND with
`AMQP_URL` pointing at it, then stops it and removes the namespace — also when `run` is told to stop (SIGINT,
SIGTERM, SIGHUP). Killed outright (SIGKILL), it takes the node and COMMAND with it (they die with their parent), and
the next `run` removes the namespace and files it left. The standard ports keep
what the operator derives from an `amqp://` URL (the management API at the same host, port 15672) true, as on a
user's broker. The tests' private nodes (`Node` on loopback, ports of their own) use the same version
(`CEO_RABBITMQ_VERSION`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import ipaddress
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence

HERE = pathlib.Path(__file__).resolve().parent.parent / "rabbitmq"
BUILD_SCRIPT = HERE / "build.sh"
VERSIONS_FILE = HERE / "versions.txt"
VERSION_VARIABLE = "CEO_RABBITMQ_VERSION"
# The network namespaces of `run`, and the addresses of their veth pairs (a /30 each).
NAMESPACE_PREFIX = "ceo-rmq-"
SUBNET = ipaddress.IPv4Network("10.251.0.0/16")
LOCK_FILE = pathlib.Path(tempfile.gettempdir()) / "ceo-rabbitmq-namespaces.lock"
BASE_PREFIX = "ceo-rabbitmq-"  # a run's node directory: ceo-rabbitmq-<pid>-<version>-…
AMQP_PORT = 5672
MANAGEMENT_PORT = 15672
EPMD_PORT = 4369
# RabbitMQ counts each quorum queue's files against its file-handle limit (the open-files limit less ~10 %); its
# production checklist asks for 65,536. A process without CAP_SYS_RESOURCE cannot pass its hard limit: it takes that.
OPEN_FILES = 65536


def versions() -> list[str]:
    """The versions of versions.txt, oldest first."""
    lines = VERSIONS_FILE.read_text().splitlines()
    return [line.split()[0] for line in lines if line.strip() and not line.startswith("#")]


def newest() -> str:
    return versions()[-1]


def selected() -> str:
    """The version of this test run (`CEO_RABBITMQ_VERSION`, set by `run`), else the newest."""
    return os.environ.get(VERSION_VARIABLE) or newest()


def root_filesystem(version: str) -> pathlib.Path:
    """The version's root filesystem, built first if missing (~30 s, needs root)."""
    if version not in versions():
        raise ValueError(f"RabbitMQ {version} is not one of {', '.join(versions())} ({VERSIONS_FILE})")
    done = subprocess.run([str(BUILD_SCRIPT), version], check=True, stdout=subprocess.PIPE, text=True)
    return pathlib.Path(done.stdout.strip().splitlines()[-1])


def accepts(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclasses.dataclass
class Node:
    """One RabbitMQ node of `version`, its files in `base` (made if missing)."""

    version: str
    base: pathlib.Path
    name: str
    port: int
    dist_port: int
    epmd_port: int
    listen: str = "127.0.0.1"  # the address its listeners bind (0.0.0.0 in a namespace of its own)
    address: str = "127.0.0.1"  # where this side reaches it
    management_port: int | None = None
    config: str = ""  # more rabbitmq.conf lines (a file of `base` is at `inside(path)` for the node)
    more_ports: tuple[int, ...] = ()  # listeners of `config` to wait for (e.g. TLS)
    advanced: str = "[]."  # advanced.config
    namespace: str | None = None  # a network namespace to run in (`ip netns exec`)
    _process: subprocess.Popen[bytes] | None = dataclasses.field(default=None, init=False, repr=False)

    @classmethod
    def on_loopback(
        cls,
        version: str,
        base: pathlib.Path,
        name: str,
        *,
        management_port: int | None = None,
        more_ports: tuple[int, ...] = (),
    ) -> Node:
        """A node on 127.0.0.1 with ports of its own, its own epmd included, beside any other (the tests' private
        nodes)."""
        return cls(
            version,
            base,
            name=f"{name}@localhost",
            port=free_port(),
            dist_port=free_port(),
            epmd_port=free_port(),
            management_port=management_port,
            more_ports=more_ports,
        )

    def _prefix(self, root: pathlib.Path) -> list[str]:
        """Runs `$0 "$@"` chrooted in `root`, with the node's environment, in PID and mount namespaces of its own:
        when the first process ends, every other ends with it, and the mounts go."""
        inner = '. /node/env.sh; ulimit -n "$OPEN_FILES" 2>/dev/null || ulimit -n "$(ulimit -Hn)"; exec "$@"'
        script = (
            'mount --bind "$NODE_BASE" "$NODE_ROOT/node" && mount -t proc proc "$NODE_ROOT/proc" && '
            f'exec chroot "$NODE_ROOT" /bin/sh -c \'{inner}\' node "$@"'
        )
        network = ["ip", "netns", "exec", self.namespace] if self.namespace else []
        return [
            *network,
            "unshare", "--fork", "--pid", "--mount", "--propagation", "private", "--kill-child",
            "sh", "-c", script, "node",
        ]  # fmt: skip

    def _environment(self, root: pathlib.Path) -> dict[str, str]:
        return {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "NODE_BASE": str(self.base),
            "NODE_ROOT": str(root),
            "OPEN_FILES": str(OPEN_FILES),
        }

    def _write_files(self) -> None:
        for directory in ("mnesia", "log"):
            (self.base / directory).mkdir(parents=True, exist_ok=True)
        config = f"listeners.tcp.local = {self.listen}:{self.port}\nloopback_users = none\n"
        plugins = []
        if self.management_port is not None:
            config += f"management.tcp.port = {self.management_port}\nmanagement.tcp.ip = {self.listen}\n"
            plugins.append("rabbitmq_management")
        (self.base / "rabbitmq.conf").write_text(config + self.config)
        (self.base / "advanced.config").write_text(self.advanced + "\n")
        (self.base / "enabled_plugins").write_text(f"[{','.join(plugins)}].\n")
        # HOME holds the Erlang cookie the node makes and its command line tools read.
        variables = {
            "HOME": "/node",
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": self.port,
            "RABBITMQ_DIST_PORT": self.dist_port,
            "ERL_EPMD_PORT": self.epmd_port,
            "RABBITMQ_CONFIG_FILE": "/node/rabbitmq.conf",
            "RABBITMQ_ADVANCED_CONFIG_FILE": "/node/advanced.config",
            "RABBITMQ_MNESIA_BASE": "/node/mnesia",
            "RABBITMQ_LOG_BASE": "/node/log",
            "RABBITMQ_ENABLED_PLUGINS_FILE": "/node/enabled_plugins",
            "RABBITMQ_PID_FILE": "/node/node.pid",
            "PATH": "/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        }
        (self.base / "env.sh").write_text("".join(f"export {key}='{value}'\n" for key, value in variables.items()))

    def ports(self) -> list[int]:
        ports = (self.port, self.management_port, *self.more_ports)
        return [port for port in ports if port is not None]

    def inside(self, path: pathlib.Path) -> str:
        """Where the node sees a file of its base directory."""
        return f"/node/{path.relative_to(self.base)}"

    def accepts(self) -> bool:
        return all(accepts(self.address, port) for port in self.ports())

    def start(self, timeout: float = 120) -> Node:
        """Starts the node and waits until every listener accepts; a node that exits first raises with its output."""
        root = root_filesystem(self.version)
        self._write_files()
        output = (self.base / "server.out").open("wb")
        self._process = subprocess.Popen(
            # unshare --kill-child takes the node along when it is killed
            [*dying_with_parent("KILL"), *self._prefix(root), "rabbitmq-server"],
            env=self._environment(root),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while not self.accepts():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (self.base / "server.out").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"RabbitMQ {self.version} ({self.name}) did not start; {self.base}:\n{tail}")
            time.sleep(0.3)
        return self

    def ctl(self, *arguments: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`rabbitmqctl -n NODE ARGUMENTS` of the node's own version."""
        root = root_filesystem(self.version)
        return subprocess.run(
            [*self._prefix(root), "rabbitmqctl", "-q", "-n", self.name, *arguments],
            env=self._environment(root),
            check=check,
            timeout=timeout,
            capture_output=True,
            text=True,
        )

    def server_version(self) -> str:
        """The full version the node reports (e.g. 4.3.6)."""
        return self.ctl("eval", "rabbit_misc:version().").stdout.strip().strip('"')

    def stop(self, timeout: float = 60) -> None:
        """Stops the node (rabbitmqctl stop, then the namespace's end); a node that does not end in time is killed."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(subprocess.SubprocessError):
                self.ctl("stop", check=False, timeout=timeout)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                # unshare --kill-child takes the node's first process, and the kernel the rest of its namespace.
                process.kill()
                process.wait(timeout=timeout)
        self._process = None


@dataclasses.dataclass
class Network:
    """A network namespace joined to this one by a veth pair: this side `.1`, the namespace's `.2` of a /30."""

    name: str
    address: ipaddress.IPv4Address

    @classmethod
    @contextlib.contextmanager
    def created(cls) -> Iterator[Network]:
        _remove_abandoned()
        with _locked():
            taken = _addresses_in_use()
            subnet = next(net for net in SUBNET.subnets(new_prefix=30) if net.network_address + 1 not in taken)
            host_address, address = subnet.network_address + 1, subnet.network_address + 2
            name = f"{NAMESPACE_PREFIX}{os.getpid()}"
            outside, inside = f"ceo{os.getpid()}h"[-15:], f"ceo{os.getpid()}n"[-15:]
            _ip("netns", "add", name)
            try:
                _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
                _ip("link", "set", inside, "netns", name)
                _ip("addr", "add", f"{host_address}/30", "dev", outside)
                _ip("link", "set", outside, "up")
                for command in (
                    ("addr", "add", f"{address}/30", "dev", inside),
                    ("link", "set", inside, "up"),
                    ("link", "set", "lo", "up"),
                ):
                    _ip("-n", name, *command)
            except BaseException:
                _delete_namespace(name)
                raise
        try:
            yield cls(name, address)
        finally:
            _delete_namespace(name)


def _ip(*arguments: str) -> None:
    subprocess.run(["ip", *arguments], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    with LOCK_FILE.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _addresses_in_use() -> set[ipaddress.IPv4Address]:
    listed = subprocess.run(["ip", "-4", "-o", "addr"], check=True, capture_output=True, text=True).stdout
    return {ipaddress.IPv4Interface(line.split()[3]).ip for line in listed.splitlines()}


def _delete_namespace(name: str) -> None:
    """Ends whatever still runs in the namespace and deletes it (its veth pair goes with it)."""
    pids = subprocess.run(["ip", "netns", "pids", name], check=False, capture_output=True, text=True).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    subprocess.run(["ip", "netns", "delete", name], check=False, capture_output=True)


def _remove_abandoned() -> None:
    """What `run`s killed before they could clean up left: their namespaces and node directories (their process is
    gone)."""
    listed = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(NAMESPACE_PREFIX) and _gone(name.removeprefix(NAMESPACE_PREFIX)):
            _delete_namespace(name)
    for base in pathlib.Path(tempfile.gettempdir()).glob(f"{BASE_PREFIX}*"):
        if _gone(base.name.removeprefix(BASE_PREFIX).split("-")[0]):
            shutil.rmtree(base, ignore_errors=True)


def _gone(pid: str) -> bool:
    return pid.isdigit() and not pathlib.Path(f"/proc/{pid}").exists()


def dying_with_parent(signal_name: str) -> list[str]:
    """A command's prefix: the kernel sends it the signal when the process that started it dies (PR_SET_PDEATHSIG,
    kept across exec), so that a killed `run` or test process leaves no node or command running."""
    return ["setpriv", f"--pdeathsig={signal_name}", "--"]


@contextlib.contextmanager
def isolated_node(version: str) -> Iterator[tuple[Node, Network]]:
    """A node of `version` on the standard ports, alone in a network namespace."""
    with (
        Network.created() as network,
        tempfile.TemporaryDirectory(prefix=f"{BASE_PREFIX}{os.getpid()}-{version}-") as base,
    ):
        node = Node(
            version,
            pathlib.Path(base),
            name="rabbit@localhost",
            port=AMQP_PORT,
            dist_port=25672,
            epmd_port=EPMD_PORT,
            listen="0.0.0.0",
            address=str(network.address),
            management_port=MANAGEMENT_PORT,
            namespace=network.name,
        )
        try:
            node.start()
            yield node, network
        finally:
            node.stop()


class Stopped(Exception):
    """`run` was told to stop (SIGTERM, SIGHUP) before its command started."""


def run(version: str, command: Sequence[str]) -> int:
    """Runs `command` with a node of `version` at AMQP_URL; returns its exit code. Told to stop, it stops the
    command first (passing the signal on), then the node and the namespace."""
    child: subprocess.Popen[bytes] | None = None

    def stop(received: int, _frame: object) -> None:
        if child is None:
            raise Stopped(signal.Signals(received).name)
        child.send_signal(received)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)
    try:
        with isolated_node(version) as (node, network):
            url = f"amqp://guest:guest@{network.address}:{AMQP_PORT}/"
            print(f"==> RabbitMQ {node.server_version()} at {url} (management http://{network.address}:{MANAGEMENT_PORT})",
                  file=sys.stderr, flush=True)  # fmt: skip
            environment = {**os.environ, "AMQP_URL": url, VERSION_VARIABLE: version}
            environment.pop("RABBITMQ_MANAGEMENT_URL", None)
            child = subprocess.Popen([*dying_with_parent("TERM"), *command], env=environment)
            return child.wait()
    except (Stopped, KeyboardInterrupt) as exc:
        print(f"==> stopped ({exc or 'SIGINT'}) before the command started", file=sys.stderr, flush=True)
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m celery_event_devcluster.rabbitmq", description=__doc__)
    commands = parser.add_subparsers(dest="action", required=True)
    running = commands.add_parser("run", help="run a command with a node of VERSION at AMQP_URL")
    running.add_argument("version", choices=versions())
    running.add_argument("command", nargs=argparse.REMAINDER)
    building = commands.add_parser("build", help="build the root filesystems of these versions (all by default)")
    building.add_argument("version", nargs="*")
    args = parser.parse_args(argv)
    if args.action == "build":
        for version in args.version or versions():
            print(root_filesystem(version))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("run: a command is needed")
    return run(args.version, command)


if __name__ == "__main__":
    sys.exit(main())
