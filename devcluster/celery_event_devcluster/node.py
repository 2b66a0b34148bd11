"""A real node for the control plane (controlplane.py): the kubelet and kube-proxy built from the same Go module
(devcluster/controlplane/build.sh node), Debian's containerd and runc as the container runtime, the CNI plugins'
`ptp` (a veth per pod, routed) for the pods' network, and the images built by devcluster/images/build.sh imported
into containerd (no registry: the chart's pods run them with `imagePullPolicy: Never`).

Everything of a node lives in a network namespace and a mount and PID namespace of its own, so that stopping it
leaves nothing behind: its processes (the kubelet, kube-proxy, containerd, the shims, every container) end with the
namespace's first process, its mounts (overlays, Secret volumes, the pods' network namespaces) with the mount
namespace, and its network (pods' veths, kube-proxy's and the CNI plugins' iptables rules, its routes) with the
network namespace. What is global and cleaned up by hand: the kubelet's cgroups (one root per node, removed), the
veth pair to this namespace and the routes through it (gone with the namespace), and the node's directory.

The node's namespace is joined to this one by a veth pair (this side `10.252.N.1`, the node `10.252.N.2`); the API
server listens at `10.252.N.1` (ControlPlane(address=...)); the pods' addresses (`10.244.N.0/24`) and the
Services' (`10.97.N.0/24`) are routed to the node, so the API server reaches a webhook through its Service (kube-proxy
on the node translates the ClusterIP) as on any cluster. No DNS: clients are given the Services' ClusterIPs.

What is set for this machine (measured): it mounts cgroup v1, so the kubelet runs with `failCgroupV1: false`;
processes here lack CAP_SYS_RESOURCE, so containerd restricts `oom_score_adj` (else runc fails "can't get final
child's PID from pipe"); the kubelet sets six kernel settings machine-wide (vm.overcommit_memory, kernel.panic...),
which the node's mount namespace shadows with the values it wants, so the machine's stay as they are.

`python -m celery_event_devcluster.node up DIR` starts a control plane and a node (`./dev cluster up --node`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator

import yaml

from celery_event_devcluster import images
from celery_event_devcluster.controlplane import KUBEADM_CONTROLLERS, ControlPlane, write_kubeconfig

BUILD_SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "controlplane" / "build.sh"
NAMESPACE_PREFIX = "ceo-node-"
NODE_STATE = "node-cluster.json"  # beside the control plane's directory (`up`)
LOCK_FILE = pathlib.Path(tempfile.gettempdir()) / "ceo-node-networks.lock"
CGROUPS = pathlib.Path("/sys/fs/cgroup")
CNI_PLUGINS = pathlib.Path("/usr/lib/cni")
# Debian's packages of the runtime, the CNI plugins and what kube-proxy and the plugins call.
PACKAGES = {
    "containerd": "containerd",
    "runc": "runc",
    "ctr": "containerd",
    "iptables": "iptables",
    "conntrack": "conntrack",
    str(CNI_PLUGINS / "ptp"): "containernetworking-plugins",
}
# The kernel settings the kubelet would set machine-wide (pkg/kubelet/cm/container_manager_linux.go), as it wants
# them: each shadowed in the node's mount namespace by a file of that value, so it finds them set and writes none.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}


def build() -> pathlib.Path:
    """The directory of kubelet and kube-proxy (and the control plane's binaries), built first when missing."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "node"], check=True, stdout=subprocess.PIPE, text=True)
    return pathlib.Path(done.stdout.strip().splitlines()[-1])


def install_packages() -> None:
    """Debian's containerd, runc, CNI plugins, iptables and conntrack, when missing (root: apt)."""
    missing = sorted({package for tool, package in PACKAGES.items() if not shutil.which(tool)})
    if missing:
        environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=environment)
        install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
        subprocess.run(install, check=True, env=environment, stdout=subprocess.DEVNULL)


