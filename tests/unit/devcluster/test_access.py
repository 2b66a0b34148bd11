"""Who the emulated API restricts (pure): bearer tokens it was given, impersonation, everyone else unrestricted."""

from __future__ import annotations

import pytest

from celery_event_devcluster.access import AccessControl, UnauthenticatedError
from celery_event_devcluster.rbac import Identity, Request

OPERATOR = Identity.service_account("operators", "ceo")


@pytest.mark.parametrize(
    ("authorization", "user", "groups", "expected"),
    [
        pytest.param("", "", (), None, id="no-credentials-is-the-administrator"),
        pytest.param("Bearer t0k3n", "", (), OPERATOR, id="a-given-token"),
        pytest.param("bearer t0k3n", "", (), OPERATOR, id="scheme-in-any-case"),
        pytest.param("", "system:serviceaccount:operators:ceo", (), OPERATOR, id="impersonated-service-account"),
        pytest.param("", "jane", (), Identity("jane"), id="impersonated-user"),
        pytest.param(
            "", "jane", ("devs",), Identity("jane", frozenset({"devs", "system:authenticated"})), id="with-groups"
        ),
    ],
)
def test_identities(authorization: str, user: str, groups: tuple[str, ...], expected: Identity | None) -> None:
    access = AccessControl()
    access.restrict("t0k3n", OPERATOR)
    assert access.identify(authorization, user, groups) == expected


@pytest.mark.parametrize("authorization", ["Bearer other", "Basic dXNlcjpwYXNz"])
def test_credentials_nobody_gave_are_refused(authorization: str) -> None:
    access = AccessControl()
    access.restrict("t0k3n", OPERATOR)
    with pytest.raises(UnauthenticatedError):
        access.identify(authorization)


def test_what_was_asked_is_counted_without_names() -> None:
    access = AccessControl()
    for name in ("a", "b", "c"):
        access.record(OPERATOR, Request("get", "", "secrets", namespace="shop", name=name))
    access.record(OPERATOR, Request("create", "", "pods", "eviction", "shop", "p"), refused_by="RBAC")
    assert {(asked.call, asked.refused_by): count for asked, count in access.asked.items()} == {
        (("", "secrets", "get"), ""): 3,
        (("", "pods/eviction", "create"), "RBAC"): 1,
    }
