"""RBAC and the OwnerReferencesPermissionEnforcement plugin as the emulated API decides them (pure): the cases of
Kubernetes' own rule matching, binding scopes and subjects, and the exact texts of a real API server's 403s."""

from __future__ import annotations

from typing import Any

import pytest

from celery_event_devcluster import owner_references
from celery_event_devcluster.rbac import Identity, Policy, Request, forbidden_message, rule_allows, verb_of

OPERATOR = Identity.service_account("operators", "ceo")
GROUP = "rbac.authorization.k8s.io/v1"


def cluster_role(name: str, *rules: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": GROUP, "kind": "ClusterRole", "metadata": {"name": name}, "rules": list(rules)}


def role(namespace: str, name: str, *rules: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": GROUP,
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": list(rules),
    }


def binding(
    binding_kind: str, role_kind: str, role_name: str, namespace: str = "", subject: dict[str, str] | None = None
) -> dict[str, Any]:
    """Bound to OPERATOR unless `subject` says otherwise."""
    meta = {"name": f"to-{role_name}", **({"namespace": namespace} if namespace else {})}
    return {
        "apiVersion": GROUP,
        "kind": binding_kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role_name},
        "subjects": [subject or {"kind": "ServiceAccount", "name": "ceo", "namespace": "operators"}],
    }


def crb(subject: dict[str, str] | None = None) -> dict[str, Any]:
    return binding("ClusterRoleBinding", "ClusterRole", "r", subject=subject)


def rb(role_kind: str, namespace: str, subject: dict[str, str] | None = None) -> dict[str, Any]:
    return binding("RoleBinding", role_kind, "r", namespace, subject)


def rule(groups: list[str], resources: list[str], verbs: list[str], **extra: Any) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs, **extra}


@pytest.mark.parametrize(
    ("given", "request_", "allowed"),
    [
        pytest.param(rule([""], ["pods"], ["list"]), Request("list", "", "pods"), True, id="exact"),
        pytest.param(rule([""], ["pods"], ["list"]), Request("watch", "", "pods"), False, id="other-verb"),
        pytest.param(rule([""], ["pods"], ["*"]), Request("watch", "", "pods"), True, id="any-verb"),
        pytest.param(rule(["apps"], ["pods"], ["get"]), Request("get", "", "pods"), False, id="other-group"),
        pytest.param(rule(["*"], ["pods"], ["get"]), Request("get", "", "pods"), True, id="any-group"),
        pytest.param(
            rule(["apps"], ["deployments"], ["patch"]),
            Request("patch", "apps", "deployments", "scale"),
            False,
            id="a-resource-is-not-its-subresource",
        ),
        pytest.param(
            rule(["apps"], ["deployments/scale"], ["patch"]),
            Request("patch", "apps", "deployments", "scale"),
            True,
            id="subresource",
        ),
        pytest.param(
            rule(["apps"], ["*/scale"], ["patch"]),
            Request("patch", "apps", "statefulsets", "scale"),
            True,
            id="any-resource-of-a-subresource",
        ),
        pytest.param(
            rule([""], ["*"], ["create"]), Request("create", "", "pods", "eviction"), True, id="star-is-everything"
        ),
        pytest.param(
            rule([""], ["secrets"], ["get"], resourceNames=["rabbitmq"]),
            Request("get", "", "secrets", name="rabbitmq"),
            True,
            id="resource-name",
        ),
        pytest.param(
            rule([""], ["secrets"], ["get"], resourceNames=["rabbitmq"]),
            Request("get", "", "secrets", name="other"),
            False,
            id="other-resource-name",
        ),
        pytest.param(
            rule([""], ["secrets"], ["list"], resourceNames=["rabbitmq"]),
            Request("list", "", "secrets"),
            False,
            id="resource-names-never-allow-a-list",
        ),
    ],
)
def test_rules_match_as_kubernetes_matches_them(given: dict[str, Any], request_: Request, allowed: bool) -> None:
    assert rule_allows(given, request_) is allowed


PODS = rule([""], ["pods"], ["list"])


