"""A real Kubernetes control plane on this machine: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, built from Go modules by devcluster/controlplane/build.sh (no kubelet: tests stand one in).

`python -m celery_event_devcluster.controlplane up DIR` starts one whose files live in DIR and prints its admin
KUBECONFIG on the last line; `down DIR` stops it and removes DIR. The tests start one per pytest process with
`ControlPlane(...).start()`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import ipaddress
import json
import os
import pathlib
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

BUILD_SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "controlplane" / "build.sh"

# What the API server admits with, beyond its defaults (which include the webhooks, ServiceAccount, LimitRanger,
# ResourceQuota, Priority, DefaultTolerationSeconds...): what production clusters add.
ADMISSION_PLUGINS = "NodeRestriction,OwnerReferencesPermissionEnforcement"
# The controllers whose behaviour the operator relies on: the garbage collector (owned ConfigMaps), Deployments
# and ReplicaSets (rollouts, scale-down by deletion cost), StatefulSets, PodDisruptionBudgets (evictions), and the
# service accounts and their tokens (pods and the operator's identity), the namespace controller (cleanup), and
# the aggregation of ClusterRoles (the chart's rules for users, aggregated into `edit` and `view`).
CONTROLLERS = ",".join(
    f"{name}-controller"
    for name in (
        "garbage-collector",
        "deployment",
        "replicaset",
        "statefulset",
        "disruption",
        "serviceaccount",
        "serviceaccount-token",
        "namespace",
        "root-ca-certificate-publisher",
        "clusterrole-aggregation",
    )
)
# What a kubeadm cluster runs (its default): every controller on by default, the bootstrap tokens' two added. A cluster
# with a real node (node.py) needs them all: node lifecycle (lifts the not-ready taint), EndpointSlices (kube-proxy's
# Services), pod GC, TTL... The process kubelet's node sends no heartbeats, so its clusters keep to CONTROLLERS.
KUBEADM_CONTROLLERS = "*,bootstrap-signer-controller,token-cleaner-controller"
SERVICE_CIDR = "10.96.0.0/24"
# Every request's user, verb, resource and answer code (not the bodies: secrets stay out), one JSON line each in
# audit.log: what the tests read to prove an identity was never refused.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}
STATE_FILE = "state.json"


# How many times a start picks its ports again after a component found one taken.
PORT_ATTEMPTS = 3


class PortTakenError(RuntimeError):
    """A component exited because a port picked for it was bound by another process meanwhile."""


def free_port() -> int:
    # Below the kernel's ephemeral range: a port it hands out may be taken by an outgoing connection meanwhile.
    for port in random.sample(range(20000, 32000), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


def build() -> pathlib.Path:
    """The directory of the binaries, building them first when the cache has none of this go.mod/go.sum."""
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    return pathlib.Path(result.stdout.strip().splitlines()[-1])


class _Pki:
    """The cluster's CA and what it signs: the API server's serving certificate and each component's client
    certificate (its user name and groups are the certificate's CN and O, as kubeadm issues them)."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        self.ca = self._sign(
            self._builder("kubernetes-ca").add_extension(
                x509.BasicConstraints(ca=True, path_length=None), critical=True
            ),
            self.ca_key.public_key(),
        )
        self.ca_path = self._write_certificate("ca", self.ca)

    def _builder(self, common_name: str, organization: str | None = None) -> x509.CertificateBuilder:
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        now = datetime.datetime.now(tz=datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=30))
        )

    def _sign(self, builder: x509.CertificateBuilder, public_key: ec.EllipticCurvePublicKey) -> x509.Certificate:
        issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes-ca")])
        return builder.issuer_name(issuer).public_key(public_key).sign(self.ca_key, hashes.SHA256())

    def _write_certificate(self, stem: str, certificate: x509.Certificate) -> pathlib.Path:
        path = self.directory / f"{stem}.pem"
        path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        return path

    def _write_key(self, stem: str, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> pathlib.Path:
        path = self.directory / f"{stem}-key.pem"
        path.touch(mode=0o600)
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return path

    def issue(
        self, stem: str, common_name: str, organization: str | None = None, hosts: list[str] | None = None
    ) -> tuple[pathlib.Path, pathlib.Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = self._builder(common_name, organization).add_extension(
            x509.BasicConstraints(ca=False, path_length=None), critical=True
        )
        if hosts is None:
            builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        else:
            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False).add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
            )
        return self._write_certificate(stem, self._sign(builder, key.public_key())), self._write_key(stem, key)

    def service_account_keys(self) -> tuple[pathlib.Path, pathlib.Path]:
        """The key pair that signs service-account tokens (private) and verifies them (public)."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = self.directory / "service-account.pub"
        public.write_bytes(
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        return self._write_key("service-account", key), public


def write_kubeconfig(
    path: pathlib.Path,
    server: str,
    ca: pathlib.Path,
    *,
    certificate: tuple[pathlib.Path, pathlib.Path] | None = None,
    token: str | None = None,
    namespace: str = "default",
) -> pathlib.Path:
    """A kubeconfig for the API server at `server`, as a client certificate's user or a bearer token's."""
    user: dict[str, str] = {}
    if certificate is not None:
        user = {"client-certificate": str(certificate[0]), "client-key": str(certificate[1])}
    if token is not None:
        user = {"token": token}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "controlplane",
                "cluster": {"server": server, "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()},
            }
        ],
        "users": [{"name": "user", "user": user}],
        "contexts": [
            {"name": "controlplane", "context": {"cluster": "controlplane", "user": "user", "namespace": namespace}}
        ],
        "current-context": "controlplane",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class ControlPlane:
    """One control plane whose files (certificates, kubeconfigs, logs) live in `directory`; etcd's data in a
    directory of its own on tmpfs where there is one (a database that is thrown away needs no disk)."""

    def __init__(
        self,
        directory: pathlib.Path,
        binaries: pathlib.Path | None = None,
        *,
        address: str = "127.0.0.1",
        service_cidr: str = SERVICE_CIDR,
        controllers: str = CONTROLLERS,
    ) -> None:
        """`address`: where the API server listens and what it advertises (a node's pods reach it there, through
        the `kubernetes` Service; on loopback the Service has no endpoints)."""
        self.directory = directory
        self.binaries = binaries
        self.address = address
        self.service_cidr = service_cidr
        self.controllers = controllers
        self.pki: _Pki | None = None  # the CA, kept to issue a node's credentials (node.py)
        self.kubeconfig = directory / "kubeconfig"
        self.audit_log = directory / "audit.log"
        self.url = ""
        self.pids: dict[str, int] = {}
        self.etcd_data = ""

    # -- starting ---------------------------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> ControlPlane:
        """Started on free ports, picked again when one was taken before a component bound it (a port is free
        when it is picked: another process, such as another test process's control plane, may bind it first)."""
        binaries = self.binaries or build()
        for _ in range(PORT_ATTEMPTS - 1):
            with contextlib.suppress(PortTakenError):
                return self._start(binaries, timeout)
        return self._start(binaries, timeout)

    def _start(self, binaries: pathlib.Path, timeout: float) -> ControlPlane:
        self.directory.mkdir(parents=True, exist_ok=True)
        for log in self.directory.glob("*.log"):  # a failed attempt's: what the next one says is its own
            log.unlink()
        pki = self.pki = _Pki(self.directory / "pki")
        api_port, etcd_port, peer_port = free_port(), free_port(), free_port()
        self.url = f"https://{self.address}:{api_port}"
        service_ip = str(next(ipaddress.IPv4Network(self.service_cidr).hosts()))  # the `kubernetes` Service's
        shm = pathlib.Path("/dev/shm")
        self.etcd_data = tempfile.mkdtemp(prefix="ceo-etcd-", dir=shm if shm.is_dir() else None)
        self._save()
        try:
            self._spawn(
                "etcd",
                binaries / "etcd",
                "--name=controlplane",
                f"--data-dir={self.etcd_data}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=controlplane=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",  # a throw-away database: durability costs time for nothing
                "--log-level=warn",
            )
            serving = pki.issue(
                "apiserver",
                "kube-apiserver",
                hosts=[
                    *dict.fromkeys(("127.0.0.1", self.address)),
                    "localhost",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    service_ip,
                ],
            )
            signing_key, verifying_key = pki.service_account_keys()
            # How the API server authenticates to kubelets (logs, exec), as kubeadm's apiserver-kubelet-client.
            kubelet_client = pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters")
            loopback = self.address == "127.0.0.1"
            audit_policy = self.directory / "audit-policy.yaml"
            audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY))
            self._spawn(
                "kube-apiserver",
                binaries / "kube-apiserver",
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={api_port}",
                f"--tls-cert-file={serving[0]}",
                f"--tls-private-key-file={serving[1]}",
                f"--client-ca-file={pki.ca_path}",
                "--authorization-mode=Node,RBAC",
                f"--enable-admission-plugins={ADMISSION_PLUGINS}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={verifying_key}",
                f"--service-account-signing-key-file={signing_key}",
                f"--service-cluster-ip-range={self.service_cidr}",
                # On loopback, the `kubernetes` Service's endpoints would name a loopback address, which the API
                # refuses; elsewhere they name the address (pods reach the API server through the Service).
                f"--endpoint-reconciler-type={'none' if loopback else 'lease'}",
                f"--kubelet-client-certificate={kubelet_client[0]}",
                f"--kubelet-client-key={kubelet_client[1]}",
                "--kubelet-preferred-address-types=InternalIP",
                "--allow-privileged=true",
                "--profiling=false",
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-mode=blocking",  # written before the answer: a test reads it right after
            )
            admin = pki.issue("admin", "admin", "system:masters")
            write_kubeconfig(self.kubeconfig, self.url, pki.ca_path, certificate=admin)
            self._wait_ready(timeout)
            for component, user in (
                ("kube-controller-manager", "system:kube-controller-manager"),
                ("kube-scheduler", "system:kube-scheduler"),
            ):
                config = write_kubeconfig(
                    self.directory / f"{component}.kubeconfig",
                    self.url,
                    pki.ca_path,
                    certificate=pki.issue(component, user),
                )
                options = [f"--kubeconfig={config}", "--leader-elect=false", "--secure-port=0"]
                if component == "kube-controller-manager":
                    options += [
                        f"--controllers={self.controllers}",
                        "--use-service-account-credentials=true",  # each controller as its own identity (RBAC)
                        f"--service-account-private-key-file={signing_key}",
                        f"--root-ca-file={pki.ca_path}",
                        f"--service-cluster-ip-range={self.service_cidr}",
                    ]
                self._spawn(component, binaries / component, *options)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, binary: pathlib.Path, *args: str) -> None:
        with (self.directory / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                [str(binary), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pids[name] = process.pid
        self._save()

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name, pid in self.pids.items():
                if not _alive(pid):
                    log = (self.directory / f"{name}.log").read_text(errors="replace")[-4000:]
                    failure = PortTakenError if "address already in use" in log else RuntimeError
                    raise failure(f"{name} exited:\n{log}")
            try:
                if self.get("/readyz") == "ok":
                    return
            except (OSError, urllib.error.HTTPError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the API server was not ready within {timeout} s")
            time.sleep(0.2)

    def get(self, path: str) -> str:
        """A GET as the administrator (the body as text)."""
        config = yaml.safe_load(self.kubeconfig.read_text())
        user = config["users"][0]["user"]
        context = ssl.create_default_context(cafile=str(self.directory / "pki" / "ca.pem"))
        context.load_cert_chain(user["client-certificate"], user["client-key"])
        with urllib.request.urlopen(self.url + path, context=context, timeout=5) as response:
            body: bytes = response.read()
            return body.decode()

    def _save(self) -> None:
        state = {"pids": self.pids, "etcd_data": self.etcd_data, "url": self.url}
        (self.directory / STATE_FILE).write_text(json.dumps(state))

    # -- stopping ---------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every component (the API server's clients first) and remove etcd's data."""
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            pid = self.pids.pop(name, None)
            if pid is not None:
                _terminate(pid)
        if self.etcd_data:
            shutil.rmtree(self.etcd_data, ignore_errors=True)

    @classmethod
    def of(cls, directory: pathlib.Path) -> ControlPlane:
        """The control plane started in `directory` by another process (`up`), to stop it."""
        plane = cls(directory)
        with contextlib.suppress(FileNotFoundError):
            state = json.loads((directory / STATE_FILE).read_text())
            plane.pids, plane.etcd_data, plane.url = state["pids"], state["etcd_data"], state["url"]
        return plane


def _alive(pid: int) -> bool:
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child (started by `up`): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return finished == 0


def _terminate(pid: int, grace: float = 10) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="controlplane", description=__doc__)
    parser.add_argument("action", choices=["up", "down", "build"])
    parser.add_argument("directory", type=pathlib.Path, nargs="?", default=pathlib.Path(".dev/cluster"))
    args = parser.parse_args(argv)
    directory: pathlib.Path = args.directory.resolve()
    if args.action == "build":
        print(build())
    elif args.action == "up":
        if (directory / STATE_FILE).exists():
            print(f"error: a control plane runs from {directory}; `down` it first", file=sys.stderr)
            return 1
        started = time.monotonic()
        plane = ControlPlane(directory).start()
        print(f"control plane at {plane.url}, ready in {time.monotonic() - started:.0f} s", file=sys.stderr)
        print(plane.kubeconfig)
    else:
        ControlPlane.of(directory).stop()
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
