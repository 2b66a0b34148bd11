"""Every variant of the chart actually starts: the operator runs with exactly what the rendered Deployment
gives it, and the chart keeps its webhook certificate across upgrades (Helm `lookup` against the emulated API).

What cannot exist here and is stood in for, per variant: the kubelet (the test starts the container's
command itself, with the rendered args; each volume is a directory in place of its mountPath, and the args
are rewritten to point there), in-cluster credentials (KUBECONFIG to the emulated API is the only env the
manifest does not give), and cert-manager or the user for a webhook Secret the chart does not render (the
test issues a certificate for the Service's DNS names, as they would).
"""

from __future__ import annotations

import base64
import http.client
import json
import pathlib
import re
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from typing import Any

import helm_python as helm
import pytest
import yaml

from celery_event_operator.adapters import certs
from tests.conftest import REPO
from tests.support.kube import EmulatedApi, install_crds
from tests.support.operator_process import accepts, admission_review, free_port
from tests.support.waiting import eventually, stays
from tests.unit.chart.test_chart import VALUE_SETS

CHART = REPO / "charts" / "celery-event-operator"
RELEASE, NAMESPACE = "ceo", "operators"
EXPIRES = "celeryevents.io/certificate-expires-unix"


def render(values: dict[str, Any], cluster: EmulatedApi | None = None) -> list[dict[str, Any]]:
    chart = helm.Chart.load(CHART)
    if cluster is None:
        rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    else:  # cluster-aware: `lookup` reads the emulated API
        with helm.Config(kubeconfig_path=str(cluster.kubeconfig), namespace=NAMESPACE) as config:
            rendered = config.render(chart, values, name=RELEASE, namespace=NAMESPACE, is_upgrade=True)
    return [doc for text in rendered.values() for doc in yaml.safe_load_all(text) if doc]


def of_kind(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in documents if d["kind"] == kind]


