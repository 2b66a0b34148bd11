"""Who the emulated API restricts, and what they asked (opt-in, pure).

By default every caller of the emulated API is its administrator (the dev kubeconfig carries no
credentials), as before. `AccessControl.restrict(token, identity)` makes requests that carry that bearer
token come from `identity`, and the administrator may impersonate anyone (`kubectl --as=… --as-group=…`;
kubectl sends no bearer token over plain HTTP): the emulator then authorizes such requests with RBAC from
its own Roles, ClusterRoles and bindings (as a real API server reads them from itself), runs the admission
plugins named in `admission` on their writes, and counts what they asked (`asked`: bounded by the API's
surface, names left out). An unknown token is refused (401), as authentication refuses it.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from celery_event_devcluster.rbac import Identity, Request


class UnauthenticatedError(Exception):
    """A bearer token nobody was given: the API answers 401."""


@dataclasses.dataclass(frozen=True)
class Asked:
    """One kind of request of one identity, and the answer (no object names: the count stays bounded)."""

    user: str
    verb: str
    group: str
    resource: str  # resource/subresource
    namespace: str
    refused_by: str = ""  # "RBAC", or the admission plugin that refused it; "" when served

    @property
    def call(self) -> tuple[str, str, str]:
        """(API group, resource, verb), as kubeapi.API_CALLS lists the operator's calls."""
        return (self.group, self.resource, self.verb)


@dataclasses.dataclass
class AccessControl:
    identities: dict[str, Identity] = dataclasses.field(default_factory=dict)  # bearer token → identity
    admission: set[str] = dataclasses.field(default_factory=set)  # enabled plugins (owner_references.NAME)
    asked: collections.Counter[Asked] = dataclasses.field(default_factory=collections.Counter)

    def restrict(self, token: str, identity: Identity) -> None:
        self.identities[token] = identity

    def identify(
        self, authorization: str, impersonate_user: str = "", impersonate_groups: Sequence[str] = ()
    ) -> Identity | None:
        """Who a request comes from, by its Authorization and Impersonate-* headers; None for the unrestricted
        administrator."""
        if authorization:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or token.strip() not in self.identities:
                raise UnauthenticatedError()
            return self.identities[token.strip()]
        if not impersonate_user:
            return None
        if impersonate_groups:
            return Identity(impersonate_user, frozenset({*impersonate_groups, "system:authenticated"}))
        # As the API server's impersonation does: a service account's user name brings its groups.
        prefix, _, rest = impersonate_user.partition("system:serviceaccount:")
        namespace, _, name = rest.partition(":")
        if not prefix and namespace and name:
            return Identity.service_account(namespace, name)
        return Identity(impersonate_user)

    def record(self, identity: Identity, request: Request, refused_by: str = "") -> None:
        key = Asked(identity.user, request.verb, request.group, request.resource_path, request.namespace, refused_by)
        self.asked[key] += 1
