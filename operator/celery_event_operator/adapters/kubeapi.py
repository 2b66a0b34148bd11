"""The few Kubernetes API calls the operator makes beside kopf's own (I/O, official client, sync).

Every call made here is listed in API_CALLS, which the chart's RBAC must grant, and nothing more.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import functools
import json
import os
from collections.abc import Callable, Generator, Iterator
from typing import Any, ParamSpec, TypeVar

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from celery_event_operator.core.api.metadata import GROUP, SERVICE_LABEL
from celery_event_operator.core.api.models import PLURAL, REPLAY_PLURAL, VERSION
from celery_event_operator.core.errors import (
    BrokerSecretError,
    KubeError,
    KubeForbiddenError,
    KubeUnavailableError,
    NotFoundError,
)

# (API group, resource, verb) of every call the operator process makes (kopf's included). The chart's rules
# grant exactly these (tests/unit/chart/test_chart.py), and every request of the running operator under the
# chart's RBAC on a real API server must be one of them (tests/integration/cluster/test_chart_rbac_on_cluster.py):
# a new call needs both an entry here and a rule in charts/celery-event-operator/templates/rbac.yaml.
# (`create_replay` and `read_replay` serve the command line, which runs with its user's credentials;
# `read_service` serves both.)
API_CALLS = (
    # kopf: watching and patching the resources (annotations, finalizers), their status, Events.
    ("celeryevents.io", "celeryeventservices", "list"),
    ("celeryevents.io", "celeryeventservices", "watch"),
    ("celeryevents.io", "celeryeventservices", "patch"),
    # (and the operator's own status writes: the counters and replica fields, between kopf's patches)
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
    # the labelled pods, listed and watched (adapters/pods.py): WorkersConfigured, the workers' lifecycle, and a
    # deleted pod's metric series gone at once
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

# A read the API did not answer is asked again after these pauses (or its Retry-After, up to the maximum).
READ_RETRY_PAUSES = (0.2, 0.6)
READ_RETRY_WAIT_MAX = 2.0
# The operator's calls in flight at once (threads, and the client's connections). A fleet applied at once makes
# about five calls per service: with 4, 1,000 services waited on the pool (Ready 53 s; 12: 49 s, bench/scale.py).
KUBE_API_THREADS = 12

WORKLOAD_PLURALS = {"Deployment": "deployments", "StatefulSet": "statefulsets"}
# The pods listed per request: a page of a few MB, however many pods the cluster has.
PODS_PAGE = 500


def failure(exc: ApiException, action: str, needs: str) -> KubeError:
    """An API error by what it means: the object is absent (404), the operator lacks a permission (403: `needs`
    names it), the API did not answer this time (429, 5xx: its fault, asked again later), anything else. The
    response body, which may echo data, stays out."""
    text = f"{action}: HTTP {exc.status} {exc.reason}"
    if exc.status == 404:
        return NotFoundError(text)
    if exc.status == 403:
        return KubeForbiddenError(f"{text}: the operator's RBAC lacks {needs}")
    if exc.status == 429 or exc.status >= 500:
        return KubeUnavailableError(text, retry_after=_retry_after(exc))
    return KubeError(text)


def _retry_after(exc: ApiException) -> float | None:
    value = (exc.headers or {}).get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _needs(verb: str, resource: str, namespace: str) -> str:
    """The permission a call needs, as a 403 names it: "`get` on secrets in namespace shop"."""
    return f"`{verb}` on {resource} in namespace {namespace}"


def _pods_needs(verb: str, namespace: str | None) -> str:
    return _needs(verb, "pods", namespace) if namespace is not None else f"`{verb}` on pods cluster-wide"


@contextlib.contextmanager
def _reported(action: str, needs: str) -> Iterator[None]:
    """An API failure as a KubeError naming the action; no answer at all (a timeout, a refused or broken
    connection) is the API's passing fault."""
    try:
        yield
    except ApiException as exc:
        raise failure(exc, action, needs) from None
    except urllib3.exceptions.HTTPError as exc:
        raise KubeUnavailableError(f"{action}: no answer ({type(exc).__name__})") from None


def _unless_absent(call: Callable[[], T], action: str, needs: str) -> T | None:
    """The call's result; None on 404; a KubeError naming the action otherwise."""
    try:
        with _reported(action, needs):
            return call()
    except NotFoundError:
        return None


