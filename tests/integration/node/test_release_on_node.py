"""The chart installed, upgraded and uninstalled by the real Helm binary on a cluster with a real node: the
operator's pod is the image built from the Dockerfile, run by the kubelet (probes, the webhook's Secret mounted,
read-only root, uid 10001); the API server calls its webhook through the chart's Service (kube-proxy on the node);
an upgrade keeps the webhook's CA (the chart's `lookup`, which only a real `helm` against a real API server runs);
an uninstall keeps the CRDs. Then every values variant that changes what runs in a pod, installed and Ready."""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.node_cluster import CHART, NodeClusterHandle
from tests.support.waiting import eventually

# One release name and namespace for every install of a process: the CRDs kept by an uninstall carry the release's
# ownership, which Helm adopts again only for the same release (another name is refused: a user's reinstall too).
RELEASE = "ceo"
NAMESPACE = "celery-event-operator"
FULLNAME = f"{RELEASE}-celery-event-operator"
BROKER_SECRET = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "rabbitmq"},
    "stringData": {"url": "amqp://guest:guest@127.0.0.1:5672/"},
}


def install(cluster: NodeClusterHandle, *options: str) -> str:
    done = cluster.helm(
        *("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace"),
        *cluster.image_values(),
        *options,
        *("--wait", "--timeout", "180s"),
    )
    return done.stdout


def uninstall(cluster: NodeClusterHandle) -> None:
    cluster.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "120s")


def operator_pods(cluster: NodeClusterHandle) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={RELEASE}"
    pods: list[dict[str, Any]] = cluster.json("get", "pods", "-n", NAMESPACE, "-l", selector)["items"]
    return [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions", [])
    return pod["status"].get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


@pytest.fixture
def workload_namespace(node_cluster: NodeClusterHandle) -> Iterator[str]:
    """A namespace with the sample service (its broker need not answer: the webhook injects from the resource)."""
    name = f"shop-{secrets.token_hex(3)}"
    node_cluster.kubectl("create", "namespace", name)
    yield name
    node_cluster.kubectl("delete", "namespace", name, "--wait=false")


def injected_pod(cluster: NodeClusterHandle, namespace: str) -> dict[str, Any]:
    """A pod labelled as the billing service's, created through the API server (so through its webhooks)."""
    name = f"billing-{secrets.token_hex(3)}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"celeryevents.io/service": "billing"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "worker",
                    "image": cluster.images["worker"].reference,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "1"],
                }
            ],
        },
    }
    created: dict[str, Any] = json.loads(
        cluster.kubectl("create", "-o", "json", "-f", "-", stdin=json.dumps(pod)).stdout
    )
    return created


def env_names(pod: dict[str, Any]) -> set[str]:
    return {item["name"] for item in pod["spec"]["containers"][0].get("env", [])}


def check_operator_pod(cluster: NodeClusterHandle, pod: dict[str, Any]) -> None:
    """The image built here, run by the kubelet as the chart asks: uid 10001, a read-only root, liveness served."""
    [container] = pod["spec"]["containers"]
    assert container["image"] == cluster.images["operator"].reference
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    assert pod["spec"]["nodeName"] == cluster.node.name
    # The liveness endpoint, through the API server's proxy to the pod (as the kubelet's probe reaches it).
    health = cluster.kubectl(
        "get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}:8080/proxy/healthz"
    )
    assert health.returncode == 0
    # The process runs as the image's user, not root, and cannot write its root filesystem.
    exec_ = ["exec", "-n", NAMESPACE, pod["metadata"]["name"], "--"]
    assert cluster.kubectl(*exec_, "id", "-u").stdout.strip() == "10001"
    written = cluster.kubectl(*exec_, "sh", "-c", "echo x > /opt/venv/x", check=False)
    assert "Read-only file system" in written.stderr


def ca_bundle(cluster: NodeClusterHandle) -> tuple[str, str]:
    """The webhook Secret's CA and the one the API server verifies the webhook by."""
    secret = cluster.json("get", "secret", "-n", NAMESPACE, f"{FULLNAME}-webhook-tls")
    configuration = cluster.json("get", "mutatingwebhookconfiguration", FULLNAME)
    return secret["data"]["ca.crt"], configuration["webhooks"][0]["clientConfig"]["caBundle"]