@dataclasses.dataclass(frozen=True)
class Addresses:
    """A node's addresses, all derived from its index (0-255): a /30 to this namespace, its pods' and Services'."""

    index: int

    @property
    def host(self) -> str:
        return f"10.252.{self.index}.1"

    @property
    def node(self) -> str:
        return f"10.252.{self.index}.2"

    @property
    def pods(self) -> str:
        return f"10.244.{self.index}.0/24"

    @property
    def services(self) -> str:
        return f"10.97.{self.index}.0/24"

    @property
    def namespace(self) -> str:
        return f"{NAMESPACE_PREFIX}{self.index}"


def _ip(*arguments: str) -> None:
    subprocess.run(["ip", *arguments], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    with LOCK_FILE.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class Network:
    """The node's network namespace, joined to this one by a veth pair, with routes to its pods and Services. Its
    owner's PID (and its control plane's processes) are written in a claim file, so that what a run killed before
    its end left (namespace, cgroups, the control plane, which runs outside the namespace) is removed by the next."""

    CLAIMS = pathlib.Path(tempfile.gettempdir()) / "ceo-node-networks"

    def __init__(self, addresses: Addresses) -> None:
        self.addresses = addresses
        self.outside = f"ceon{addresses.index}h"

    @classmethod
    def create(cls) -> Network:
        cls.CLAIMS.mkdir(exist_ok=True)
        with _locked():
            cls._remove_abandoned()
            listed = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True)
            existing = set(listed.stdout.split())
            index = next(
                i for i in range(256) if f"{NAMESPACE_PREFIX}{i}" not in existing and not (cls.CLAIMS / str(i)).exists()
            )
            network = cls(Addresses(index))
            network.claim(os.getpid())
            try:
                network._create()
            except BaseException:
                network.delete()
                raise
        return network

    def _create(self) -> None:
        a = self.addresses
        inside = f"ceon{a.index}n"
        _ip("netns", "add", a.namespace)
        _ip("link", "add", self.outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", a.namespace)
        _ip("addr", "add", f"{a.host}/30", "dev", self.outside)
        _ip("link", "set", self.outside, "up")
        for command in (
            ("addr", "add", f"{a.node}/30", "dev", inside),
            ("link", "set", inside, "up"),
            ("link", "set", "lo", "up"),
            ("route", "add", "default", "via", a.host),
        ):
            _ip("-n", a.namespace, *command)
        # The node forwards between its pods, this side and its Services (a setting of its own namespace).
        subprocess.run(["ip", "netns", "exec", a.namespace, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"], check=True)
        # Routes through the veth: they go with it.
        for destination in (a.pods, a.services):
            _ip("route", "add", destination, "via", a.node, "dev", self.outside)

    def claim(self, owner: int, plane: ControlPlane | None = None) -> None:
        """Who owns the namespace (a process whose end means the namespace is abandoned), and its control plane's
        processes and etcd data outside it (ended and removed with it then)."""
        record = {"owner": owner, "processes": plane.pids if plane else {}, "files": [plane.etcd_data] if plane else []}
        (self.CLAIMS / str(self.addresses.index)).write_text(json.dumps(record))

    def delete(self) -> None:
        """Ends whatever still runs in the namespace and deletes it (the veth pair and its routes go with it)."""
        name = self.addresses.namespace
        listed = subprocess.run(["ip", "netns", "pids", name], check=False, capture_output=True, text=True)
        for pid in listed.stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "delete", name], check=False, capture_output=True)
        subprocess.run(["ip", "link", "delete", self.outside], check=False, capture_output=True)
        (self.CLAIMS / str(self.addresses.index)).unlink(missing_ok=True)

    @classmethod
    def _remove_abandoned(cls) -> None:
        for claim in cls.CLAIMS.iterdir():
            try:
                record = json.loads(claim.read_text())
            except ValueError:
                continue
            if isinstance(record, int):  # a claim of an earlier version: its owner only
                record = {"owner": record, "processes": {}, "files": []}
            if claim.name.isdigit() and not _running(record["owner"]):
                for binary, pid in record["processes"].items():
                    with contextlib.suppress(OSError):  # the same process still: its PID was not reused
                        if binary in pathlib.Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                            os.kill(pid, signal.SIGKILL)
                for path in record["files"]:
                    shutil.rmtree(path, ignore_errors=True)
                cls(Addresses(int(claim.name))).delete()
                remove_cgroups(f"/{NAMESPACE_PREFIX}{claim.name}")
                shutil.rmtree(
                    pathlib.Path(tempfile.gettempdir()) / f"{NAMESPACE_PREFIX}{claim.name}", ignore_errors=True
                )


def cgroup_hierarchies() -> list[pathlib.Path]:
    """The mounted cgroup v1 hierarchies the kubelet uses (cgroup v2 has one: the root itself)."""
    if (CGROUPS / "cgroup.controllers").exists():
        return [CGROUPS]
    # The v1 controllers' hierarchies and, on a hybrid machine, the unified one (runc makes a container's there too).
    return sorted(p for p in CGROUPS.iterdir() if p.is_dir() and not p.is_symlink() and (p / "cgroup.procs").exists())


def create_cgroups(root: str) -> None:
    """The kubelet's cgroup root in every hierarchy (it must exist); cpuset's needs its CPUs and memory nodes."""
    for hierarchy in cgroup_hierarchies():
        if hierarchy.name == "unified":
            continue  # not the kubelet's (its controllers are the v1 ones)
        directory = hierarchy / root.lstrip("/")
        directory.mkdir(exist_ok=True)
        for setting in ("cpuset.cpus", "cpuset.mems"):
            if (directory / setting).exists() and not (directory / setting).read_text().strip():
                (directory / setting).write_text((hierarchy / setting).read_text())


def remove_cgroups(root: str, timeout: float = 30) -> None:
    """The node's cgroups, deepest first, once their processes have ended (a cgroup with tasks cannot go)."""
    deadline = time.monotonic() + timeout
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / root.lstrip("/")
        if not top.exists():
            continue
        directories = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for directory in [*directories, top]:
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)


