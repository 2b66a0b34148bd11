"""A Kubernetes API for the no-cluster dev mode and the tests: kmock's emulator with its gaps closed.

kmock 0.8 stores and serves objects, but a real `kopf run` and `kubectl` need more (measured):

* no `resourceVersion`/`uid`/`creationTimestamp`/`generation`: kopf's finalizer JSON-patch tests
  `resourceVersion`, the patch fails, and no handler ever runs;
* JSON-patch and PUT are not understood (a JSON-patch list is "merged" into the object), and a failed
  `test` gives 500 instead of 422;
* `metadata.namespace` is not filled from the URL;
* a POSTed CRD is stored but not served in discovery;
* every request is kept forever and re-scanned on each new one (latency grows to hundreds of ms);
* lists lack `kind`/`apiVersion`, watches are sent as application/octet-stream, and there is no
  Table rendering, so `kubectl get` fails or prints no printer columns.

This subclass keeps kmock's storage, discovery, routing and error rendering, and replaces the
object lifecycle (create/patch/replace/delete/list/watch) with one that does the above the way the
real API server does. What it takes from kmock's internals is confined to kmock_internals.py (exact pin in pyproject).
Opt-in (`access`, see access.py): RBAC for the identities of given bearer tokens, decided from the API's own
Roles, ClusterRoles and bindings (rbac.py), with the real 403 bodies, and the OwnerReferencesPermissionEnforcement
admission plugin (owner_references.py); every other caller is the administrator, unrestricted.
What it still does not emulate: other admission (webhooks, schema validation, CEL), owner-reference
garbage collection, strategic merge (treated as a JSON merge patch), PodDisruptionBudgets (an
eviction always deletes the pod), and protobuf beyond the Secrets and ConfigMaps kubectl creates (protobuf.py).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import copy
import dataclasses
import datetime
import json
import secrets
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import attrs
import kmock

from celery_event_devcluster import jsonpatch, kmock_internals, owner_references, printing, protobuf, rbac
from celery_event_devcluster.access import AccessControl, UnauthenticatedError
from celery_event_devcluster.kmock_internals import Bus

CRD_RESOURCE = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
HISTORY_EVENTS = 10_000
PROTOBUF, JSON = "application/vnd.kubernetes.protobuf", "application/json"
SECRET_RESOURCE = kmock.resource("", "v1", "secrets")


class UnprocessableEntityError(kmock.KubernetesError):
    pass


def _is_namespace_read(request: kmock.Request) -> bool:
    """GET /api/v1/namespaces/NAME, which kmock reads as the prefix of a namespaced path with no resource."""
    return (
        request.method == kmock.method.GET
        and request.namespace is not None
        and request.url.path.rstrip("/") == f"/api/v1/namespaces/{request.namespace}"
    )


def _status_response(exc: kmock.KubernetesError) -> aiohttp.web.Response:
    """The error as an API server writes it. kmock's own not-found errors tell how to declare things in kmock,
    and kmock adds a traceback to every error: a user of dev mode sees what a real cluster would say."""
    if isinstance(exc, kmock.KubernetesNotFoundError):
        code, reason, message = 404, "NotFound", "the server could not find the requested resource"
    else:
        code, reason, message = exc.status, exc.reason or "InternalError", exc.message or ""
    status = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure"}
    return aiohttp.web.json_response(
        status | {"message": message, "reason": reason, "details": exc.details or {}, "code": code}, status=code
    )


def _resource_of(request: kmock.Request) -> kmock.resource:
    if request.resource is None:
        raise kmock.KubernetesEndpointNotFoundError()
    return request.resource


def _attributes(request: kmock.Request) -> rbac.Request:
    """What the authorizer decides a request on."""
    resource = _resource_of(request)
    return rbac.Request(
        verb=rbac.verb_of(
            request.method.value if request.method else "",
            named=request.name is not None,
            watch=request.action == kmock.action.WATCH,
        ),
        group=resource.group or "",
        resource=str(resource.plural),
        subresource=request.subresource or "",
        namespace=request.namespace or "",
        name=request.name or "",
    )


def _forbidden(attributes: rbac.Request, message: str) -> kmock.KubernetesError:
    """A 403 as the API server sends it: the resource (not the subresource) and name in `details`."""
    details = {"name": attributes.name, "group": attributes.group, "kind": attributes.resource}
    return kmock.KubernetesError(
        status=403, reason="Forbidden", message=message, details={k: v for k, v in details.items() if v}
    )


def _object_key(request: kmock.Request, namespace: str | None, name: str) -> tuple[kmock.resource, str | None, str]:
    return (_resource_of(request), namespace, name)


def _expired(since: int, oldest: int) -> dict[str, Any]:
    """The watch event a real API server sends for a resourceVersion older than its history."""
    return {
        "type": "ERROR",
        "object": {
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "reason": "Expired",
            "code": 410,
            "message": f"too old resource version: {since} ({oldest})",
        },
    }


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _get_path(body: dict[str, Any], path: str) -> Any:
    node: Any = body
    for key in path.strip(".").split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _set_path(body: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.strip(".").split(".")
    node = body
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value


def _encode_string_data(secret: dict[str, Any]) -> None:
    """A Secret's write-only `stringData` is stored base64-encoded in `data`, and its type defaults to Opaque,
    as the API server does."""
    secret["type"] = secret.get("type") or "Opaque"
    string_data = secret.pop("stringData", None) or {}
    secret["data"] = {
        **(secret.get("data") or {}),
        **{key: base64.b64encode(value.encode()).decode() for key, value in string_data.items()},
    }


def _content_changed_outside_metadata(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """What bumps `generation`: any change but metadata and status (as for CRDs)."""
    keys = (set(old) | set(new)) - {"metadata", "status"}
    return any(old.get(key) != new.get(key) for key in keys)


def _field(obj: dict[str, Any], path: str) -> str:
    """A field by its dotted path (`involvedObject.name`), as a field selector compares it: "" when absent."""
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _matches_field_selector(obj: dict[str, Any], selector: str) -> bool:
    """`a.b=x` and `a.b!=x` terms: `metadata.name` from kubectl and kopf, `involvedObject.*` from kubectl
    describe (the Events of one object)."""
    for term in filter(None, (part.strip() for part in selector.split(","))):
        negated = "!=" in term
        key, _, value = term.replace("!=", "=").replace("==", "=").partition("=")
        if (_field(obj, key.strip()) == value.strip()) == negated:
            return False
    return True


def _matches_selectors(obj: dict[str, Any], params: Any) -> bool:
    return _matches_label_selector(obj, params.get("labelSelector", "")) and _matches_field_selector(
        obj, params.get("fieldSelector", "")
    )


def _matches_label_selector(obj: dict[str, Any], selector: str) -> bool:
    """Equality-based selectors only (`a=b,c!=d,e`): all the operator and kubectl -l need here."""
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, (part.strip() for part in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's KubernetesEmulator, made good enough for a real kopf operator and kubectl."""

    _revision: int = attrs.field(default=0, init=False)
    # The latest watch events of every resource, as the API server keeps a window of them: a watch that
    # starts at a resourceVersion from a list replays what happened since (a deletion in between included).
    _history: collections.deque[tuple[int, Any, dict[str, Any]]] = attrs.field(
        factory=lambda: collections.deque(maxlen=HISTORY_EVENTS), init=False
    )
    _crds: dict[str, dict[str, Any]] = attrs.field(factory=dict, init=False)
    # Our own lock over the object store: every object request is served by this class, none by kmock's.
    _store_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    # Whom it restricts (nobody by default) and what they asked.
    access: AccessControl = attrs.field(factory=AccessControl, init=False)
    # Every write served, by resource and subresource ("pods", "" / "celeryeventservices", "status"): what the
    # benchmarks report per kind.
    writes: collections.Counter[tuple[str, str]] = attrs.field(factory=collections.Counter, init=False)
    # How late watches bring each live event (0: at once), as an API server under load does: in order, every one.
    watch_delay_seconds: float = attrs.field(default=0.0, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.resources.load_bundled()  # pods, deployments, events, …: discovery of the builtins

    def _next_resource_version(self) -> str:
        self._revision += 1
        return str(self._revision)

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if raw_request.content_type == PROTOBUF:
            return await self._serve_protobuf(raw_request)
        try:
            return await super().__call__(raw_request)
        finally:
            kmock_internals.forget_served_requests(self)

    async def _serve_protobuf(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """kubectl sends built-in types as protobuf and does not fall back to JSON: a Secret or ConfigMap is
        decoded and served as the same request in JSON (sent to this API itself); any other type is refused
        with 415, as a real server refuses a type it cannot decode."""
        try:
            decoded = protobuf.decode(await raw_request.read())
        except protobuf.UnknownProtobufError as exc:
            return aiohttp.web.json_response(
                {
                    "apiVersion": "v1",
                    "kind": "Status",
                    "status": "Failure",
                    "reason": "UnsupportedMediaType",
                    "code": 415,
                    "message": f"the body of the request was in an unknown format - accepted media types: {JSON} "
                    f"({exc})",
                },
                status=415,
            )
        headers = {key: value for key, value in raw_request.headers.items() if key.lower() == "authorization"}
        async with (
            aiohttp.ClientSession() as session,
            session.request(raw_request.method, raw_request.url, json=decoded, headers=headers) as response,
        ):
            return aiohttp.web.Response(
                status=response.status, body=await response.read(), content_type=response.content_type
            )

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        try:
            return await self._serve(request)
        except kmock.KubernetesError as exc:
            return _status_response(exc)

    async def _serve(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """Objects are served here; discovery and anything else by kmock's reactions."""
        if _is_namespace_read(request):
            return aiohttp.web.json_response(await self._namespace(request))
        if request.resource is None or request.resource.plural is None:
            return await kmock_internals.serve_by_kmock(self, request)  # discovery: open to every identity
        self._authorize(request)
        if request.action == kmock.action.WATCH:
            return await self._watch(request)
        if request.method in (kmock.method.POST, kmock.method.PATCH, kmock.method.PUT, kmock.method.DELETE):
            self.writes[(request.resource.plural, request.subresource or "")] += 1
        if request.subresource == "scale" and request.name is not None:
            return aiohttp.web.json_response(await self._scale(request))
        if request.subresource == "eviction" and request.name is not None and request.method == kmock.method.POST:
            # The Eviction API without PodDisruptionBudgets (none are emulated): the pod is deleted.
            await self._delete(request)
            return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Success"}, status=201)
        if request.action == kmock.action.CREATE:
            return aiohttp.web.json_response(await self._create(request), status=201)
        if request.name is None:
            if request.method == kmock.method.GET:
                return aiohttp.web.json_response(await self._list(request))
        elif request.method == kmock.method.GET:
            return aiohttp.web.json_response(await self._fetch(request))
        elif request.method in (kmock.method.PATCH, kmock.method.PUT):
            return aiohttp.web.json_response(await self._update(request))
        elif request.method == kmock.method.DELETE:
            return aiohttp.web.json_response(await self._delete(request))
        raise kmock.KubernetesError(
            status=405, reason="MethodNotAllowed", message=f"{request.method} is not supported here"
        )

    # --- authentication, RBAC, admission ----------------------------------------------------

    def _requester(self, request: kmock.Request) -> rbac.Identity | None:
        """Who asks: None for the administrator (no credentials)."""
        headers = kmock_internals.aiohttp_request(request).headers  # case-insensitive, repeated ones kept
        try:
            return self.access.identify(
                headers.get("Authorization", ""),
                headers.get("Impersonate-User", ""),
                headers.getall("Impersonate-Group", []),
            )
        except UnauthenticatedError:
            raise kmock.KubernetesError(status=401, reason="Unauthorized", message="Unauthorized") from None

    def _policy(self) -> rbac.Policy:
        """The RBAC objects stored now (read on each request, as changes to them apply at once)."""
        return rbac.Policy.of(
            {**obj.raw, "apiVersion": f"{resource.group}/{resource.version}", "kind": self.resources[resource].kind}
            for (resource, _, _), obj in self.objects.items()
            if resource.group == rbac.RBAC_GROUP and not obj.deleted and resource in self.resources
        )

    def _authorize(self, request: kmock.Request) -> None:
        identity = self._requester(request)
        if identity is None:
            return
        attributes = _attributes(request)
        if not self._policy().allows(identity, attributes):
            self.access.record(identity, attributes, refused_by="RBAC")
            raise _forbidden(attributes, rbac.forbidden_message(identity, attributes))
        self.access.record(identity, attributes)

    def _rest_mappings(self, api_version: str, kind: str) -> list[owner_references.RestMapping]:
        group, _, version = api_version.rpartition("/")
        return [
            owner_references.RestMapping(group, str(resource.plural), bool(self.resources[resource].namespaced))
            for resource in self.resources
            if resource.group == group and resource.version == version and self.resources[resource].kind == kind
        ]

    def _admit(self, request: kmock.Request, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        """The enabled admission plugins on a restricted identity's create (`old` None) or update."""
        identity = self._requester(request)
        if identity is None or owner_references.NAME not in self.access.admission:
            return
        attributes = dataclasses.replace(_attributes(request), name=new["metadata"]["name"])
        refused = owner_references.denial(
            self._policy(), identity, attributes, new=new, old=old, rest_mapper=self._rest_mappings
        )
        if refused is not None:
            self.access.record(identity, attributes, refused_by=owner_references.NAME)
            raise _forbidden(attributes, refused)

    # --- object lifecycle -------------------------------------------------------------------

    def _stored(self, request: kmock.Request) -> kmock.Object:
        key = _object_key(request, request.namespace, request.name or "")
        if key not in self.objects or self.objects[key].deleted:
            resource = _resource_of(request)
            kind = f"{resource.plural}.{resource.group}" if resource.group else str(resource.plural)
            # As the API server says it (kubectl prints it as is): `configmaps "x" not found`.
            raise kmock.KubernetesError(status=404, reason="NotFound", message=f'{kind} "{request.name}" not found')
        return self.objects[key]

    def _bus(self, request: kmock.Request) -> Bus[Any]:
        return kmock_internals.change_bus(self, _resource_of(request))

    async def _publish(self, request: kmock.Request, kind: str, body: dict[str, Any]) -> None:
        """A watch event, kept in the history and sent to the live watches. A deletion has a resourceVersion
        of its own, as on a real API server."""
        event_body = copy.deepcopy(body)
        if kind == "DELETED":
            event_body["metadata"]["resourceVersion"] = self._next_resource_version()
        event = {"type": kind, "object": event_body}
        self._history.append((int(event_body["metadata"]["resourceVersion"]), _resource_of(request), event))
        await self._bus(request).put(event)

    def _keep_only_latest(self, obj: kmock.Object) -> None:
        # kmock keeps every version of every object; the latest is all the API serves.
        obj.history = [obj.last]

    async def _create(self, request: kmock.Request) -> dict[str, Any]:
        body = copy.deepcopy(request.data)
        if not isinstance(body, dict):
            raise UnprocessableEntityError(status=422, reason="Invalid", message="the body must be an object")
        meta = body.setdefault("metadata", {})
        if request.namespace is not None:
            meta["namespace"] = request.namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if not meta.get("name"):
            raise UnprocessableEntityError(status=422, reason="Invalid", message="metadata.name is required")
        async with self._store_lock:
            key = _object_key(request, meta.get("namespace"), meta["name"])
            if key in self.objects and not self.objects[key].deleted:
                raise kmock.KubernetesError(
                    status=409, reason="AlreadyExists", message=f"{meta['name']!r} already exists"
                )
            if request.resource == SECRET_RESOURCE:
                _encode_string_data(body)
            self._admit(request, body, None)
            meta.update(
                uid=str(uuid.uuid4()),
                creationTimestamp=_now(),
                resourceVersion=self._next_resource_version(),
                generation=1,
            )
            meta.pop("deletionTimestamp", None)
            if key in self.objects:
                self.objects[key].create(body)
                self._keep_only_latest(self.objects[key])
            else:
                self.objects[key] = body
            if request.resource == CRD_RESOURCE:
                self._serve_crd(body)
            await self._publish(request, "ADDED", body)
        return body

    async def _update(self, request: kmock.Request) -> dict[str, Any]:
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        async with self._store_lock:
            obj = self._stored(request)
            current = copy.deepcopy(obj.raw)
            try:
                if request.method == kmock.method.PUT:
                    proposed = copy.deepcopy(request.data)
                elif content_type == "application/json-patch+json":
                    proposed = jsonpatch.apply(current, request.data)
                else:  # merge-patch; strategic-merge is approximated by it
                    proposed = jsonpatch.merge(current, request.data)
            except jsonpatch.PatchError as exc:
                raise UnprocessableEntityError(status=422, reason="Invalid", message=str(exc)) from exc
            if not isinstance(proposed, dict):
                raise UnprocessableEntityError(status=422, reason="Invalid", message="the body must be an object")

            new = self._apply_subresource_rules(request, current, proposed)
            if request.resource == SECRET_RESOURCE:
                _encode_string_data(new)
            self._admit(request, new, current)
            if new == current:
                return current  # a no-op write changes nothing, not even resourceVersion
            meta = new["metadata"]
            if _content_changed_outside_metadata(current, new):
                meta["generation"] = int(current["metadata"].get("generation", 1)) + 1
            meta["resourceVersion"] = self._next_resource_version()
            obj.create(new)
            self._keep_only_latest(obj)
            if request.resource == CRD_RESOURCE:
                self._serve_crd(new)
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                obj.delete()
                await self._publish(request, "DELETED", new)
                self._forget_crd(request, new)
            else:
                await self._publish(request, "MODIFIED", new)
            return new

    def _apply_subresource_rules(
        self,
        request: kmock.Request,
        current: dict[str, Any],
        proposed: dict[str, Any],
    ) -> dict[str, Any]:
        """/status writes only status; the main resource cannot write status if it has /status."""
        if request.subresource == "status":
            new = copy.deepcopy(current)
            if "status" in proposed:
                new["status"] = proposed["status"]
            else:
                new.pop("status", None)
        else:
            new = proposed
            if self._has_status_subresource(request.resource):
                if "status" in current:
                    new["status"] = current["status"]
                else:
                    new.pop("status", None)
        # Identity and server-owned fields cannot be changed by a client.
        meta = new.setdefault("metadata", {})
        for field in ("name", "namespace", "uid", "creationTimestamp", "generation", "deletionTimestamp"):
            if field in current["metadata"]:
                meta[field] = current["metadata"][field]
        meta["resourceVersion"] = current["metadata"]["resourceVersion"]  # bumped by the caller on change
        return new

    def _has_status_subresource(self, resource: Any) -> bool:
        return resource in self.resources and "status" in self.resources[resource].subresources

    async def _delete(self, request: kmock.Request) -> dict[str, Any]:
        async with self._store_lock:
            obj = self._stored(request)
            body: dict[str, Any] = copy.deepcopy(obj.raw)
            meta = body["metadata"]
            if meta.get("deletionTimestamp"):
                return body
            if meta.get("finalizers"):
                meta["deletionTimestamp"] = _now()
                meta["resourceVersion"] = self._next_resource_version()
                obj.create(body)
                self._keep_only_latest(obj)
                await self._publish(request, "MODIFIED", body)
            else:
                obj.delete()
                await self._publish(request, "DELETED", body)
                self._forget_crd(request, body)
        return body

    # --- the scale subresource ------------------------------------------------------------

    def _scale_paths(self, request: kmock.Request) -> tuple[str, str, str | None]:
        """Where replicas live: the CRD's scale subresource paths, or a workload's own fields."""
        assert request.resource is not None
        key = f"{request.resource.group}/{request.resource.version}/{request.resource.plural}"
        if key in self._crds:
            scale = self._crds[key].get("subresources", {}).get("scale")
            if scale is None:
                raise kmock.KubernetesResourceNotFoundError()
            return scale["specReplicasPath"], scale["statusReplicasPath"], scale.get("labelSelectorPath")
        return ".spec.replicas", ".status.replicas", None

    def _scale_view(self, request: kmock.Request, body: dict[str, Any]) -> dict[str, Any]:
        spec_path, status_path, selector_path = self._scale_paths(request)
        if selector_path is not None:
            selector = _get_path(body, selector_path)
        else:
            labels = ((body.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
        meta = body["metadata"]
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                key: meta[key]
                for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if key in meta
            },
            "spec": {"replicas": _get_path(body, spec_path) or 0},
            "status": {"replicas": _get_path(body, status_path) or 0, **({"selector": selector} if selector else {})},
        }

    async def _scale(self, request: kmock.Request) -> dict[str, Any]:
        """GET, PATCH and PUT of /scale: a Scale view of spec.replicas, as the API server serves it."""
        if request.method == kmock.method.GET:
            async with self._store_lock:
                return self._scale_view(request, copy.deepcopy(self._stored(request).raw))
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        async with self._store_lock:
            obj = self._stored(request)
            current = copy.deepcopy(obj.raw)
            view = self._scale_view(request, current)
            try:
                if request.method == kmock.method.PUT:
                    proposed = request.data
                elif content_type == "application/json-patch+json":
                    proposed = jsonpatch.apply(view, request.data)
                else:
                    proposed = jsonpatch.merge(view, request.data)
                replicas = int(proposed["spec"]["replicas"])
            except (jsonpatch.PatchError, KeyError, TypeError, ValueError) as exc:
                raise UnprocessableEntityError(status=422, reason="Invalid", message=f"bad scale: {exc}") from exc
            if replicas == view["spec"]["replicas"]:
                return view
            new = copy.deepcopy(current)
            _set_path(new, self._scale_paths(request)[0], replicas)
            new["metadata"]["generation"] = int(current["metadata"].get("generation", 1)) + 1
            new["metadata"]["resourceVersion"] = self._next_resource_version()
            obj.create(new)
            self._keep_only_latest(obj)
            await self._publish(request, "MODIFIED", new)
            return self._scale_view(request, new)

    # --- CRDs -------------------------------------------------------------------------------

    def _serve_crd(self, crd: dict[str, Any]) -> None:
        """Make a created CRD's resource discoverable, listable and watchable, as the API server does."""
        spec = crd.get("spec", {})
        names = spec.get("names", {})
        for version in spec.get("versions", []):
            if not version.get("served", True):
                continue
            resource = kmock.resource(spec["group"], version["name"], names["plural"])
            self.resources[resource] = kmock.ResourceInfo(
                kind=names.get("kind"),
                singular=names.get("singular") or names.get("kind", "").lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                verbs={"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
                shortnames=set(names.get("shortNames", [])),
                categories=set(names.get("categories", [])),
                subresources=set(version.get("subresources", {})),
            )
            self._crds[f"{spec['group']}/{version['name']}/{names['plural']}"] = version

    def _forget_crd(self, request: kmock.Request, crd: dict[str, Any]) -> None:
        if request.resource != CRD_RESOURCE:
            return
        spec = crd.get("spec", {})
        for version in spec.get("versions", []):
            resource = kmock.resource(spec["group"], version["name"], spec["names"]["plural"])
            if resource in self.resources:
                del self.resources[resource]
            self._crds.pop(f"{spec['group']}/{version['name']}/{spec['names']['plural']}", None)

    # --- discovery --------------------------------------------------------------------------

    async def _serve_version(self, request: kmock.Request) -> dict[str, Any]:
        """An APIResourceList as the API server builds it: subresources get no short names."""
        assert request.resource is not None
        group, version = request.resource.group, request.resource.version
        entries: list[dict[str, Any]] = []
        for resource in self.resources:
            if resource.group != group or resource.version != version:
                continue
            info = self.resources[resource]
            entries.append(
                {
                    "name": resource.plural,
                    "singularName": info.singular or "",
                    "kind": info.kind,
                    "namespaced": bool(info.namespaced),
                    "verbs": sorted(info.verbs),
                    "shortNames": sorted(info.shortnames),
                    "categories": sorted(info.categories),
                }
            )
            for subresource in sorted(info.subresources):
                scale = subresource == "scale"
                entries.append(
                    {
                        "name": f"{resource.plural}/{subresource}",
                        "singularName": "",
                        "namespaced": bool(info.namespaced),
                        "verbs": ["get", "patch", "update"],
                        "kind": "Scale" if scale else info.kind,
                        **({"group": "autoscaling", "version": "v1"} if scale else {}),
                    }
                )
        if not entries and group:
            raise kmock.KubernetesResourceNotFoundError()
        return {
            "apiVersion": "v1",
            "kind": "APIResourceList",
            "groupVersion": f"{group}/{version}" if group else str(version),
            "resources": entries,
        }

    # --- reading ----------------------------------------------------------------------------

    def _select(self, request: kmock.Request) -> list[dict[str, Any]]:
        found = []
        for (resource, namespace, _name), obj in self.objects.items():
            if resource != request.resource or obj.deleted:
                continue
            if request.namespace is not None and namespace != request.namespace:
                continue
            if request.name is not None and _name != request.name:
                continue
            if not _matches_selectors(obj.raw, request.params):
                continue
            found.append(copy.deepcopy(obj.raw))
        found.sort(key=lambda item: (item["metadata"].get("namespace") or "", item["metadata"]["name"]))
        return found

    def _api_version_and_kind(self, request: kmock.Request) -> tuple[str, str]:
        assert request.resource is not None
        group, version = request.resource.group, request.resource.version
        api_version = f"{group}/{version}" if group else str(version)
        info = self.resources[request.resource] if request.resource in self.resources else kmock.ResourceInfo()
        kind = info.kind or str(request.resource.plural).capitalize()
        return api_version, kind

    def _wants_table(self, request: kmock.Request) -> bool:
        return "as=Table" in request.headers.get("Accept", "")

    def _printer_columns(self, request: kmock.Request) -> list[dict[str, Any]]:
        assert request.resource is not None
        key = f"{request.resource.group}/{request.resource.version}/{request.resource.plural}"
        if key in self._crds:
            columns: list[dict[str, Any]] = self._crds[key].get("additionalPrinterColumns", [])
            return columns
        return printing.BUILTIN_COLUMNS.get(str(request.resource.plural), [])

    def _table(self, request: kmock.Request, items: list[dict[str, Any]], revision: str) -> dict[str, Any]:
        assert request.resource is not None
        name_priority = printing.NAME_PRIORITY.get(str(request.resource.plural), 0)
        return printing.table(items, self._printer_columns(request), revision, name_priority)

    async def _list(self, request: kmock.Request) -> dict[str, Any]:
        if request.resource not in self.resources:
            raise kmock.KubernetesResourceNotFoundError()
        async with self._store_lock:
            items = self._select(request)
            revision = str(self._revision)
        api_version, kind = self._api_version_and_kind(request)
        if self._wants_table(request):
            return self._table(request, items, revision)
        return {
            "apiVersion": api_version,
            "kind": f"{kind}List",
            "metadata": {"resourceVersion": revision},
            "items": items,
        }

    async def _namespace(self, request: kmock.Request) -> dict[str, Any]:
        """A namespace: every one exists here (objects are created in any without creating it first), as kubectl
        asks after a 404 to tell a missing object from a missing namespace."""
        self._authorize(request)
        return {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": request.namespace},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }

    async def _fetch(self, request: kmock.Request) -> dict[str, Any]:
        async with self._store_lock:
            body: dict[str, Any] = copy.deepcopy(self._stored(request).raw)
        if self._wants_table(request):
            return self._table(request, [body], str(self._revision))
        return body

    async def _watch(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """Stream JSON lines: the objects changed since `resourceVersion`, then live events."""
        since = int(request.params.get("resourceVersion") or 0)
        timeout = float(request.params.get("timeoutSeconds") or 0) or None
        resource = _resource_of(request)
        async with self._store_lock:
            marker = await self._bus(request).mark()
            # Without a resourceVersion a watch starts with the whole state; with one, it replays the events
            # since then from the history, deletions included (kubectl delete watches from its list's version),
            # or says 410 Gone when that is older than the history, as a real API server does.
            if since == 0:
                backlog = [{"type": "ADDED", "object": obj} for obj in self._select(request)]
            elif len(self._history) == self._history.maxlen and since < self._history[0][0]:
                backlog = [_expired(since, self._history[0][0])]
            else:
                backlog = [
                    copy.deepcopy(event)
                    for version, kind, event in self._history
                    if version > since and kind == resource and self._wanted(request, event)
                ]
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(kmock_internals.aiohttp_request(request))
        try:
            for event in backlog:
                await response.write(json.dumps(event).encode() + b"\n")
            async with asyncio.timeout(timeout):
                async for event in self._live_events(request, marker):
                    await response.write(json.dumps(event).encode() + b"\n")
        except (TimeoutError, ConnectionError):
            pass  # the watch ends as a real one does: the client reconnects
        finally:
            await self._bus(request).unmark(marker)
        await response.write_eof()
        return response

    async def _live_events(self, request: kmock.Request, marker: Any) -> AsyncIterator[dict[str, Any]]:
        if not self.watch_delay_seconds:
            async for event in marker:
                if self._wanted(request, event):
                    yield event
            return
        # Each event is taken off the bus when it happens and written `watch_delay_seconds` later, in order.
        loop = asyncio.get_running_loop()
        due: asyncio.Queue[tuple[float, dict[str, Any] | None]] = asyncio.Queue()

        async def take() -> None:
            async for event in marker:
                if self._wanted(request, event):
                    due.put_nowait((loop.time() + self.watch_delay_seconds, event))
            due.put_nowait((loop.time(), None))  # the bus ended: so does the watch, after what it has

        taking = asyncio.ensure_future(take())
        try:
            while True:
                at, event = await due.get()
                if event is None:
                    return
                await asyncio.sleep(max(0.0, at - loop.time()))
                yield event
        finally:
            taking.cancel()

    @staticmethod
    def _wanted(request: kmock.Request, event: dict[str, Any]) -> bool:
        meta = event["object"].get("metadata", {})
        if request.namespace is not None and meta.get("namespace") != request.namespace:
            return False
        if request.name is not None and meta.get("name") != request.name:
            return False
        return _matches_selectors(event["object"], request.params)
