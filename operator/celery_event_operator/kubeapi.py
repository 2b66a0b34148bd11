"""The few Kubernetes API calls the operator makes beside kopf's own (I/O, official client, sync).

Every call made here is listed in API_CALLS, which the chart's RBAC must grant, and nothing more.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar

import kubernetes
from kubernetes.client.exceptions import ApiException

from celery_event_operator.api.metadata import GROUP
from celery_event_operator.api.models import PLURAL, REPLAY_PLURAL, VERSION
from celery_event_operator.errors import BrokerSecretError, KubeError, NotFoundError

# (API group, resource, verb) of every call the operator process makes (kopf's included). The chart's rules
# grant exactly these (tests/unit/chart/test_chart.py), and every request of the running operator under the
# chart's RBAC must be one of them (tests/integration/test_chart_rbac.py): a new call needs both an entry here
# and a rule in charts/celery-event-operator/templates/rbac.yaml. (`read_service`, `create_replay` and
# `read_replay` serve the command line, which runs with its user's credentials.)
API_CALLS = (
    # kopf: watching and patching the resources (annotations, finalizers), their status, Events.
    ("celeryevents.io", "celeryeventservices", "list"),
    ("celeryevents.io", "celeryeventservices", "watch"),
    ("celeryevents.io", "celeryeventservices", "patch"),
    ("celeryevents.io", "celeryeventservices/status", "patch"),
    ("", "events", "create"),
    # this module: the broker URL of each service.
    ("", "secrets", "get"),
    # the settings ConfigMap of each service (owned by the resource)
    ("", "configmaps", "get"),
    ("", "configmaps", "create"),
    ("", "configmaps", "patch"),
    # rollout on change: the settings hash stamped on the workers' pod template
    ("apps", "deployments", "get"),
    ("apps", "deployments", "patch"),
    ("apps", "statefulsets", "get"),
    ("apps", "statefulsets", "patch"),
    # WorkersConfigured: the service's pods and the settings they carry; kopf watches the labelled
    # pods for the metrics (a deleted pod's series go at once)
    ("", "pods", "list"),
    ("", "pods", "watch"),
    # healing: a pod that runs without the current settings, or a stuck worker, is evicted (PodDisruptionBudgets
    # hold); the workers' deletion cost (controller.kubernetes.io/pod-deletion-cost) is kept on their pods
    ("", "pods/eviction", "create"),
    ("", "pods", "patch"),
    # replicas (--peering): the kopf peering object, made by the first replica (kopf lists, watches and
    # patches it; a namespaced operator uses a KopfPeering per namespace, a cluster-wide one a ClusterKopfPeering)
    ("kopf.dev", "clusterkopfpeerings", "create"),
    ("kopf.dev", "clusterkopfpeerings", "list"),
    ("kopf.dev", "clusterkopfpeerings", "watch"),
    ("kopf.dev", "clusterkopfpeerings", "patch"),
    ("kopf.dev", "kopfpeerings", "create"),
    ("kopf.dev", "kopfpeerings", "list"),
    ("kopf.dev", "kopfpeerings", "watch"),
    ("kopf.dev", "kopfpeerings", "patch"),
    # autoscaling and spec.workers.replicas: the workers' replicas through /scale
    ("apps", "deployments/scale", "get"),
    ("apps", "deployments/scale", "patch"),
    ("apps", "statefulsets/scale", "get"),
    ("apps", "statefulsets/scale", "patch"),
    # the counters and replica fields in status, written between kopf's patches
    ("celeryevents.io", "celeryeventservices/status", "patch"),
    # replays: kopf watches them (and keeps its finalizer on a running one); the operator writes their status
    # and reads the service each names, which must be Ready
    ("celeryevents.io", "celeryeventreplays", "list"),
    ("celeryevents.io", "celeryeventreplays", "watch"),
    ("celeryevents.io", "celeryeventreplays", "patch"),
    ("celeryevents.io", "celeryeventreplays/status", "patch"),
    ("celeryevents.io", "celeryeventservices", "get"),
)

T = TypeVar("T")
P = ParamSpec("P")

WORKLOAD_PLURALS = {"Deployment": "deployments", "StatefulSet": "statefulsets"}


@contextlib.contextmanager
def _reported(action: str) -> Iterator[None]:
    """An API failure as a KubeError naming the action (the response body, maybe with data, stays out)."""
    try:
        yield
    except ApiException as exc:
        raise KubeError(f"{action}: HTTP {exc.status} {exc.reason}") from None


def _unless_absent(call: Callable[[], T], action: str) -> T | None:
    """The call's result; None on 404; a KubeError naming the action otherwise."""
    try:
        return call()
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise KubeError(f"{action}: HTTP {exc.status} {exc.reason}") from None