def _object_unless_absent(call: Callable[[], object], what: str, needs: str) -> dict[str, Any] | None:
    """A custom-objects read: the object as a dict; None on 404; a KubeError otherwise."""
    found = _unless_absent(call, f"cannot read {what}", needs)
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
            _needs("get", "configmaps", namespace),
        )
        return None if configmap is None else dict(configmap.data or {})

    def write_configmap(self, namespace: str, body: dict[str, Any], *, exists: bool) -> None:
        name = body["metadata"]["name"]
        verb = "patch" if exists else "create"
        with _reported(f"cannot write ConfigMap {namespace}/{name}", _needs(verb, "configmaps", namespace)):
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
            _needs("get", f"{WORKLOAD_PLURALS[kind]}.apps", namespace),
        )
        if workload is None:
            return None
        template = (workload.get("spec") or {}).get("template") or {}
        return dict((template.get("metadata") or {}).get("annotations") or {})

    def annotate_template(self, namespace: str, kind: str, name: str, annotations: dict[str, str]) -> None:
        patch = {"spec": {"template": {"metadata": {"annotations": annotations}}}}
        needs = _needs("patch", f"{WORKLOAD_PLURALS[kind]}.apps", namespace)
        with _reported(f"cannot patch {kind} {namespace}/{name}", needs):
            self._custom.patch_namespaced_custom_object(
                "apps", "v1", namespace, WORKLOAD_PLURALS[kind], name, patch, _request_timeout=10
            )

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        # Gone meanwhile (404): nothing to keep on it.
        _unless_absent(
            lambda: self._core.patch_namespaced_pod(
                name, namespace, {"metadata": {"annotations": annotations}}, _request_timeout=10
            ),
            f"cannot annotate pod {namespace}/{name}",
            _needs("patch", "pods", namespace),
        )

    def evict_pod(self, namespace: str, name: str) -> bool:
        """Evict through the Eviction API: True when evicted (or already gone), False when a
        PodDisruptionBudget refuses it now (HTTP 429)."""
        body: Any = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        needs = _needs("create", "pods/eviction", namespace)
        try:
            with _reported(f"cannot evict pod {namespace}/{name}", needs):
                try:
                    self._core.create_namespaced_pod_eviction(name, namespace, body, _request_timeout=10)
                except ApiException as exc:
                    if exc.status == 429:  # a PodDisruptionBudget holds (or the API asks to wait): later
                        return False
                    raise
        except NotFoundError:
            return True
        return True

    def read_scale(self, namespace: str, kind: str, name: str) -> tuple[int, int] | None:
        """(desired, running) replicas of a Deployment or StatefulSet; None when it does not exist."""
        scale = _object_unless_absent(
            lambda: self._custom.get_namespaced_custom_object_scale(
                "apps", "v1", namespace, WORKLOAD_PLURALS[kind], name, _request_timeout=10
            ),
            f"the scale of {kind} {namespace}/{name}",
            _needs("get", f"{WORKLOAD_PLURALS[kind]}/scale.apps", namespace),
        )
        if scale is None:
            return None
        desired = int((scale.get("spec") or {}).get("replicas") or 0)
        return desired, int((scale.get("status") or {}).get("replicas") or 0)

    def set_scale(self, namespace: str, kind: str, name: str, replicas: int) -> None:
        needs = _needs("patch", f"{WORKLOAD_PLURALS[kind]}/scale.apps", namespace)
        with _reported(f"cannot scale {kind} {namespace}/{name}", needs):
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
            _needs("patch", f"{PLURAL}/status.{GROUP}", namespace),
        )

    def patch_replay_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        # Gone meanwhile (404, deleted while it ran): nothing to report on.
        _unless_absent(
            lambda: self._custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, REPLAY_PLURAL, name, {"status": status}, _request_timeout=10
            ),
            f"cannot patch the status of replay {namespace}/{name}",
            _needs("patch", f"{REPLAY_PLURAL}/status.{GROUP}", namespace),
        )

    def create_replay(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        with _reported(
            f"cannot create a CeleryEventReplay in {namespace}", _needs("create", f"{REPLAY_PLURAL}.{GROUP}", namespace)
        ):
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
            _needs("get", f"{REPLAY_PLURAL}.{GROUP}", namespace),
        )
        if found is None:
            raise NotFoundError(f"CeleryEventReplay {namespace}/{name} was deleted")
        return found

    def ensure_peering(self, name: str, namespace: str | None) -> None:
        """The kopf peering object the replicas meet in: a ClusterKopfPeering, or a KopfPeering in `namespace`."""
        plural, kind = ("kopfpeerings", "KopfPeering") if namespace else ("clusterkopfpeerings", "ClusterKopfPeering")
        body = {"apiVersion": "kopf.dev/v1", "kind": kind, "metadata": {"name": name}}
        needs = _needs("create", f"{plural}.kopf.dev", namespace) if namespace else f"`create` on {plural}.kopf.dev"
        with _reported(f"cannot create the {kind} {name}", needs):
            try:
                if namespace:
                    self._custom.create_namespaced_custom_object(
                        "kopf.dev", "v1", namespace, plural, body, _request_timeout=10
                    )
                else:
                    self._custom.create_cluster_custom_object("kopf.dev", "v1", plural, body, _request_timeout=10)
            except ApiException as exc:
                if exc.status != 409:  # 409: it exists (another replica made it)
                    raise

    def list_services(self, namespace: str) -> list[dict[str, Any]]:
        """Every CeleryEventService of a namespace (the webhook's short deadline: a short timeout)."""
        needs = _needs("list", f"{PLURAL}.{GROUP}", namespace)
        with _reported(f"cannot list the CeleryEventServices of {namespace}", needs):
            listed = self._custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _request_timeout=3)
        items: list[dict[str, Any]] = listed.get("items") or [] if isinstance(listed, dict) else []
        return items

    def read_service(self, namespace: str, name: str) -> dict[str, Any]:
        with _reported(f"CeleryEventService {namespace}/{name}", _needs("get", f"{PLURAL}.{GROUP}", namespace)):
            body = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=10
            )
        if not isinstance(body, dict):
            raise KubeError(f"CeleryEventService {namespace}/{name}: the API answered with no object")
        return body

    def list_worker_pods(self, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        """The pods labelled with a service in `namespace` (None: every namespace), as the API serves them (no
        model objects: thousands of them), a page at a time; and the listing's resourceVersion, to watch from."""
        where = namespace or "every namespace"
        items: list[dict[str, Any]] = []
        more: str | None = None
        with _reported(f"cannot list the worker pods of {where}", _pods_needs("list", namespace)):
            while True:
                page = self._pods_call(namespace, limit=PODS_PAGE, _continue=more, _request_timeout=60)
                listed = json.loads(page.data)
                items += listed.get("items") or []
                more = (listed.get("metadata") or {}).get("continue") or None
                if more is None:
                    return items, str(listed["metadata"]["resourceVersion"])

    def watch_worker_pods(
        self, namespace: str | None, since: str, seconds: int
    ) -> Generator[dict[str, Any], None, None]:
        """The watch events of the labelled pods after resourceVersion `since` (bookmarks asked, to go on from a
        recent version), for `seconds` at most."""
        where = namespace or "every namespace"
        with _reported(f"cannot watch the worker pods of {where}", _pods_needs("watch", namespace)):
            response = self._pods_call(
                namespace,
                watch=True,
                resource_version=since,
                allow_watch_bookmarks=True,
                timeout_seconds=seconds,
                _request_timeout=seconds + 10,
            )
            try:
                for line in kubernetes.watch.watch.iter_resp_lines(response):
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if isinstance(event, dict):
                        yield event
            finally:
                response.close()
                response.release_conn()

    def _pods_call(self, namespace: str | None, **arguments: Any) -> Any:
        if namespace is None:
            return self._core.list_pod_for_all_namespaces(
                label_selector=SERVICE_LABEL, _preload_content=False, **arguments
            )
        return self._core.list_namespaced_pod(
            namespace, label_selector=SERVICE_LABEL, _preload_content=False, **arguments
        )

    @classmethod
    def from_environment(cls, watches: int = 1) -> KubeApi:
        """In a pod: its service account. Elsewhere: $KUBECONFIG (read now, not at import). `watches`: the threads
        that watch through this client beside the pool's (one per namespace the pods are watched in)."""
        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(
                config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration
            )
        # urllib3 would sleep out a 429's or 503's Retry-After on a thread of the small pool, however long, and ask
        # again after a read timeout (four times 10 s for one hung read): the reads' own retry (AsyncKubeApi.read)
        # waits on the event loop, and only as long as a pass may. A refused connection is still tried at once.
        configuration.retries = urllib3.util.Retry(total=3, read=0, respect_retry_after_header=False)
        # A connection kept for every thread that calls at once: the pool's, and each watch's of the pods.
        configuration.connection_pool_maxsize = KUBE_API_THREADS + watches
        return cls(kubernetes.client.ApiClient(configuration))

    def read_secret_data(self, namespace: str, name: str) -> dict[str, str]:
        """The Secret's keys whose values are UTF-8 text (others are left out); never log the result."""
        # Absent: the user's to fix (BrokerSecretInvalid); no answer, or no permission: the API's or the operator's.
        secret = _unless_absent(
            lambda: self._core.read_namespaced_secret(name, namespace, _request_timeout=10),
            f"cannot read Secret {namespace}/{name}",
            _needs("get", "secrets", namespace),
        )
        if secret is None:
            raise BrokerSecretError(f"Secret {namespace}/{name} does not exist")
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
            _needs("patch", f"{PLURAL}.{GROUP}", namespace),
        )


class AsyncKubeApi:
    """The operator's calls, off the event loop: on a small pool of its own (calls are short, with timeouts)."""

    def __init__(self, api: KubeApi, threads: int = KUBE_API_THREADS) -> None:
        self.api = api
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube-api")

    async def call(self, method: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`await kube.call(kube.api.read_scale, namespace, kind, name)`."""
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, functools.partial(method, *args, **kwargs)
        )

    async def read(self, method: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """A read, asked again after a short pause when the API did not answer (a blip the next try absorbs);
        KubeUnavailableError when it still does not, or asks for a longer wait than READ_RETRY_WAIT_MAX."""
        pauses = iter(READ_RETRY_PAUSES)
        while True:
            try:
                return await self.call(method, *args, **kwargs)
            except KubeUnavailableError as exc:
                pause = next(pauses, None)
                wait = exc.retry_after if exc.retry_after is not None else pause
                if pause is None or wait is None or wait > READ_RETRY_WAIT_MAX:
                    raise
                await asyncio.sleep(wait)

    def close(self) -> None:
        self._executor.shutdown(wait=False)
