from __future__ import annotations

from typing import Any

import pytest

from celery_event_devcluster import jsonpatch

DOC = {"metadata": {"resourceVersion": "7", "finalizers": ["a", "b"]}, "spec": {"x": 1}}


@pytest.mark.parametrize(
    ("operations", "expected"),
    [
        pytest.param([{"op": "add", "path": "/spec/y", "value": 2}], {**DOC, "spec": {"x": 1, "y": 2}}, id="add-key"),
        pytest.param(
            [{"op": "add", "path": "/metadata/finalizers/-", "value": "c"}],
            {**DOC, "metadata": {"resourceVersion": "7", "finalizers": ["a", "b", "c"]}},
            id="append",
        ),
        pytest.param(
            [{"op": "remove", "path": "/metadata/finalizers/0"}],
            {**DOC, "metadata": {"resourceVersion": "7", "finalizers": ["b"]}},
            id="remove-item",
        ),
        pytest.param([{"op": "replace", "path": "/spec/x", "value": 5}], {**DOC, "spec": {"x": 5}}, id="replace"),
        pytest.param(
            [{"op": "test", "path": "/metadata/resourceVersion", "value": "7"}, {"op": "remove", "path": "/spec"}],
            {"metadata": DOC["metadata"]},
            id="test-passes",
        ),
        pytest.param([{"op": "move", "from": "/spec/x", "path": "/spec/z"}], {**DOC, "spec": {"z": 1}}, id="move"),
        pytest.param([{"op": "add", "path": "/a~1b", "value": 1}], {**DOC, "a/b": 1}, id="escaped-pointer"),
    ],
)
def test_apply(operations: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    assert jsonpatch.apply(DOC, operations) == expected


@pytest.mark.parametrize(
    "operations",
    [
        pytest.param([{"op": "test", "path": "/metadata/resourceVersion", "value": "6"}], id="stale-test"),
        pytest.param([{"op": "remove", "path": "/spec/missing"}], id="remove-missing"),
        pytest.param([{"op": "add", "path": "/nope/deeper", "value": 1}], id="missing-parent"),
        pytest.param([{"op": "replace", "path": "/metadata/finalizers/5", "value": 1}], id="index-out-of-range"),
        pytest.param([{"op": "frobnicate", "path": "/spec"}], id="unknown-op"),
        pytest.param({"op": "add"}, id="not-a-list"),
    ],
)
def test_apply_rejects(operations: Any) -> None:
    with pytest.raises(jsonpatch.PatchError):
        jsonpatch.apply(DOC, operations)


def test_apply_is_all_or_nothing() -> None:
    original = {"spec": {"x": 1}}
    with pytest.raises(jsonpatch.PatchError):
        jsonpatch.apply(original, [{"op": "remove", "path": "/spec/x"}, {"op": "remove", "path": "/spec/x"}])
    assert original == {"spec": {"x": 1}}


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        pytest.param({"spec": {"y": 2}}, {**DOC, "spec": {"x": 1, "y": 2}}, id="merge-nested"),
        pytest.param({"spec": None}, {"metadata": DOC["metadata"]}, id="null-removes"),
        pytest.param(
            {"metadata": {"finalizers": []}},
            {**DOC, "metadata": {"resourceVersion": "7", "finalizers": []}},
            id="lists-replace",
        ),
    ],
)
def test_merge(patch: dict[str, Any], expected: dict[str, Any]) -> None:
    assert jsonpatch.merge(DOC, patch) == expected
