"""Tests on a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler built
from Go modules: celery_event_devcluster/controlplane.py) with a process kubelet (process_kubelet.py).

Fixtures (registered for the whole suite by tests/conftest.py):

- `cluster` (session): one control plane per pytest process, its admin `client`, `kubeconfig` and `kubectl`, and
  its `kubelet`, its `audit(user)` (the API server's audit log: every request of a user with its answer code).
  Started in ~8 s; stopped, with its etcd data removed, at the end of the session.
- `namespace`: a namespace of the test's own (its `default` ServiceAccount made, so pods are admitted at once),
  deleted afterwards.
- `chart_operator`: the chart rendered by the real Helm engine (values: an indirect parameter, default {}) applied
  to the API server; the operator runs as a local process whose kubeconfig holds a token of the chart's
  ServiceAccount, so the real RBAC authoriser decides every call; the chart's MutatingWebhookConfiguration points
  at it (URL and CA bundle), so the API server calls it for every worker pod created. CRDs installed by the chart.
  It yields the ChartOperator: every replica of the rendered Deployments runs (`.processes`; `.process`, the first,
  is the one the webhook points at); `@pytest.mark.parametrize("chart_operator", [{"replicaCount": 2}],
  indirect=True)` for other values.

Workers: `cluster.kubelet.run_workers(namespace, app_dir, "module")`, then create a Deployment whose pod template
carries the label `celeryevents.io/service`: the ReplicaSet controller creates the pods, the webhook injects the
settings, the scheduler binds them, and the kubelet runs `celery -A module worker` with the admitted pod's env and
mounted settings, named `celery@<pod name>` (`cluster.kubelet.workers(namespace)` gives them by pod name; `env=`
adds what the image would). Deleting or evicting a pod sends SIGTERM and SIGKILL after its grace period, as a
kubelet does. tests/integration/cluster/test_workers_on_cluster.py's `Service` does all this for the billing
sample (`start`, `settled(replicas)`: the running pods once the Deployment settled on the stamped settings,
`fire`, `phases`):

    def test_rollout_during_a_long_task(cluster, namespace, chart_operator, test_vhost_url, tmp_path):
        billing = Service(cluster, namespace, tmp_path / "handled.jsonl")
        billing.start(test_vhost_url, replicas=2)
        first = billing.settled(2)
        billing.fire((1, "long:30"))
        ...
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import secrets
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from celery_event_devcluster.controlplane import ControlPlane, write_kubeconfig
from celery_event_operator.core.api import crd
from tests.support.kube import ApiError, KubeClient, eventually
from tests.support.operator_process import OperatorProcess
from tests.support.process_kubelet import ProcessKubelet
from tests.support.waiting import once_quiet

CHART = pathlib.Path(__file__).resolve().parents[2] / "charts" / "celery-event-operator"
# Kinds of other projects' operators (cert-manager, Prometheus Operator): not served by a bare control plane.
FOREIGN_GROUPS = ("cert-manager.io/", "monitoring.coreos.com/")
# The operator's own options in the rendered Deployment that the local process sets itself (ports on this
# machine, its own webhook certificate for 127.0.0.1, the test's resync period).
LOCAL_OPTIONS = ("--liveness", "--metrics-port", "--webhook-", "--resync-seconds", "--verbose")


class Cluster:
    def __init__(self, plane: ControlPlane, directory: pathlib.Path) -> None:
        self.plane = plane
        self.directory = directory
        self.kubeconfig = plane.kubeconfig
        self.url = plane.url
        self.ca = plane.directory / "pki" / "ca.pem"
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(plane.directory / "pki" / "admin.pem", plane.directory / "pki" / "admin-key.pem")
        self.client = KubeClient(self.url, context=context)
        self.kubelet = ProcessKubelet(self.client, directory / "kubelet")

    def kubectl(
        self, *args: str, check: bool = True, kubeconfig: pathlib.Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig or self.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
        )

    def audit(self, user: str) -> list[dict[str, Any]]:
        """The API server's audit record of every request `user` made (verb, objectRef, responseStatus)."""
        found = []
        for line in self.plane.audit_log.read_text().splitlines():
            entry = json.loads(line)
            if entry["user"].get("username") == user:
                found.append(entry)
        return found

    def client_as(self, token: str) -> KubeClient:
        """A client whose requests carry `token` (a ServiceAccount's, or a user's)."""
        return KubeClient(self.url, context=ssl.create_default_context(cafile=str(self.ca)), token=token)

    def service_account_token(self, namespace: str, name: str, seconds: int = 7200) -> str:
        """A token of the ServiceAccount from the TokenRequest API, as a projected volume gets it."""
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        }
        answer = self.client.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", request)
        token: str = answer["status"]["token"]
        return token

    def kubeconfig_of(self, namespace: str, service_account: str, path: pathlib.Path) -> pathlib.Path:
        """A kubeconfig holding a token of the ServiceAccount: every call it makes is authorised by RBAC."""
        token = self.service_account_token(namespace, service_account)
        return write_kubeconfig(path, self.url, self.ca, token=token, namespace=namespace)

    def apply(self, documents: list[dict[str, Any]], path: pathlib.Path) -> None:
        path.write_text(yaml.safe_dump_all(documents))
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))

    def create_namespace(self, prefix: str = "t") -> str:
        name = f"{prefix}-{secrets.token_hex(4)}"
        self.client.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        # The ServiceAccount admission plugin refuses pods until the controller made the namespace's `default`.
        eventually(lambda: self.client.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"), timeout=30)
        return name


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """One real control plane per pytest process (each on free ports), with a process kubelet."""
    directory = pathlib.Path(tempfile.mkdtemp(prefix="ceo-cluster-"))
    plane = ControlPlane(directory / "controlplane")
    try:
        plane.start()
        found = Cluster(plane, directory)
        found.kubelet.start()
        yield found
        found.kubelet.stop()
        assert not found.kubelet.errors, found.kubelet.errors
    finally:
        plane.stop()
        if not os.environ.get("CEO_KEEP_CLUSTER_FILES"):
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = cluster.create_namespace()
    yield name
    # The test's operator is gone by now: its resources' finalizers would keep the namespace Terminating, and the
    # next tests' cluster-wide operators would find them (a standby's start-up pass reconciled one).
    for plural in ("celeryeventservices", "celeryeventreplays"):
        path = f"/apis/celeryevents.io/v1alpha1/namespaces/{name}/{plural}"
        try:
            for item in cluster.client.get(path)["items"]:
                if item["metadata"].get("finalizers"):
                    cluster.client.merge_patch(f"{path}/{item['metadata']['name']}", {"metadata": {"finalizers": None}})
        except ApiError as exc:
            if exc.status != 404:  # no CRD installed in this session
                raise
    try:
        cluster.client.delete(f"/api/v1/namespaces/{name}")
    except ApiError as exc:
        if exc.status != 404:
            raise


def render_chart(values: dict[str, Any], release: str, namespace: str) -> list[dict[str, Any]]:
    """The chart as `helm install` renders it (the real Helm engine)."""
    import helm_python as helm  # noqa: PLC0415 — heavy: only the tests that install the chart load it

    rendered = helm.Chart.load(CHART).render(values, name=release, namespace=namespace, is_install=True)
    return [document for text in rendered.values() for document in yaml.safe_load_all(text) if document]


def operator_options(deployment: dict[str, Any]) -> list[str]:
    """The rendered container's options that are about what the operator does (scope, peering, shards,
    metrics): the rest are about where it listens, which the local process decides."""
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return [arg for arg in container["args"][1:] if not arg.startswith(LOCAL_OPTIONS)]


def peering_state(replica: OperatorProcess) -> str:
    """Whether kopf's watch of the services last paused or resumed in this replica (a replica starts paused)."""
    log = replica.log()
    resumed = log.rfind("Resuming the watch-stream for celeryeventservices")
    paused = log.rfind("Pausing the watch-stream for celeryeventservices")
    return "starting" if paused < 0 else "active" if resumed > paused else "standby"


class ChartOperator:
    """The chart installed on the cluster, and its operator running locally as the chart's ServiceAccount."""

    def __init__(
        self, cluster: Cluster, values: dict[str, Any], directory: pathlib.Path, resync_seconds: float = 2.0
    ) -> None:
        self.cluster = cluster
        self.release = f"ceo-{secrets.token_hex(3)}"
        self.namespace = cluster.create_namespace("operators")
        self.directory = directory
        self.documents = render_chart(values, self.release, self.namespace)
        self.deployments = [d for d in self.documents if d["kind"] == "Deployment"]
        self.resync_seconds = resync_seconds
        self.processes: list[OperatorProcess] = []

    def install(self) -> ChartOperator:
        # The Deployment's pods are the local operator processes: everything else as Helm would apply it.
        documents = [
            d for d in self.documents if d["kind"] != "Deployment" and not d["apiVersion"].startswith(FOREIGN_GROUPS)
        ]
        crds = [d for d in documents if d["kind"] == "CustomResourceDefinition"]
        if not crds:  # crds.enabled=false: the user installed them from crds/ beforehand
            crds = crd.custom_resource_definitions()
        # First, as Helm does with crds/: the rest may be of their kinds.
        self.cluster.apply(crds, self.directory / "crds.yaml")
        for definition in crds:
            self.cluster.kubectl("wait", "--for=condition=Established", f"crd/{definition['metadata']['name']}")
        service_account = self.deployments[0]["spec"]["template"]["spec"]["serviceAccountName"]
        if not any(d["kind"] == "ServiceAccount" for d in documents):  # serviceAccount.create=false: the user's
            documents.append(
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": service_account, "namespace": self.namespace},
                }
            )
        others = [d for d in documents if d["kind"] not in ("CustomResourceDefinition", "MutatingWebhookConfiguration")]
        self.cluster.apply(others, self.directory / "chart.yaml")
        self.kubeconfig = self.cluster.kubeconfig_of(
            self.namespace, service_account, self.directory / "operator.kubeconfig"
        )
        return self

    def peered(self) -> tuple[OperatorProcess, ...]:
        """The replicas once their kopf peering settled: the active one first, then the paused ones. A replica that
        starts alone works until a peer of higher priority appears (kopf's rule, as in any rollout)."""
        states = once_quiet(lambda: tuple(peering_state(p) for p in self.processes), quiet_seconds=3, timeout=40)
        assert sorted(states) == ["active"] + ["standby"] * (len(states) - 1), states
        return tuple(sorted(self.processes, key=lambda p: peering_state(p) != "active"))

    def start_all(self) -> ChartOperator:
        """Every replica of every rendered Deployment (shards), as local processes."""
        for index, deployment in enumerate(self.deployments):
            for _ in range(deployment["spec"]["replicas"]):
                self.start(index)
        return self

    @property
    def process(self) -> OperatorProcess:
        """The first replica started (the one the webhook configuration points at)."""
        return self.processes[0]

    def start(self, deployment_index: int = 0) -> OperatorProcess:
        """One replica of a rendered Deployment (a shard's), as a local process; the webhook configuration then
        points at the first one started."""
        process = OperatorProcess(
            self.kubeconfig,
            self.directory / f"operator-{len(self.processes)}.log",
            *operator_options(self.deployments[deployment_index]),
            resync_seconds=self.resync_seconds,
            webhook=any(d["kind"] == "MutatingWebhookConfiguration" for d in self.documents),
        ).start()
        self.processes.append(process)
        if process.webhook and len(self.processes) == 1:
            self._register_webhook(process)
        return process

    def _register_webhook(self, process: OperatorProcess) -> None:
        """The chart's MutatingWebhookConfiguration, its Service reference replaced by the local process's URL
        (same path) and its CA bundle by the certificate the process serves."""
        [configuration] = [d for d in self.documents if d["kind"] == "MutatingWebhookConfiguration"]
        configuration = yaml.safe_load(yaml.safe_dump(configuration))
        ca_bundle = base64.b64encode(process.webhook_cert.read_bytes()).decode()
        for webhook in configuration["webhooks"]:
            path = webhook["clientConfig"]["service"].get("path", "/")
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{process.webhook_port}{path}", "caBundle": ca_bundle}
        configuration["metadata"].pop("annotations", None)  # cert-manager's CA injection: no cert-manager here
        self.cluster.apply([configuration], self.directory / "webhook.yaml")

    def stop(self) -> None:
        for process in self.processes:
            process.stop()
        self.processes.clear()

    def uninstall(self) -> None:
        """What `helm uninstall` removes (the CRDs are kept, as the chart's crds.keep does by default)."""
        kept = ("CustomResourceDefinition",)
        documents = [
            d
            for d in self.documents
            if d["kind"] not in kept and d["kind"] != "Deployment" and not d["apiVersion"].startswith(FOREIGN_GROUPS)
        ]
        path = self.directory / "uninstall.yaml"
        path.write_text(yaml.safe_dump_all(documents))
        self.cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", str(path))
        self.cluster.client.delete(f"/api/v1/namespaces/{self.namespace}")


TEST_NAMESPACE = re.compile(r"\bt-[0-9a-f]{8}\b")


def lines_of(log: str, namespace: str | None) -> str:
    """A cluster-wide operator's log, less what it did for other tests' namespaces and the AMQP client's chatter:
    what a failure report needs (the whole log drowns it)."""
    kept = []
    for line in log.splitlines():
        named = set(TEST_NAMESPACE.findall(line))
        if (not named or named == {namespace}) and "] amqp " not in line:
            kept.append(line)
    return "\n".join(kept)


@pytest.fixture
def chart_operator(cluster: Cluster, tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> Iterator[ChartOperator]:
    """The chart (values: an indirect parameter) installed, and its operator running as its ServiceAccount: every
    replica of every rendered Deployment (`.process`: the first, which the webhook configuration points at)."""
    installed = ChartOperator(cluster, getattr(request, "param", {}), tmp_path).install()
    try:
        yield installed.start_all()
    finally:
        installed.stop()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            namespace = request.node.funcargs.get("namespace")
            for log in sorted(tmp_path.glob("operator-*.log")):
                print(f"--- {log.name} (lines of {namespace} or none) ---")
                print(lines_of(log.read_text(errors="replace"), namespace)[-60000:])
        installed.uninstall()
