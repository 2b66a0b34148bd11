"""List, replay and purge a service's archive (I/O with py-amqp through kombu).

Reading never changes the archive. AMQP cannot browse a queue, so the tools take messages without
acknowledging them, on a channel of their own, and close it: the broker then returns every
unacknowledged message to its original position. (A basic.get + requeue per message would do the
same one by one; holding them until the end also keeps one listing free of the messages it already
saw.) Nothing is acknowledged but what was replayed — after the broker confirmed the copy — or
purged, so a replay killed half-way leaves each message either still archived or replayed, with at
most the one in flight both.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import amqp
from kombu.connection import Connection

from celery_event_operator import naming
from celery_event_operator.archive.messages import Archived, describe, replay_headers, selected
from celery_event_operator.errors import ArchiveNotFoundError

Progress = Callable[[int, int], None]


@dataclasses.dataclass(frozen=True)
class Selection:
    event: str | None = None
    older_than: float | None = None  # seconds
    newer_than: float | None = None

    def matches(self, item: Archived, now: float) -> bool:
        return selected(item, event=self.event, older_than=self.older_than, newer_than=self.newer_than, now=now)


@dataclasses.dataclass
class Summary:
    archived: int = 0  # messages in the archive when the tool started
    matched: int = 0
    done: int = 0  # replayed or purged (or, with --dry-run, would be)
    unroutable: int = 0  # replay found no queue for it: it stays archived
    target: str = ""


def _body(message: amqp.Message) -> bytes:
    body = message.body
    return body.encode() if isinstance(body, str) else bytes(body)


def _depth(channel: Any, queue: str) -> int:
    try:
        count: int = channel.queue_declare(queue, passive=True).message_count
    except amqp.exceptions.NotFound:
        raise ArchiveNotFoundError(
            f"there is no archive queue {queue!r} on this broker (is the archive enabled, and are the vhost and "
            "the serviceName right?)"
        ) from None
    return count


def _browse(channel: Any, queue: str) -> Iterator[tuple[Archived, amqp.Message]]:
    """Every message of the queue once, oldest first, left unacknowledged."""
    count = _depth(channel, queue)
    for position in range(count):
        message = channel.basic_get(queue, no_ack=False)
        if message is None:
            return
        properties = dict(message.properties)
        yield (
            describe(
                position,
                _body(message),
                properties.get("application_headers") or {},
                properties,
                message.delivery_info.get("routing_key", ""),
            ),
            message,
        )


def archive_size(connection: Connection, service: str) -> int:
    channel = connection.channel()
    try:
        return _depth(channel, naming.archive_name(service))
    finally:
        channel.close()


def list_archive(connection: Connection, service: str, selection: Selection) -> list[Archived]:
    channel = connection.channel()
    now = time.time()
    try:
        return [item for item, _ in _browse(channel, naming.archive_name(service)) if selection.matches(item, now)]
    finally:
        channel.close()  # nothing was acknowledged: every message goes back where it was


def _replay_route(channel: Any, service: str) -> Callable[[str], tuple[str, str]]:
    """Back to this service's handler queues only: through its recover exchange (by the event's key),
    or, without retry levels, straight to the handler queue. The shared events exchange would hand
    the event again to every other service that handled it fine."""
    recover = naming.recover_name(service)
    try:
        channel.exchange_declare(recover, "topic", passive=True)
    except amqp.exceptions.NotFound:
        return lambda event: ("", naming.handler_queue_name(service, event))
    return lambda event: (recover, event)


def replay(
    connection: Connection,
    service: str,
    selection: Selection,
    *,
    limit: int | None = None,
    dry_run: bool = False,
    rate: float | None = None,
    progress: Progress | None = None,
) -> Summary:
    summary = Summary(archived=archive_size(connection, service))
    route_channel = connection.channel()
    try:
        route = _replay_route(route_channel, service)
    finally:
        route_channel.close()
    summary.target = route("<event>")[0] or "the handler queues (default exchange)"
    channel = connection.channel()
    returned: list[str] = []
    channel.events["basic_return"].add(lambda exc, exchange, key, message: returned.append(key))
    now = time.time()
    try:
        for item, message in _browse(channel, naming.archive_name(service)):
            if not selection.matches(item, now):
                continue
            summary.matched += 1
            if limit is not None and summary.done >= limit:
                continue
            if dry_run:
                summary.done += 1
                continue
            properties = dict(message.properties)
            properties["application_headers"] = replay_headers(properties.get("application_headers") or {})
            exchange, key = route(item.event)
            returned.clear()
            channel.basic_publish_confirm(
                amqp.Message(_body(message), **properties), exchange=exchange, routing_key=key, mandatory=True
            )
            if returned:  # no queue took it (a handler no longer planned): it stays archived
                summary.unroutable += 1
                continue
            channel.basic_ack(message.delivery_tag)  # only once the copy is confirmed
            summary.done += 1
            if progress is not None:
                progress(summary.done, limit or summary.archived)
            if rate:
                time.sleep(1 / rate)
    finally:
        channel.close()  # what was not replayed goes back to its place in the archive
    return summary


def purge(connection: Connection, service: str, selection: Selection) -> Summary:
    queue = naming.archive_name(service)
    summary = Summary(archived=archive_size(connection, service))
    channel = connection.channel()
    try:
        if selection == Selection():
            summary.matched = summary.done = int(channel.queue_purge(queue) or 0)
            return summary
        now = time.time()
        for item, message in _browse(channel, queue):
            if selection.matches(item, now):
                summary.matched += 1
                channel.basic_ack(message.delivery_tag)
                summary.done += 1
    finally:
        channel.close()
    return summary