def test_install_upgrade_and_uninstall_by_helm(node_cluster: NodeClusterHandle, workload_namespace: str) -> None:
    cluster = node_cluster
    try:
        out = install(cluster)
        assert "STATUS: deployed" in out, out
        [pod] = operator_pods(cluster)
        assert ready(pod), pod["status"]
        check_operator_pod(cluster, pod)

        # The webhook, called by the API server through the chart's Service, injects the service's settings.
        cluster.kubectl("apply", "-n", workload_namespace, "-f", "-", stdin=json.dumps(BROKER_SECRET))
        cluster.kubectl("apply", "-n", workload_namespace, "-f", str(CHART.parents[1] / "examples" / "billing.yaml"))

        def injected() -> dict[str, Any] | None:  # the first pods may come before the operator indexed the service
            created = injected_pod(cluster, workload_namespace)
            return created if "CELERY_CONFIG_MODULE" in env_names(created) else None

        first = eventually(injected, timeout=60, interval=2)
        assert "celeryevents.io/config-hash" in first["metadata"]["annotations"]
        log = cluster.kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"]).stdout
        assert '"POST /inject-celery-settings' in log, log
        assert "kube-apiserver-admission" in log, log

        before = ca_bundle(cluster)
        assert before[0] == before[1]
        assert b"BEGIN CERTIFICATE" in base64.b64decode(before[0])

        # An upgrade that changes the pod: Helm's `lookup` finds the Secret, so the CA stays, and the new pod's
        # webhook still verifies under it.
        out = cluster.helm(
            *("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values"),
            *("--set", "resyncSeconds=45", "--wait", "--timeout", "180s"),
        ).stdout
        assert "REVISION: 2" in out, out
        assert ca_bundle(cluster) == before

        def rolled() -> list[dict[str, Any]] | None:
            pods = operator_pods(cluster)
            return pods if len(pods) == 1 and ready(pods[0]) else None

        [upgraded] = eventually(rolled, timeout=120, interval=2)
        assert upgraded["metadata"]["name"] != pod["metadata"]["name"]
        assert "--resync-seconds=45" in upgraded["spec"]["containers"][0]["args"]
        second = injected_pod(cluster, workload_namespace)
        assert "CELERY_CONFIG_MODULE" in env_names(second), "the upgraded webhook was not called, or not trusted"
        # Offline rendering has no lookup: `helm template` makes a new CA every time (the reason upgrades must not).
        rendered = cluster.helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE).stdout
        [secret] = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Secret"]
        assert secret["data"]["ca.crt"] != before[0]
    finally:
        cluster.kubectl("delete", "ces", "--all", "-n", workload_namespace, "--wait=false", check=False)
        uninstall(cluster)

    # Uninstalled: the release's objects are gone; the CRDs (and so every user's resources) are kept.
    assert cluster.helm("status", RELEASE, "--namespace", NAMESPACE, check=False).returncode != 0
    assert cluster.kubectl("get", "mutatingwebhookconfiguration", FULLNAME, check=False).returncode != 0
    assert cluster.kubectl("get", "deployment", "-n", NAMESPACE, FULLNAME, check=False).returncode != 0
    for crd in ("celeryeventservices.celeryevents.io", "celeryeventreplays.celeryevents.io"):
        kept = cluster.json("get", "crd", crd)
        assert kept["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert cluster.json("get", "ces", "billing", "-n", workload_namespace)["metadata"]["name"] == "billing"


@pytest.mark.parametrize(
    ("options", "deployments", "replicas"),
    [
        pytest.param([], 1, 1, id="defaults"),
        pytest.param(["--set", "watchNamespaces={shop}"], 1, 1, id="watchNamespaces"),
        pytest.param(["--set", "replicaCount=2"], 1, 2, id="replicaCount=2"),
        pytest.param(["--set", "webhook.enabled=false"], 1, 1, id="webhook.enabled=false"),
        pytest.param(["--set", "sharding.shards=2"], 2, 1, id="sharding.shards=2"),
    ],
)
def test_values_variants_install_and_are_ready(
    node_cluster: NodeClusterHandle, options: list[str], deployments: int, replicas: int
) -> None:
    """`helm install --wait` of each variant: every Deployment rolled out, every pod Running and Ready on the node
    (the readiness probe is the webhook's port where there is a webhook, /healthz where there is none)."""
    cluster = node_cluster
    watched = [o.split("{")[1].rstrip("}") for o in options if o.startswith("watchNamespaces=")]
    for namespace in watched:  # the chart's Roles go into them: they must exist (the user's)
        cluster.kubectl("create", "namespace", namespace)
    try:
        install(cluster, *options)
        found = cluster.json("get", "deployments", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}")
        assert len(found["items"]) == deployments
        assert all(d["status"].get("readyReplicas") == replicas for d in found["items"]), found["items"]
        pods = operator_pods(cluster)
        assert len(pods) == deployments * replicas
        assert all(ready(pod) and pod["spec"]["nodeName"] == cluster.node.name for pod in pods)
        assert all(sum(s["restartCount"] for s in pod["status"]["containerStatuses"]) == 0 for pod in pods)
    finally:
        uninstall(cluster)
        for namespace in watched:
            cluster.kubectl("delete", "namespace", namespace, "--wait=false")