@pytest.mark.parametrize(
    ("objects", "namespace", "allowed"),
    [
        pytest.param([cluster_role("r", PODS), crb()], "", True, id="cluster-wide"),
        pytest.param(
            [cluster_role("r", PODS), crb()],
            "shop",
            True,
            id="cluster-wide-in-a-namespace",
        ),
        pytest.param([role("shop", "r", PODS), rb("Role", "shop")], "shop", True, id="role-in-its-ns"),
        pytest.param(
            [role("shop", "r", PODS), rb("Role", "shop")],
            "billing",
            False,
            id="role-elsewhere",
        ),
        pytest.param([role("shop", "r", PODS), rb("Role", "shop")], "", False, id="role-not-cluster"),
        pytest.param(
            [cluster_role("r", PODS), rb("ClusterRole", "shop")],
            "shop",
            True,
            id="cluster-role-bound-in-a-namespace",
        ),
        pytest.param(
            [cluster_role("r", PODS), rb("ClusterRole", "shop")],
            "billing",
            False,
            id="cluster-role-bound-in-another-namespace",
        ),
        pytest.param(
            [role("billing", "r", PODS), rb("Role", "shop")],
            "shop",
            False,
            id="role-of-another-namespace",
        ),
        pytest.param([cluster_role("r", PODS)], "", False, id="unbound"),
        pytest.param(
            [cluster_role("r", PODS), crb({"kind": "Group", "name": "x"})],
            "",
            False,
            id="other-group",
        ),
        pytest.param(
            [
                cluster_role("r", PODS),
                crb({"kind": "Group", "name": "system:serviceaccounts:operators"}),
            ],
            "",
            True,
            id="service-accounts-group",
        ),
        pytest.param(
            [cluster_role("r", PODS), crb({"kind": "User", "name": "ceo"})],
            "",
            False,
            id="a-user-is-not-the-service-account",
        ),
        pytest.param(
            [
                role("operators", "r", PODS),
                rb("Role", "operators", {"kind": "ServiceAccount", "name": "ceo"}),
            ],
            "operators",
            True,
            id="service-account-of-the-bindings-namespace",
        ),
        pytest.param(
            [
                cluster_role("r", PODS),
                crb({"kind": "ServiceAccount", "name": "ceo", "namespace": "x"}),
            ],
            "",
            False,
            id="service-account-of-another-namespace",
        ),
    ],
)
def test_bindings_grant_where_kubernetes_grants(objects: list[dict[str, Any]], namespace: str, allowed: bool) -> None:
    assert Policy.of(objects).allows(OPERATOR, Request("list", "", "pods", namespace=namespace)) is allowed


@pytest.mark.parametrize(
    ("method", "named", "watch", "verb"),
    [
        pytest.param("GET", True, False, "get", id="get"),
        pytest.param("GET", False, False, "list", id="list"),
        pytest.param("GET", False, True, "watch", id="watch"),
        pytest.param("POST", False, False, "create", id="create"),
        pytest.param("POST", True, False, "create", id="create-subresource"),
        pytest.param("PUT", True, False, "update", id="update"),
        pytest.param("PATCH", True, False, "patch", id="patch"),
        pytest.param("DELETE", True, False, "delete", id="delete"),
        pytest.param("DELETE", False, False, "deletecollection", id="deletecollection"),
    ],
)
def test_verbs_of_http_requests(method: str, named: bool, watch: bool, verb: str) -> None:
    assert verb_of(method, named=named, watch=watch) == verb


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        pytest.param(
            Request("list", "", "pods", namespace="default"),
            'pods is forbidden: User "system:serviceaccount:operators:ceo" cannot list resource "pods" in API group '
            '"" in the namespace "default"',
            id="list",
        ),
        pytest.param(
            Request("patch", "apps", "deployments", "scale", "shop", "w"),
            'deployments.apps "w" is forbidden: User "system:serviceaccount:operators:ceo" cannot patch resource '
            '"deployments/scale" in API group "apps" in the namespace "shop"',
            id="named-subresource",
        ),
        pytest.param(
            Request("create", "kopf.dev", "clusterkopfpeerings"),
            'clusterkopfpeerings.kopf.dev is forbidden: User "system:serviceaccount:operators:ceo" cannot create '
            'resource "clusterkopfpeerings" in API group "kopf.dev" at the cluster scope',
            id="cluster-scope",
        ),
    ],
)
def test_forbidden_messages_are_the_api_servers(request_: Request, message: str) -> None:
    assert forbidden_message(OPERATOR, request_) == message


CES_VERSION = "celeryevents.io/v1alpha1"


def rest_mapper(api_version: str, kind: str) -> list[owner_references.RestMapping]:
    if (api_version, kind) == (CES_VERSION, "CeleryEventService"):
        return [owner_references.RestMapping("celeryevents.io", "celeryeventservices", namespaced=True)]
    return []