def _object_unless_absent(call: Callable[[], object], what: str) -> dict[str, Any] | None:
    """A custom-objects read: the object as a dict; None on 404; a KubeError otherwise."""
    found = _unless_absent(call, f"cannot read {what}")
    if found is None:
        return None
    if not isinstance(found, dict):
        raise KubeError(f"cannot read {what}: the API answered with no object")
    return found


class KubeApi:
    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self._core = kubernetes.client.CoreV1Api(client)
        self._custom = kubernetes.client.CustomObjectsApi(client)

    def read_configmap_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """The ConfigMap's data, None when it does not exist."""
        configmap = _unless_absent(
            lambda: self._core.read_namespaced_config_map(name, namespace, _request_timeout=10),
            f"cannot read ConfigMap {namespace}/{name}",
        )
        return None if configmap is None else dict(configmap.data or {})

    def write_configmap(self, namespace: str, body: dict[str, Any], *, exists: bool) -> None:
        name = body["metadata"]["name"]
        with _reported(f"cannot write ConfigMap {namespace}/{name}"):
            if exists:
                self._core.patch_namespaced_config_map(name, namespace, {"data": body["data"]}, _request_timeout=10)
            else:
                manifest: Any = body  # the client accepts plain manifests where it declares its models
                self._core.create_namespaced_config_map(namespace, manifest, _request_timeout=10)

    def read_template_annotations(self, namespace: str, kind: str, name: str) -> dict[str, str] | None:
        """The pod template annotations of a Deployment or StatefulSet; None when it does not exist."""
        workload = _object_unless_absent(
            lambda: self._custom.get_namespaced_custom_object(
                "apps", "v1", namespace, WORKLOAD_PLURALS[kind], name, _request_timeout=10
            ),
            f"{kind} {namespace}/{name}",
        )
        if workload is None:
            return None
        template = (workload.get("spec") or {}).get("template") or {}
        return dict((template.get("metadata") or {}).get("annotations") or {})

    def annotate_template(self, namespace: str, kind: str, name: str, annotations: dict[str, str]) -> None:
        patch = {"spec": {"template": {"metadata": {"annotations": annotations}}}}
        with _reported(f"cannot patch {kind} {namespace}/{name}"):
            self._custom.patch_namespaced_custom_object(
                "apps", "v1", namespace, WORKLOAD_PLURALS[kind], name, patch, _request_timeout=10
            )

    def list_pod_annotations(self, namespace: str, label_selector: str) -> list[dict[str, str]]:
        """The annotations of every pod matching the selector that is not being deleted."""
        with _reported(f"cannot list pods in {namespace}"):
            pods = self._core.list_namespaced_pod(namespace, label_selector=label_selector, _request_timeout=10)
        return [
            dict(pod.metadata.annotations or {})
            for pod in pods.items
            if pod.metadata is not None and pod.metadata.deletion_timestamp is None
        ]

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        # Gone meanwhile (404): nothing to keep on it.
        _unless_absent(
            lambda: self._core.patch_namespaced_pod(
                name, namespace, {"metadata": {"annotations": annotations}}, _request_timeout=10
            ),
            f"cannot annotate pod {namespace}/{name}",
        )

    def evict_pod(self, namespace: str, name: str) -> bool:
        """Evict through the Eviction API: True when evicted (or already gone), False when a
        PodDisruptionBudget refuses it now (HTTP 429)."""
        body: Any = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        try:
            self._core.create_namespaced_pod_eviction(name, namespace, body, _request_timeout=10)
        except ApiException as exc:
            if exc.status == 429:
                return False
            if exc.status == 404:
                return True
            raise KubeError(f"cannot evict pod {namespace}/{name}: HTTP {exc.status} {exc.reason}") from None
        return True

    def read_scale(self, namespace: str, kind: str, name: str) -> tuple[int, int] | None:
        """(desired, running) replicas of a Deployment or StatefulSet; None when it does not exist."""
        scale = _object_unless_absent(
            lambda: self._custom.get_namespaced_custom_object_scale(
                "apps", "v1", namespace, WORKLOAD_PLURALS[kind], name, _request_timeout=10
            ),
            f"the scale of {kind} {namespace}/{name}",
        )
        if scale is None:
            return None
        desired = int((scale.get("spec") or {}).get("replicas") or 0)
        return desired, int((scale.get("status") or {}).get("replicas") or 0)

    def set_scale(self, namespace: str, kind: str, name: str, replicas: int) -> None:
        with _reported(f"cannot scale {kind} {namespace}/{name}"):
            self._custom.patch_namespaced_custom_object_scale(
                "apps",
                "v1",
                namespace,
                WORKLOAD_PLURALS[kind],
                name,
                {"spec": {"replicas": replicas}},
                _request_timeout=10,
            )

    def patch_service_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        # Gone meanwhile (404): nothing to report on.
        _unless_absent(
            lambda: self._custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, {"status": status}, _request_timeout=10
            ),
            f"cannot patch the status of {namespace}/{name}",
        )

    def patch_replay_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        # Gone meanwhile (404, deleted while it ran): nothing to report on.
        _unless_absent(
            lambda: self._custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, REPLAY_PLURAL, name, {"status": status}, _request_timeout=10
            ),
            f"cannot patch the status of replay {namespace}/{name}",
        )

    def create_replay(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        with _reported(f"cannot create a CeleryEventReplay in {namespace}"):
            created = self._custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, REPLAY_PLURAL, body, _request_timeout=10
            )
        if not isinstance(created, dict):
            raise KubeError(f"cannot create a CeleryEventReplay in {namespace}: the API answered with no object")
        return created

    def read_replay(self, namespace: str, name: str) -> dict[str, Any]:
        found = _object_unless_absent(
            lambda: self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, REPLAY_PLURAL, name, _request_timeout=10
            ),
            f"CeleryEventReplay {namespace}/{name}",
        )
        if found is None:
            raise NotFoundError(f"CeleryEventReplay {namespace}/{name} was deleted")
        return found

    def ensure_peering(self, name: str, namespace: str | None) -> None:
        """The kopf peering object the replicas meet in: a ClusterKopfPeering, or a KopfPeering in `namespace`."""
        plural, kind = ("kopfpeerings", "KopfPeering") if namespace else ("clusterkopfpeerings", "ClusterKopfPeering")
        body = {"apiVersion": "kopf.dev/v1", "kind": kind, "metadata": {"name": name}}
        try:
            if namespace:
                self._custom.create_namespaced_custom_object(
                    "kopf.dev", "v1", namespace, plural, body, _request_timeout=10
                )
            else:
                self._custom.create_cluster_custom_object("kopf.dev", "v1", plural, body, _request_timeout=10)
        except ApiException as exc:
            if exc.status != 409:  # 409: it exists (another replica made it)
                raise KubeError(f"cannot create the {kind} {name}: HTTP {exc.status} {exc.reason}") from None

    def list_services(self, namespace: str) -> list[dict[str, Any]]:
        """Every CeleryEventService of a namespace (the webhook's short deadline: a short timeout)."""
        with _reported(f"cannot list the CeleryEventServices of {namespace}"):
            listed = self._custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _request_timeout=3)
        items: list[dict[str, Any]] = listed.get("items") or [] if isinstance(listed, dict) else []
        return items

    def read_service(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            body = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=10
            )
        except ApiException as exc:
            error = NotFoundError if exc.status == 404 else KubeError
            raise error(f"CeleryEventService {namespace}/{name}: HTTP {exc.status} {exc.reason}") from None
        if not isinstance(body, dict):
            raise KubeError(f"CeleryEventService {namespace}/{name}: the API answered with no object")
        return body

    @classmethod
    def from_environment(cls) -> KubeApi:
        """In a pod: its service account. Elsewhere: $KUBECONFIG (read now, not at import)."""
        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(
                config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration
            )
        return cls(kubernetes.client.ApiClient(configuration))

    def read_secret_data(self, namespace: str, name: str) -> dict[str, str]:
        """The Secret's keys whose values are UTF-8 text (others are left out); never log the result."""
        try:
            secret = self._core.read_namespaced_secret(name, namespace, _request_timeout=10)
        except ApiException as exc:
            if exc.status == 404:
                raise BrokerSecretError(f"Secret {namespace}/{name} does not exist") from None
            raise BrokerSecretError(f"cannot read Secret {namespace}/{name}: HTTP {exc.status} {exc.reason}") from None
        data: dict[str, str] = {}
        for key, encoded in (secret.data or {}).items():
            with contextlib.suppress(ValueError, UnicodeDecodeError, TypeError):
                data[key] = base64.b64decode(encoded, validate=True).decode()
        return data

    def patch_service_metadata(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        # Gone meanwhile (404): nothing to remember.
        _unless_absent(
            lambda: self._custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"annotations": annotations}}, _request_timeout=10
            ),
            f"cannot annotate {namespace}/{name}",
        )


class AsyncKubeApi:
    """The operator's calls, off the event loop: on a small pool of its own (calls are short, with timeouts)."""

    def __init__(self, api: KubeApi, threads: int = 4) -> None:
        self.api = api
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube-api")

    async def call(self, method: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`await kube.call(kube.api.read_scale, namespace, kind, name)`."""
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, functools.partial(method, *args, **kwargs)
        )

    def close(self) -> None:
        self._executor.shutdown(wait=False)
