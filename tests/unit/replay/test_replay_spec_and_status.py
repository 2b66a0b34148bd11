"""What a replay selects, how it counts when it resumes, and what its status and Events say (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from celery_event_operator.core import naming
from celery_event_operator.core.archive import messages
from celery_event_operator.core.broker import address
from celery_event_operator.core.errors import InvalidSpecError
from celery_event_operator.core.replay import replay_spec, replay_status
from celery_event_operator.core.replay.slots import ReplaySlots, archive_key

CREATED_AT = 1_800_000_000.0  # 2027-01-15T08:00:00Z
NOW = CREATED_AT + 60


def body(
    spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None, generation: int = 1
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "retry",
            "namespace": "shop",
            "generation": generation,
            "creationTimestamp": replay_status.timestamp(CREATED_AT),
        },
        "spec": {"serviceRef": {"name": "billing"}, **(spec or {})},
        "status": status or {},
    }


def archived(event: str = "e", at: float = CREATED_AT - 600, task_id: str = "t-1") -> messages.Archived:
    headers = {"task": event, "id": task_id, naming.ARCHIVED_AT_HEADER: at, naming.EXCEPTION_HEADER: "TypeError: 4111"}
    return messages.describe(0, b'[[{"card": "4111"}], {}, {}]', headers, {}, event)


def test_understood_with_its_creation_time() -> None:
    replay = replay_spec.understand(body({"filter": {"events": ["e"]}}))
    assert (replay.namespace, replay.name, replay.service, replay.created_at) == (
        "shop",
        "retry",
        "billing",
        CREATED_AT,
    )
    assert not replay.purge
    assert replay.done_field == "replayed"
    assert replay_spec.understand(body({"action": "purge", "confirm": True})).done_field == "purged"


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        pytest.param(
            {"serviceRef": {"name": "billing", "namespace": "other"}}, "own namespace", id="another-namespace"
        ),
        pytest.param({"action": "purge"}, "set confirm: true", id="unconfirmed-purge"),
        pytest.param({"filter": {"taskIds": "t-1"}}, "filter.taskIds", id="malformed-filter"),
        pytest.param({"limit": 0}, "limit", id="zero-limit"),
    ],
)
def test_what_cannot_run_is_refused_with_a_reason(spec: dict[str, Any], text: str) -> None:
    refused = replay_spec.understand(body(spec))  # returned, as a service's understand returns it
    assert isinstance(refused, InvalidSpecError)
    assert text in str(refused)


def test_ages_count_back_from_the_creation_and_only_what_was_archived_before_the_start_is_taken() -> None:
    replay = replay_spec.understand(body({"filter": {"olderThanSeconds": 60, "newerThanSeconds": 3600}}))
    selection = replay.selection(started_at=NOW)
    assert selection.matches(archived(at=CREATED_AT - 600))
    assert not selection.matches(archived(at=CREATED_AT - 30)), "younger than olderThanSeconds at creation"
    assert not selection.matches(archived(at=CREATED_AT - 7200)), "older than newerThanSeconds at creation"
    unfiltered = replay_spec.understand(body()).selection(started_at=NOW)
    assert unfiltered.matches(archived(at=NOW - 1))
    assert not unfiltered.matches(archived(at=NOW)), "archived again once the replay started"


@pytest.mark.parametrize(("limit", "matched", "target"), [(None, 300, 300), (100, 300, 100), (500, 300, 300)])
def test_target(limit: int | None, matched: int, target: int) -> None:
    spec = {} if limit is None else {"limit": limit}
    assert replay_spec.understand(body(spec)).target(matched) == target


def test_a_resumed_replay_counts_what_is_no_longer_archived() -> None:
    assert replay_status.done_before(matched=5000, still_selected=3571) == 1429
    assert replay_status.done_before(matched=10, still_selected=12) == 0, "never negative"


def test_the_start_is_read_back_from_status_only_when_complete() -> None:
    status = {"startTime": replay_status.timestamp(NOW), "archived": 10, "matched": 4, "serviceName": "billing"}
    began = replay_status.started({**status, "observedGeneration": 1})
    assert began == replay_status.Started(NOW, 10, 4, "billing", 1, None)
    # Begun without a count: its first walk counts (matched is written once known)
    assert replay_status.started({**status, "matched": None}) == replay_status.Started(
        NOW, 10, None, "billing", None, None
    )
    assert replay_status.started({**status, "archived": None}) is None
    assert replay_status.started({}) is None
    assert replay_status.spec_changed(2, began)
    assert not replay_status.spec_changed(1, began)


def test_start_time_is_a_millisecond_read_back_exactly() -> None:
    assert replay_status.start_time(NOW + 0.9) == NOW + 0.9
    assert replay_status.start_time(NOW + 0.1234) == NOW + 0.123
    for offset in range(0, 100_000, 7):  # written and read back, the same number (a resume selects the same events)
        began = replay_status.start_time(NOW + offset / 1000 + 0.0004)
        assert replay_spec.parse_time(replay_status.start_timestamp(began)) == began
    assert replay_status.start_timestamp(NOW + 0.05) == replay_status.timestamp(NOW)[:-1] + ".050Z"


@pytest.mark.parametrize(
    ("conditions", "finished"),
    [
        pytest.param([], False, id="new"),
        pytest.param([{"type": "Succeeded", "status": "Unknown"}], False, id="running-or-waiting"),
        pytest.param([{"type": "Succeeded", "status": "True"}], True, id="succeeded"),
        pytest.param([{"type": "Succeeded", "status": "False"}], True, id="failed"),
    ],
)
def test_finished(conditions: list[dict[str, Any]], finished: bool) -> None:
    assert replay_status.finished({"conditions": conditions}) is finished


def test_status_shows_names_and_ids_never_arguments() -> None:
    view = replay_status.message_view(archived())
    assert view == {
        "event": "e",
        "taskId": "t-1",
        "exception": "TypeError",
        "archivedAt": replay_status.timestamp(CREATED_AT - 600),
    }
    assert "4111" not in str(view)
    assert replay_status.message_view(None) is None


def test_a_run_from_start_to_end() -> None:
    replay = replay_spec.understand(body({"filter": {"events": ["e"]}, "limit": 250, "ratePerSecond": 50}))
    start = replay_status.begun([], replay, service_name="billing", started_at=NOW, archived=1000, matched=300)
    assert start.status_patch | {"conditions": None} == {
        "observedGeneration": 1,
        "serviceName": "billing",
        "startTime": replay_status.timestamp(NOW)[:-1] + ".000Z",
        "archived": 1000,
        "matched": 300,
        "replayed": 0,
        "skipped": 0,
        "remaining": 250,
        "conditions": None,
    }
    [running] = start.status_patch["conditions"]
    assert (running["type"], running["status"], running["reason"]) == ("Succeeded", "Unknown", "Running")
    [started] = start.events
    assert (started.type, started.reason) == ("Normal", "Started")
    assert "300 of 1000 archived events selected (events e; at most 250; 50/s), 250 to take" in started.message

    counters = replay_status.progressed(
        replay, matched=300, done=100, unroutable=2, first={"event": "e"}, last={"event": "e"}
    )
    assert (counters["replayed"], counters["skipped"], counters["remaining"]) == (100, 2, 148)

    end = replay_status.ended(
        start.status_patch["conditions"],
        replay,
        service_name="billing",
        archived=1000,
        matched=300,
        done=250,
        last={"event": "e"},
        now=NOW + 5,
    )
    [condition] = end.status_patch["conditions"]
    assert (condition["status"], condition["reason"]) == ("True", "Replayed")
    assert (end.status_patch["replayed"], end.status_patch["skipped"], end.status_patch["remaining"]) == (250, 50, 0)
    assert end.status_patch["completionTime"] == replay_status.timestamp(NOW + 5)
    assert condition["message"] == (
        "250 of 300 selected archived events of billing sent back to its handler queues; 50 skipped (beyond the "
        "limit, or no queue takes them) stay archived; 700 other archived events were not selected"
    )
    assert [(note.type, note.reason) for note in end.events] == [("Normal", "Replayed")]


def test_a_purge_counts_purged() -> None:
    replay = replay_spec.understand(body({"action": "purge", "confirm": True}))
    start = replay_status.begun([], replay, service_name="billing", started_at=NOW, archived=10, matched=10)
    assert start.status_patch["purged"] == 0
    assert "replayed" not in start.status_patch
    end = replay_status.ended([], replay, service_name="billing", archived=10, matched=10, done=10, last=None, now=NOW)
    assert end.status_patch["conditions"][0]["reason"] == "Purged"
    assert "purged from the archive" in end.status_patch["conditions"][0]["message"]


def test_a_dry_run_lists_what_would_go_bounded() -> None:
    replay = replay_spec.understand(body({"dryRun": True, "action": "purge"}))
    sample = [archived(task_id=f"t-{n}") for n in range(3)]
    end = replay_status.dry_run_ended([], replay, service_name="billing", matched=40, preview=sample, now=NOW)
    assert [item["taskId"] for item in end.status_patch["preview"]] == ["t-0", "t-1", "t-2"]
    [condition] = end.status_patch["conditions"]
    assert (condition["status"], condition["reason"]) == ("True", "DryRun")
    assert condition["message"].startswith("would purge 40 of 40 selected archived events of billing; nothing was")


def test_waiting_keeps_its_transition_time_and_follows_the_spec_only_before_the_start() -> None:
    replay = replay_spec.understand(body())
    first = replay_status.waiting([], replay, replay_status.SERVICE_NOT_READY, "not Ready", began=None, now=NOW)
    later = replay_status.waiting(
        first.status_patch["conditions"],
        replay,
        replay_status.WAITING_FOR_REPLAY,
        "b goes first",
        began=None,
        now=NOW + 30,
    )
    assert later.status_patch["conditions"][0]["lastTransitionTime"] == replay_status.timestamp(NOW), "still Unknown"
    assert later.status_patch["observedGeneration"] == 1
    assert later.events == (), "waiting posts no Event"
    began = replay_status.Started(NOW, 1, 1, "billing", 1, None)
    resumed = replay_status.waiting([], replay, replay_status.BROKER_UNAVAILABLE, "down", began=began, now=NOW)
    assert "observedGeneration" not in resumed.status_patch, "the generation it started with stays"


def test_refused_and_failed_end_with_one_warning() -> None:
    refused = replay_status.refused([], 1, InvalidSpecError("invalid spec: x"), now=NOW)
    [condition] = refused.status_patch["conditions"]
    assert (condition["status"], condition["reason"]) == ("False", "InvalidSpec")
    assert condition["message"] == "invalid spec: x; nothing was touched"
    assert [(note.type, note.reason) for note in refused.events] == [("Warning", "InvalidSpec")]
    many = InvalidSpecError("; ".join(f"filter.taskIds.{n}: too long" for n in range(1000)))
    bounded = replay_status.refused([], 1, many, now=NOW)
    assert len(bounded.status_patch["conditions"][0]["message"]) < 1000, "a thousand problems, a bounded message"
    assert len(bounded.events[0].message) < 1000
    failed = replay_status.failed([], 2, "SpecChanged", "changed", now=NOW)
    assert failed.status_patch["completionTime"] == replay_status.timestamp(NOW)
    assert [(note.type, note.reason) for note in failed.events] == [("Warning", "SpecChanged")]


def test_one_running_replay_per_archive_the_oldest_waiting_first() -> None:
    slots = ReplaySlots()
    billing, shipping = ("rabbit:5672", "shop", "billing"), ("rabbit:5672", "shop", "shipping")
    slots.wait(billing, "later", 20.0)
    slots.wait(billing, "earlier", 10.0)
    slots.wait(shipping, "other", 30.0)
    assert slots.take(billing, "later") == "earlier", "the oldest goes first"
    assert slots.take(billing, "earlier") is None
    assert slots.take(billing, "later") == "earlier", "running"
    assert slots.take(billing, "earlier") is None, "the holder may take it again"
    assert slots.take(shipping, "other") is None, "another service's replay runs meanwhile"
    slots.leave(billing, "earlier")
    assert slots.take(billing, "later") is None
    slots.release(billing, "later")
    slots.leave(billing, "later")
    slots.leave(shipping, "other")
    assert slots._running == {}, "nothing kept for replays that went"
    assert slots._waiting == {}


def test_an_archive_is_keyed_by_what_the_broker_holds_not_by_the_resource() -> None:
    """Two resources (any namespaces) with one serviceName on one vhost replay one archive: one slot."""
    key = archive_key(address.parse("amqp://alice:a@Rabbit:5672/shop"), "billing")
    assert key == archive_key(address.parse("amqp://bob:b@rabbit/shop"), "billing"), "credentials do not matter"
    assert key == ("rabbit:5672", "shop", "billing")
    assert key != archive_key(address.parse("amqp://alice:a@rabbit:5672/shop2"), "billing")
    assert key != archive_key(address.parse("amqp://alice:a@rabbit:5672/shop"), "shipping")
    failover = archive_key(address.parse("amqp://u:p@b:5672/v;amqp://u:p@a:5672/v"), "billing")
    assert failover == archive_key(address.parse("amqp://u:p@a:5672/v;amqp://u:p@b:5672/v"), "billing")