class _PinnedHttps(http.client.HTTPSConnection):
    """HTTPS to 127.0.0.1 that verifies the certificate for `host`, as the API server does for the Service."""

    def connect(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def _mount(volume: dict[str, Any], secrets: dict[str, dict[str, str]], directory: pathlib.Path) -> None:
    directory.mkdir(parents=True)
    if "secret" in volume:
        for key, value in secrets[volume["secret"]["secretName"]].items():
            (directory / key).write_bytes(base64.b64decode(value))


def webhook_secrets(documents: list[dict[str, Any]], tmp_path: pathlib.Path) -> tuple[dict[str, dict[str, str]], str]:
    """The data of every Secret a pod mounts, and the CA that verifies the webhook (base64 PEM)."""
    rendered = {s["metadata"]["name"]: s["data"] for s in of_kind(documents, "Secret")}
    configurations = of_kind(documents, "MutatingWebhookConfiguration")
    if not configurations:
        return rendered, ""
    service = configurations[0]["webhooks"][0]["clientConfig"]["service"]
    ca_bundle = configurations[0]["webhooks"][0]["clientConfig"].get("caBundle", "")
    for deployment in of_kind(documents, "Deployment"):
        for volume in deployment["spec"]["template"]["spec"]["volumes"]:
            name = volume.get("secret", {}).get("secretName")
            if name and name not in rendered:  # cert-manager's or the user's: issue one for the Service
                dns = f"{service['name']}.{service['namespace']}.svc"
                cert, key = certs.self_signed(tmp_path / "issued", [dns])
                pem = base64.b64encode(cert.read_bytes()).decode()
                rendered[name] = {"tls.crt": pem, "tls.key": base64.b64encode(key.read_bytes()).decode()}
                ca_bundle = pem
    return rendered, ca_bundle


class Pod:
    """One pod of a rendered Deployment: the container's command with its args and mounts, on ports of its own
    (each pod has an address of its own, processes here share one: the chart's fixed ports would clash between
    replicas, and with other test runs on the machine)."""

    def __init__(
        self,
        deployment: dict[str, Any],
        secrets: dict[str, dict[str, str]],
        directory: pathlib.Path,
        kubeconfig: pathlib.Path,
    ) -> None:
        spec = deployment["spec"]["template"]["spec"]
        [self.container] = spec["containers"]
        declared = {port["name"]: port["containerPort"] for port in self.container["ports"]}
        self.ports = {name: free_port() for name in declared}  # by the container port's name
        self.log = directory / "operator.log"
        by_name = {volume["name"]: volume for volume in spec["volumes"]}
        args = list(self.container["args"])
        for name, port in declared.items():
            args = [re.sub(rf"(?<=[=:]){port}\b", str(self.ports[name]), arg) for arg in args]
        for mount in self.container.get("volumeMounts", []):
            mounted = directory / "mounts" / mount["name"]
            _mount(by_name[mount["name"]], secrets, mounted)
            args = [arg.replace(mount["mountPath"], str(mounted)) for arg in args]
        env = {"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin", "HOME": str(directory)}
        env |= {item["name"]: item["value"] for item in self.container.get("env", [])}
        directory.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery_event_operator.cli", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def ready(self) -> bool:
        """The readiness probe passes (an exited process fails at once, with its log)."""
        if self.process.poll() is not None:
            raise AssertionError(f"the operator exited:\n{self.log.read_text(errors='replace')[-5000:]}")
        return passes(self.container["readinessProbe"], self.ports)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def passes(probe: dict[str, Any], ports: dict[str, int]) -> bool:
    """A kubelet's httpGet or tcpSocket probe against the local process."""
    if "httpGet" in probe:
        return _answers(f"http://127.0.0.1:{ports[probe['httpGet']['port']]}{probe['httpGet']['path']}")
    return accepts(ports[probe["tcpSocket"]["port"]])


@pytest.mark.parametrize("values", VALUE_SETS)
def test_every_rendered_operator_starts_and_serves_its_probes_and_webhook(
    values: dict[str, Any], kube_api: EmulatedApi, crd_installed: dict[str, Any], tmp_path: pathlib.Path
) -> None:
    documents = render(values)
    install_crds(kube_api, of_kind(documents, "CustomResourceDefinition"))  # installed with the chart
    secrets, ca_bundle = webhook_secrets(documents, tmp_path)
    for index, deployment in enumerate(of_kind(documents, "Deployment")):  # one at a time: a shard per run
        pod = Pod(deployment, secrets, tmp_path / f"pod-{index}", kube_api.kubeconfig)
        try:
            _probe(pod, documents, ca_bundle)
        except BaseException:
            print(pod.log.read_text(errors="replace")[-5000:])
            raise
        finally:
            pod.stop()


def _probe(pod: Pod, documents: list[dict[str, Any]], ca_bundle: str) -> None:
    """What the kubelet and the API server ask of the pod: liveness, /metrics, and the webhook where enabled."""
    ports = pod.ports
    eventually(lambda: passes(pod.container["livenessProbe"], ports), timeout=30, message="no liveness answer")
    # The Service sends admission requests only to a Ready pod: the webhook must answer once readiness passes.
    eventually(pod.ready, timeout=30, message="never Ready")
    stays(lambda: pod.process.poll() is None, seconds=2, message="the operator exited")
    assert _answers(f"http://127.0.0.1:{ports['metrics']}/metrics")
    if not of_kind(documents, "MutatingWebhookConfiguration"):
        assert "webhook" not in ports
        return
    worker = {
        "metadata": {"name": "w", "labels": {"celeryevents.io/service": "billing"}},
        "spec": {"containers": [{"name": "worker", "image": "app"}]},
    }
    answer = webhook_answer(documents, ports, ca_bundle, admission_review(worker))
    assert answer["response"]["allowed"] is True


def webhook_answer(
    documents: list[dict[str, Any]], ports: dict[str, int], ca_bundle: str, review: dict[str, Any]
) -> dict[str, Any]:
    """An AdmissionReview sent as the API server sends it: to the webhook Service's port and path, over TLS
    verified against the configuration's caBundle for the Service's DNS name."""
    [configuration] = of_kind(documents, "MutatingWebhookConfiguration")
    service = configuration["webhooks"][0]["clientConfig"]["service"]
    [manifest] = [s for s in of_kind(documents, "Service") if s["metadata"]["name"] == service["name"]]
    [target] = [p["targetPort"] for p in manifest["spec"]["ports"] if p["port"] == service["port"]]
    context = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
    connection = _PinnedHttps(
        f"{service['name']}.{service['namespace']}.svc", ports[target], context=context, timeout=10
    )
    connection.request("POST", service["path"], json.dumps(review), {"Content-Type": "application/json"})
    answer: dict[str, Any] = json.loads(connection.getresponse().read())
    return answer


def test_the_generated_webhook_certificate_survives_upgrades(kube_api: EmulatedApi) -> None:
    """Issue #15: a new CA on every `helm upgrade` opened a window in which pods were admitted unconfigured."""
    [installed] = of_kind(render({}), "Secret")
    kube_api.client.create(f"/api/v1/namespaces/{NAMESPACE}/secrets", installed)
    upgraded = render({}, cluster=kube_api)
    [secret] = of_kind(upgraded, "Secret")
    assert secret["data"] == installed["data"], "the upgrade kept the certificate"
    [configuration] = of_kind(upgraded, "MutatingWebhookConfiguration")
    assert configuration["webhooks"][0]["clientConfig"]["caBundle"] == installed["data"]["ca.crt"]

    soon = str(int(time.time()) + 10 * 86400)
    path = f"/api/v1/namespaces/{NAMESPACE}/secrets/{installed['metadata']['name']}"
    kube_api.client.merge_patch(path, {"metadata": {"annotations": {EXPIRES: soon}}})
    [renewed] = of_kind(render({}, cluster=kube_api), "Secret")
    assert renewed["data"]["ca.crt"] != installed["data"]["ca.crt"], "within 30 days of expiry: a new certificate"
    assert int(renewed["metadata"]["annotations"][EXPIRES]) > time.time() + 3000 * 86400
