"""Kubernetes RBAC, decided as the API server's RBAC authorizer decides it (pure).

`Policy.of(objects)` takes Roles, ClusterRoles, RoleBindings and ClusterRoleBindings as the API stores them
(a chart's rendered manifests, or the emulated API's own objects); `Policy.allows(identity, request)` is the
authorizer's answer for one request's attributes (`Request`, with the verb the API server derives from the
HTTP method: `verb_of`), and `forbidden_message` the text of the real 403. Rules match as Kubernetes matches
them: verbs, API groups and resources (`*`, `resource/subresource`, `*/subresource`), `resourceNames` for
requests with a name. A RoleBinding grants in its own namespace only, a ClusterRoleBinding everywhere
(cluster-scoped requests and lists across namespaces included). Subjects: users, groups and service
accounts. Not modelled: `nonResourceURLs` (discovery is open to every identity, as the system:discovery
binding of every cluster makes it) and ClusterRole aggregation (a ClusterRole with an aggregationRule
grants its own rules only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

RBAC_GROUP = "rbac.authorization.k8s.io"
Rule = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Identity:
    """Who a request comes from, as authentication leaves it: a user name and groups."""

    user: str
    groups: frozenset[str] = frozenset({"system:authenticated"})

    @classmethod
    def service_account(cls, namespace: str, name: str) -> Identity:
        """A pod's identity: its ServiceAccount's user name and groups."""
        return cls(
            f"system:serviceaccount:{namespace}:{name}",
            frozenset({"system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"}),
        )


@dataclasses.dataclass(frozen=True)
class Request:
    """The attributes the authorizer decides on (`namespace` "" for cluster scope or all namespaces)."""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def resource_path(self) -> str:
        """`resource/subresource`, as rules and messages name it."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def verb_of(method: str, *, named: bool, watch: bool) -> str:
    """The RBAC verb of an HTTP request on a resource, as the API server derives it."""
    if method == "GET":
        return "watch" if watch else "get" if named else "list"
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def rule_allows(rule: Rule, request: Request) -> bool:
    """One PolicyRule against one request (rbac/v1 helpers' VerbMatches, APIGroupMatches, ResourceMatches,
    ResourceNameMatches)."""
    verbs, groups = rule.get("verbs") or [], rule.get("apiGroups") or []
    if not ("*" in verbs or request.verb in verbs) or not ("*" in groups or request.group in groups):
        return False
    resources = rule.get("resources") or []
    wildcard_subresource = f"*/{request.subresource}" if request.subresource else None
    if not any(item in ("*", request.resource_path, wildcard_subresource) for item in resources):
        return False
    names = rule.get("resourceNames") or []
    return not names or request.name in names


def _applies(subject: Mapping[str, Any], identity: Identity, binding_namespace: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return name == identity.user
    if kind == "Group":
        return name in identity.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return f"system:serviceaccount:{namespace}:{name}" == identity.user
    return False


@dataclasses.dataclass(frozen=True)
class Policy:
    """A cluster's RBAC objects, by kind."""

    roles: Mapping[tuple[str, str], Sequence[Rule]]  # (namespace, name) → rules
    cluster_roles: Mapping[str, Sequence[Rule]]
    role_bindings: Sequence[Mapping[str, Any]]
    cluster_role_bindings: Sequence[Mapping[str, Any]]

    @classmethod
    def of(cls, objects: Iterable[Mapping[str, Any]]) -> Policy:
        """From manifests or stored objects of any kinds (those that are not RBAC's are left out)."""
        roles: dict[tuple[str, str], Sequence[Rule]] = {}
        cluster_roles: dict[str, Sequence[Rule]] = {}
        role_bindings, cluster_role_bindings = [], []
        for body in objects:
            if str(body.get("apiVersion", "")).split("/")[0] != RBAC_GROUP:
                continue
            meta = body.get("metadata") or {}
            kind = body.get("kind")
            if kind == "Role":
                roles[(meta.get("namespace") or "", meta.get("name") or "")] = body.get("rules") or []
            elif kind == "ClusterRole":
                cluster_roles[meta.get("name") or ""] = body.get("rules") or []
            elif kind == "RoleBinding":
                role_bindings.append(body)
            elif kind == "ClusterRoleBinding":
                cluster_role_bindings.append(body)
        return cls(roles, cluster_roles, role_bindings, cluster_role_bindings)

    def rules_for(self, identity: Identity, namespace: str) -> Iterator[Rule]:
        """Every rule that applies to `identity` for a request in `namespace` ("" : cluster scope)."""
        for binding in self.cluster_role_bindings:
            if any(_applies(s, identity, "") for s in binding.get("subjects") or []):
                yield from self.cluster_roles.get(binding.get("roleRef", {}).get("name", ""), [])
        if not namespace:
            return
        for binding in self.role_bindings:
            if (binding.get("metadata") or {}).get("namespace") != namespace:
                continue
            if not any(_applies(s, identity, namespace) for s in binding.get("subjects") or []):
                continue
            ref = binding.get("roleRef") or {}
            if ref.get("kind") == "ClusterRole":
                yield from self.cluster_roles.get(ref.get("name", ""), [])
            else:
                yield from self.roles.get((namespace, ref.get("name", "")), [])

    def allows(self, identity: Identity, request: Request) -> bool:
        return any(rule_allows(rule, request) for rule in self.rules_for(identity, request.namespace))

    def granted(self, identity: Identity, namespace: str) -> set[tuple[str, str, str]]:
        """(API group, resource, verb) of every rule's explicit entries for `identity` in `namespace` (wildcards
        as written): what a chart grants, to compare with what the code calls."""
        return {
            (group, resource, verb)
            for rule in self.rules_for(identity, namespace)
            for group in rule.get("apiGroups") or []
            for resource in rule.get("resources") or []
            for verb in rule.get("verbs") or []
        }


def forbidden_message(identity: Identity, request: Request) -> str:
    """The message of the API server's 403 for a request RBAC denies."""
    scope = f'in the namespace "{request.namespace}"' if request.namespace else "at the cluster scope"
    reason = (
        f'User "{identity.user}" cannot {request.verb} resource "{request.resource_path}" '
        f'in API group "{request.group}" {scope}'
    )
    return forbidden(request, reason)


def forbidden(request: Request, reason: str) -> str:
    """`<resource>[.<group>] ["<name>"] is forbidden: <reason>`, as apierrors.NewForbidden writes it."""
    resource = f"{request.resource}.{request.group}" if request.group else request.resource
    return (
        f'{resource} "{request.name}" is forbidden: {reason}' if request.name else f"{resource} is forbidden: {reason}"
    )