# Run by the node's first process, in its network, mount and PID namespaces: private mounts over what the kubelet,
# containerd and the CNI plugins would write outside the node's directory, the kernel settings shadowed, then the
# runtime, the kubelet and kube-proxy. Its end ends every process of the namespace.
SUPERVISOR = r"""
set -eu
# sysfs as the node's network namespace shows it (its interfaces), the machine's cgroup hierarchies kept under it.
mkdir -p "$NODE_DIR/cgroup"
mount --rbind /sys/fs/cgroup "$NODE_DIR/cgroup"
mount -t sysfs sysfs /sys
mount --move "$NODE_DIR/cgroup" /sys/fs/cgroup
for directory in /run /var/lib /var/log; do mount -t tmpfs -o mode=0755 tmpfs "$directory"; done
mkdir -p /run/netns /var/log/pods /var/log/containers
for setting in "$NODE_DIR"/sysctl/*; do
    mount --bind "$setting" "/proc/sys/$(basename "$setting" | tr . /)"
done
"$NODE_BIN/containerd-run" &
while [ ! -S "$NODE_SOCKET" ]; do sleep 0.1; done
touch "$NODE_DIR/runtime-ready"
while [ ! -e "$NODE_DIR/images-imported" ]; do sleep 0.1; done
"$NODE_BIN/kubelet-run" &
"$NODE_BIN/kube-proxy-run" &
wait
"""