def configmap(*references: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "billing-celery-events", "ownerReferences": list(references)}}


def owned_by(block: bool | None = None, kind: str = "CeleryEventService") -> dict[str, Any]:
    """A reference to the service `billing` (uid u1); `blockOwnerDeletion` only when `block` is given."""
    reference: dict[str, Any] = {"apiVersion": CES_VERSION, "kind": kind, "name": "billing", "uid": "u1"}
    return reference if block is None else reference | {"blockOwnerDeletion": block}


CONFIGMAPS = rule([""], ["configmaps"], ["get", "create", "patch"])
FINALIZERS = rule(["celeryevents.io"], ["celeryeventservices/finalizers"], ["update"])
NOT_FINALIZERS = (
    'configmaps "billing-celery-events" is forbidden: cannot set blockOwnerDeletion if an ownerReference refers to '
    "a resource you can't set finalizers on: , <nil>"
)
NOT_DELETE = (
    'configmaps "billing-celery-events" is forbidden: cannot set an ownerRef on a resource you can\'t delete: , <nil>'
)


@pytest.mark.parametrize(
    ("rules", "new", "old", "refused"),
    [
        pytest.param([CONFIGMAPS], configmap(owned_by()), None, None, id="create-owned"),
        pytest.param(
            [CONFIGMAPS], configmap(owned_by(block=False)), None, None, id="create-owned-not-blocking-explicitly"
        ),
        pytest.param([CONFIGMAPS], configmap(owned_by(block=True)), None, NOT_FINALIZERS, id="create-blocking"),
        pytest.param(
            [CONFIGMAPS, FINALIZERS], configmap(owned_by(block=True)), None, None, id="create-blocking-granted"
        ),
        pytest.param(
            [CONFIGMAPS, FINALIZERS | {"resourceNames": ["other"]}],
            configmap(owned_by(block=True)),
            None,
            NOT_FINALIZERS,
            id="finalizers-of-another-owner",
        ),
        pytest.param(
            [CONFIGMAPS, rule(["celeryevents.io"], ["celeryeventservices"], ["update", "delete"])],
            configmap(owned_by(block=True)),
            None,
            NOT_FINALIZERS,
            id="update-of-the-owner-is-not-its-finalizers",
        ),
        pytest.param(
            [CONFIGMAPS], configmap(owned_by(block=True)), configmap(owned_by(block=True)), None, id="update-unchanged"
        ),
        pytest.param([CONFIGMAPS], configmap(owned_by()), configmap(), NOT_DELETE, id="update-adds-a-reference"),
        pytest.param(
            [CONFIGMAPS | {"verbs": ["patch", "delete"]}],
            configmap(owned_by(block=True)),
            configmap(owned_by(block=False)),
            NOT_FINALIZERS,
            id="update-makes-it-blocking",
        ),
        pytest.param(
            [CONFIGMAPS | {"verbs": ["patch", "delete"]}],
            configmap(owned_by(block=False)),
            configmap(owned_by(block=True)),
            None,
            id="update-makes-it-non-blocking",
        ),
        pytest.param(
            [CONFIGMAPS],
            configmap(owned_by(block=True, kind="Unserved")),
            None,
            'configmaps "billing-celery-events" is forbidden: cannot set blockOwnerDeletion in this case because '
            "cannot find RESTMapping for APIVersion celeryevents.io/v1alpha1 Kind Unserved: no matches for kind "
            "'Unserved' in version 'celeryevents.io/v1alpha1'",
            id="unknown-kind",
        ),
    ],
)
def test_owner_references_permission_enforcement(
    rules: list[dict[str, Any]], new: dict[str, Any], old: dict[str, Any] | None, refused: str | None
) -> None:
    policy = Policy.of([role("shop", "r", *rules), rb("Role", "shop")])
    verb = "create" if old is None else "patch"
    request = Request(verb, "", "configmaps", namespace="shop", name="billing-celery-events")
    assert owner_references.denial(policy, OPERATOR, request, new=new, old=old, rest_mapper=rest_mapper) == refused


def test_pod_status_is_exempt() -> None:
    request = Request("patch", "", "pods", "status", "shop", "p")
    pod = {"metadata": {"name": "p", "ownerReferences": [owned_by(block=True)]}}
    assert (
        owner_references.denial(
            Policy.of([]), OPERATOR, request, new=pod, old={"metadata": {}}, rest_mapper=rest_mapper
        )
        is None
    )
