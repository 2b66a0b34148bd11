"""A replay on a broker whose management statistics lag far behind it (a loaded broker; here refreshed every
STATISTICS_SECONDS): another client takes part of the archive just after a refresh, so the statistics still say that
nobody holds anything. The replay must not count the rest as the whole archive: it waits (StatisticsBehind, then
ArchiveInUse once they show what is held) and, after the release, replays every selected event. A private RabbitMQ
node with its statistics interval set (rabbitmq.conf `collect_statistics_interval`), the real operator, the emulated
API."""

from __future__ import annotations

import asyncio
import pathlib
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from celery_event_operator.adapters.broker.management import QueueListing
from celery_event_operator.core.broker.address import parse
from tests.conftest import create_broker_secret
from tests.integration.replay.test_replay_honesty import reader_holding
from tests.integration.replay.test_replay_resource import (
    CANCELLED,
    CREATED,
    archive,
    create_replay,
    create_service,
    ended,
    ready,
    succeeded,
)
from tests.support.kube import EmulatedApi, eventually
from tests.support.operator_process import OperatorProcess
from tests.support.private_broker import PrivateRabbit

STATISTICS_SECONDS = 50  # well past the 20 s a replay asks the statistics before it gives up on their agreeing
HELD_SECONDS = 30


@pytest.fixture
def lagging_rabbit() -> Iterator[PrivateRabbit]:
    base = pathlib.Path(tempfile.mkdtemp(prefix="ceo-rabbit-"))
    node = PrivateRabbit(base, management=True, config=f"collect_statistics_interval = {STATISTICS_SECONDS * 1000}\n")
    try:
        yield node.start()
    finally:
        node.stop()
        shutil.rmtree(base, ignore_errors=True)


def listed_ready(rabbit: PrivateRabbit) -> int:
    async def ask() -> int:
        assert rabbit.management_url is not None
        listing = QueueListing(parse(rabbit.url), rabbit.management_url, None)
        try:
            return (await listing.queue("billing:archived")).ready
        finally:
            await listing.close()

    return asyncio.run(ask())


def test_a_replay_never_counts_on_statistics_that_lag_behind_a_client_holding_archived_events(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], lagging_rabbit: PrivateRabbit, tmp_path: pathlib.Path
) -> None:
    create_broker_secret(kube_api, lagging_rabbit.url, managementURL=lagging_rabbit.management_url or "")
    operator = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log").start()
    try:
        create_service(kube_api)
        ready(kube_api)
        ids = archive(lagging_rabbit.url, {CREATED: 700, CANCELLED: 300})
        # Just after the statistics showed the archive whole: the next refresh is STATISTICS_SECONDS away.
        eventually(lambda: listed_ready(lagging_rabbit) == 1000, timeout=STATISTICS_SECONDS + 10, interval=0.2)
        with reader_holding(lagging_rabbit.url, 400) as held:
            assert any(task_id in set(ids[CREATED]) for task_id in held)
            create_replay(kube_api, "created", filter={"events": [CREATED]})
            seen: set[tuple[str | None, str | None]] = set()

            def note() -> bool:
                condition = succeeded(kube_api, "created")
                seen.add((condition.get("status"), condition.get("reason")))
                return False

            with pytest.raises(AssertionError):  # watched for HELD_SECONDS: it never begins to move, nor ends
                eventually(note, timeout=HELD_SECONDS, interval=0.5)
        status = ended(kube_api, "created", timeout=3 * STATISTICS_SECONDS)
    finally:
        operator.stop()
    print(seen, status)
    assert ("Unknown", "StatisticsBehind") in seen, seen
    assert {reason for _, reason in seen} <= {None, "StatisticsBehind", "ArchiveInUse"}, seen
    assert (status["matched"], status["replayed"], status["remaining"]) == (700, 700, 0), status
    assert succeeded(kube_api, "created").get("reason") == "Replayed"
