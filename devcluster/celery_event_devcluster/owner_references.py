"""The API server's OwnerReferencesPermissionEnforcement admission plugin (pure), as OpenShift and clusters
that enable it run it (kubernetes plugin/pkg/admission/gc):

* changing an object's `ownerReferences` other than at its creation needs `delete` on the object;
* setting `blockOwnerDeletion: true` on a reference (new, or newly true) needs `update` on the owner's
  `finalizers` subresource (`<owner resource>/finalizers`, the owner's name, its namespace when namespaced).

`pods/status` is exempt, as in the plugin. The plugin's shortcut (a rule on `*/*` finalizers) is what the RBAC
rules already answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery_event_devcluster.rbac import Identity, Policy, Request, forbidden

NAME = "OwnerReferencesPermissionEnforcement"


@dataclasses.dataclass(frozen=True)
class RestMapping:
    """Where a kind is served (the API server's REST mapping)."""

    group: str
    resource: str
    namespaced: bool


# (apiVersion, kind) → the resources that serve that kind (none when it is not served)
RestMapper = Callable[[str, str], Sequence[RestMapping]]


def _references(body: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    if body is None:
        return []
    return list((body.get("metadata") or {}).get("ownerReferences") or [])


def _newly_blocking(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    before = {ref.get("uid"): ref for ref in _references(old)}
    return [
        ref
        for ref in _references(new)
        if ref.get("blockOwnerDeletion") is True
        and (ref.get("uid") not in before or before[ref.get("uid")].get("blockOwnerDeletion") is not True)
    ]


def denial(
    policy: Policy,
    identity: Identity,
    request: Request,
    *,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    rest_mapper: RestMapper,
) -> str | None:
    """The 403 message when the plugin refuses a create (`old` None) or an update of `new`; None when admitted."""
    if (request.group, request.resource, request.subresource) == ("", "pods", "status"):
        return None
    if old is not None and _references(old) == _references(new):
        return None
    if old is None and not _references(new):
        return None
    # The authorizer's reason and error on a denial: empty, and no error.
    if old is not None and not policy.allows(identity, dataclasses.replace(request, verb="delete")):
        return forbidden(request, "cannot set an ownerRef on a resource you can't delete: , <nil>")
    for ref in _newly_blocking(new, old):
        api_version, kind = str(ref.get("apiVersion", "")), str(ref.get("kind", ""))
        mappings = rest_mapper(api_version, kind)
        if not mappings:
            return forbidden(
                request,
                f"cannot set blockOwnerDeletion in this case because cannot find RESTMapping for APIVersion "
                f"{api_version} Kind {kind}: no matches for kind {kind!r} in version {api_version!r}",
            )
        for mapping in mappings:
            finalize = Request(
                verb="update",
                group=mapping.group,
                resource=mapping.resource,
                subresource="finalizers",
                namespace=request.namespace if mapping.namespaced else "",
                name=str(ref.get("name", "")),
            )
            if not policy.allows(identity, finalize):
                return forbidden(
                    request,
                    "cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set "
                    "finalizers on: , <nil>",
                )
    return None