class Node:
    """One node of `plane`, named `name`, its files in `directory`, on `network`."""

    def __init__(self, plane: ControlPlane, network: Network, directory: pathlib.Path, name: str = "") -> None:
        self.plane = plane
        self.network = network
        self.addresses = network.addresses
        self.directory = directory
        self.name = name or self.addresses.namespace
        self.cgroup_root = f"/{self.addresses.namespace}"
        # A unix socket's path has at most 107 bytes, and the node's directory may be deep (pytest's tmp_path):
        # containerd's sockets and the kubelet's root (its pod-resources, device-plugin... sockets) live in a short
        # directory of the node's own, removed at its stop.
        self.sockets = pathlib.Path(tempfile.gettempdir()) / self.addresses.namespace
        self.socket = self.sockets / "containerd.sock"
        self.process: subprocess.Popen[bytes] | None = None
        self.images: dict[str, images.Image] = {}

    # -- configuration ----------------------------------------------------------------------------------------

    def _write_files(self, binaries: pathlib.Path, pause: str) -> None:
        d, a = self.directory, self.addresses
        for sub in ("containerd", "cni", "cni-ipam", "kubelet", "pod-logs", "sysctl", "bin"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        for key, value in KUBELET_SYSCTLS.items():
            (d / "sysctl" / key.replace("/", ".")).write_text(value + "\n")
        pki = self.plane.pki
        assert pki is not None, "the control plane was not started here"
        ca = pki.ca_path
        kubelet_credentials = pki.issue(f"kubelet-{self.name}", f"system:node:{self.name}", "system:nodes")
        serving = pki.issue(f"kubelet-serving-{self.name}", f"system:node:{self.name}", hosts=[a.node, self.name])
        write_kubeconfig(d / "kubelet.kubeconfig", self.plane.url, ca, certificate=kubelet_credentials)
        proxy_credentials = pki.issue(f"kube-proxy-{self.name}", "system:kube-proxy")
        write_kubeconfig(d / "kube-proxy.kubeconfig", self.plane.url, ca, certificate=proxy_credentials)
        (d / "resolv.conf").write_text("# no DNS on this node: pods are given the Services' ClusterIPs\n")
        (d / "containerd" / "config.toml").write_text(
            CONTAINERD_CONFIG.format(directory=d / "containerd", socket=self.socket, pause=pause, cni=d / "cni")
        )
        cni = {
            "cniVersion": "1.0.0",
            "name": "ceo-node",
            "plugins": [
                {
                    "type": "ptp",
                    "ipMasq": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": a.pods}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(d / "cni-ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (d / "cni" / "10-ceo-node.conflist").write_text(json.dumps(cni, indent=2))
        kubelet = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": a.node,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(ca)},
            },
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(serving[0]),
            "tlsPrivateKeyFile": str(serving[1]),
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "failCgroupV1": False,  # this machine mounts cgroup v1 (a deprecation warning)
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "resolvConf": str(d / "resolv.conf"),
            "podLogsDir": str(d / "pod-logs"),
            "clusterDomain": "cluster.local",
            # The images are imported, not pulled: never collected, and no eviction for a disk others fill.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "serializeImagePulls": False,
            "shutdownGracePeriod": "0s",
        }
        (d / "kubelet.yaml").write_text(yaml.safe_dump(kubelet))
        proxy = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(d / "kube-proxy.kubeconfig")},
            "hostnameOverride": self.name,
            "bindAddress": a.node,
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            "mode": "iptables",
            "clusterCIDR": a.pods,
            # The connection-tracking table's size is the machine's: left as it is.
            "conntrack": {"maxPerCore": 0, "min": 0},
        }
        (d / "kube-proxy.yaml").write_text(yaml.safe_dump(proxy))
        commands = {
            "containerd-run": f'exec containerd --config "{d}/containerd/config.toml" >"{d}/containerd.log" 2>&1',
            "kubelet-run": (
                f'exec "{binaries}/kubelet" --config="{d}/kubelet.yaml" --kubeconfig="{d}/kubelet.kubeconfig"'
                f' --root-dir="{self.sockets}/kubelet" --hostname-override={self.name} --node-ip={a.node}'
                f' >"{d}/kubelet.log" 2>&1'
            ),
            "kube-proxy-run": (
                f'exec "{binaries}/kube-proxy" --config="{d}/kube-proxy.yaml" >"{d}/kube-proxy.log" 2>&1'
            ),
        }
        for name, command in commands.items():
            script = d / "bin" / name
            script.write_text(f"#!/bin/sh\n{command}\n")
            script.chmod(0o755)

    # -- starting ---------------------------------------------------------------------------------------------

    def start(self, image_names: tuple[str, ...] = ("operator", "worker"), timeout: float = 180) -> Node:
        """Starts the node, imports the images, and waits until it is Ready and untainted."""
        install_packages()
        binaries = build()
        built = images.build()
        self.images = {name: built[name] for name in ("pause", *image_names)}
        self.directory.mkdir(parents=True, exist_ok=True)
        self._write_files(binaries, self.images["pause"].reference)
        create_cgroups(self.cgroup_root)
        shutil.rmtree(self.sockets, ignore_errors=True)  # a killed run's
        self.sockets.mkdir(mode=0o700)
        log = (self.directory / "node.log").open("ab")
        environment = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
        environment |= {"NODE_DIR": str(self.directory), "NODE_BIN": str(self.directory / "bin")}
        environment |= {"NODE_SOCKET": str(self.socket)}
        self.process = subprocess.Popen(
            [
                *("nsenter", f"--net=/run/netns/{self.addresses.namespace}"),
                *("unshare", "--fork", "--pid", "--mount", "--propagation", "private", "--mount-proc"),
                *("--kill-child", "sh", "-c", SUPERVISOR),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environment,
            start_new_session=True,
        )
        try:
            self._wait((self.directory / "runtime-ready").exists, 60, "containerd")
            for image in self.images.values():
                self.ctr("images", "import", str(image.archive))
            (self.directory / "images-imported").touch()
            self._wait(self._ready, timeout, "the node Ready and untainted")
        except BaseException:
            self.stop()
            raise
        return self

    def load(self, image: images.Image) -> None:
        """Imports one more image into the node's containerd (pods then run it with `imagePullPolicy: Never`)."""
        self.ctr("images", "import", str(image.archive))
        self.images[image.name] = image

    def ctr(self, *arguments: str) -> str:
        """containerd's own client, in the namespace the kubelet's images are in."""
        command = ["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *arguments]
        return subprocess.run(command, check=True, capture_output=True, text=True, timeout=300).stdout

    def _ready(self) -> bool:
        try:
            node = json.loads(self.plane.get(f"/api/v1/nodes/{self.name}"))
        except OSError:
            return False
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
        return ready and not node["spec"].get("taints")

    def _wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the node ended before {what}:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {timeout:.0f} s:\n{self.logs()}")
            time.sleep(0.3)

    def logs(self, characters: int = 3000) -> str:
        parts = []
        for name in ("node", "containerd", "kubelet", "kube-proxy"):
            path = self.directory / f"{name}.log"
            if path.exists():
                parts.append(f"--- {name}.log ---\n{path.read_text(errors='replace')[-characters:]}")
        return "\n".join(parts)

    # -- stopping ---------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ends every process of the node (the PID namespace's first one takes the rest), then removes its cgroups;
        the network namespace and the directory are the owner's (`NodeCluster`)."""
        process, self.process = self.process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=60)
        remove_cgroups(self.cgroup_root)
        shutil.rmtree(self.sockets, ignore_errors=True)


CONTAINERD_CONFIG = """\
version = 2
root = "{directory}/root"
state = "{directory}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{directory}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # Processes here lack CAP_SYS_RESOURCE: an oom_score_adj below containerd's own cannot be set.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{directory}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"""


class NodeCluster:
    """A control plane whose API server listens on a node's network, and that node: what `./dev cluster up --node`
    and the tests' `node_cluster` start. `stop()` leaves no process, mount, namespace, route or cgroup."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.directory = directory
        self.network: Network | None = None
        self.plane: ControlPlane | None = None
        self.node: Node | None = None

    def start(self, image_names: tuple[str, ...] = ("operator", "worker")) -> NodeCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            build()  # before the API server starts: a cold build is minutes, its first node lease seconds
            images.build()
            self.network = Network.create()
            a = self.network.addresses
            self.plane = ControlPlane(
                self.directory / "controlplane",
                address=a.host,
                service_cidr=a.services,
                controllers=KUBEADM_CONTROLLERS,
            ).start()
            self.network.claim(os.getpid(), self.plane)
            self.node = Node(self.plane, self.network, self.directory / "node").start(image_names)
            (self.directory / NODE_STATE).write_text(
                json.dumps({"pid": os.getpid(), "index": a.index, "kubeconfig": str(self.plane.kubeconfig)})
            )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.node is not None:
            self.node.stop()
        if self.plane is not None:
            self.plane.stop()
        if self.network is not None:
            self.network.delete()
        self.node = self.plane = self.network = None

    # -- `up` and `down` from separate commands ---------------------------------------------------------------

    def keep_running(self) -> None:
        """Hands the network's claim to the node's own process, for a node that outlives this one (`up`)."""
        assert self.network is not None
        assert self.node is not None
        assert self.node.process is not None
        assert self.plane is not None
        self.network.claim(self.node.process.pid, self.plane)
        state = json.loads((self.directory / NODE_STATE).read_text())
        (self.directory / NODE_STATE).write_text(json.dumps({**state, "node_pid": self.node.process.pid}))

    @staticmethod
    def stop_started_in(directory: pathlib.Path) -> None:
        """Stops the node cluster that `up` started in `directory`."""
        with contextlib.suppress(FileNotFoundError):
            state = json.loads((directory / NODE_STATE).read_text())
            with contextlib.suppress(ProcessLookupError, KeyError):
                os.killpg(state["node_pid"], signal.SIGKILL)
            addresses = Addresses(state["index"])
            deadline = time.monotonic() + 30
            while _running(state.get("node_pid", 0)) and time.monotonic() < deadline:
                time.sleep(0.1)
            remove_cgroups(f"/{addresses.namespace}")
            shutil.rmtree(pathlib.Path(tempfile.gettempdir()) / addresses.namespace, ignore_errors=True)
            ControlPlane.of(directory / "controlplane").stop()
            Network(addresses).delete()


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended and not yet reaped by a parent that is not this process, does not)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def main(argv: list[str] | None = None) -> int:
    import argparse  # noqa: PLC0415 — only the command line needs it
    import sys  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m celery_event_devcluster.node", description=__doc__)
    parser.add_argument("action", choices=["up", "down", "build"])
    parser.add_argument("directory", type=pathlib.Path, nargs="?", default=pathlib.Path(".dev/cluster"))
    args = parser.parse_args(argv)
    directory: pathlib.Path = args.directory.resolve()
    if args.action == "build":
        print(build())
    elif args.action == "up":
        if (directory / NODE_STATE).exists() or (directory / "state.json").exists():
            print(f"error: a cluster runs from {directory}; `down` it first", file=sys.stderr)
            return 1
        started = time.monotonic()
        cluster = NodeCluster(directory).start()
        cluster.keep_running()
        assert cluster.plane is not None
        assert cluster.node is not None
        print(
            f"control plane at {cluster.plane.url} and node {cluster.node.name} Ready in "
            f"{time.monotonic() - started:.0f} s; images: "
            + ", ".join(image.reference for image in cluster.node.images.values()),
            file=sys.stderr,
        )
        print(cluster.plane.kubeconfig)
    else:
        NodeCluster.stop_started_in(directory)
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
