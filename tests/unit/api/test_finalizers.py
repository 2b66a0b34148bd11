"""Each shard's finalizer, and the finalizers of this operator a shard takes off once its deletion is done."""

from __future__ import annotations

import jsonpatch
import kopf
import pytest

from celery_event_operator.core.api.metadata import FINALIZER, others_finalizers, shard_finalizer
from celery_event_operator.core.options import OperatorOptions
from celery_event_operator.handlers.finalizers import left_to_take_off, take_off


def test_one_shard_keeps_the_name_of_the_releases_before_sharding() -> None:
    assert OperatorOptions().finalizer == FINALIZER == "celeryevents.io/finalizer"


def test_every_shard_of_every_shard_count_has_a_name_of_its_own() -> None:
    names = [shard_finalizer(index, count) for count in (1, 2, 3, 4) for index in range(count)]
    assert len(set(names)) == len(names)
    assert shard_finalizer(1, 3) == "celeryevents.io/finalizer-shard-1-of-3"
    assert OperatorOptions(shard_index=1, shard_count=3).finalizer == shard_finalizer(1, 3)


@pytest.mark.parametrize(
    ("finalizers", "own", "others"),
    [
        pytest.param([], FINALIZER, [], id="none"),
        pytest.param([FINALIZER], FINALIZER, [], id="only-its-own"),
        pytest.param([FINALIZER, "example.com/keep"], shard_finalizer(0, 2), [FINALIZER], id="before-sharding"),
        pytest.param(
            [shard_finalizer(1, 2), shard_finalizer(0, 3), "kubernetes"],
            shard_finalizer(0, 3),
            [shard_finalizer(1, 2)],
            id="another-shard-count",
        ),
        pytest.param([shard_finalizer(0, 2)], FINALIZER, [shard_finalizer(0, 2)], id="back-to-one-shard"),
        pytest.param(["celeryevents.io/finalizer-of-someone"], FINALIZER, [], id="not-ours"),
    ],
)
def test_a_shard_takes_off_only_the_operators_finalizers_that_are_not_its_own(
    finalizers: list[str], own: str, others: list[str]
) -> None:
    assert others_finalizers(finalizers, own) == others


def meta(**fields: object) -> kopf.Meta:
    return kopf.Body({"metadata": {"name": "billing", "namespace": "shop", **fields}}).metadata


SHARD = OperatorOptions(shard_index=0, shard_count=2)
DELETING = "2026-01-01T00:00:00Z"


@pytest.mark.parametrize(
    ("event_type", "metadata", "left"),
    [
        pytest.param(None, meta(finalizers=[FINALIZER]), [], id="not-deleted"),
        pytest.param(
            "MODIFIED", meta(deletionTimestamp=DELETING, finalizers=[SHARD.finalizer, FINALIZER]), [], id="own-first"
        ),
        pytest.param("MODIFIED", meta(deletionTimestamp=DELETING, finalizers=[FINALIZER]), [FINALIZER], id="own-done"),
        pytest.param("MODIFIED", meta(deletionTimestamp=DELETING, finalizers=["kubernetes"]), [], id="none-ours"),
        pytest.param("DELETED", meta(deletionTimestamp=DELETING, finalizers=[FINALIZER]), [], id="gone"),
    ],
)
def test_the_others_finalizers_go_only_once_the_shards_own_deletion_is_done(
    event_type: str | None, metadata: kopf.Meta, left: list[str]
) -> None:
    assert left_to_take_off(event_type, metadata, SHARD) == left


def test_taking_off_removes_only_the_names_given() -> None:
    raw = {"metadata": {"finalizers": [FINALIZER, "kubernetes", shard_finalizer(1, 3)]}}
    patch = kopf.Patch(body=kopf.Body(raw))
    take_off(patch, [FINALIZER, shard_finalizer(1, 3)])
    patched = jsonpatch.apply_patch(raw, patch.as_json_patch())  # as kopf sends it to the API
    assert patched["metadata"]["finalizers"] == ["kubernetes"]
