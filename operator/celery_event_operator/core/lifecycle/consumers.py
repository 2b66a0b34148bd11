"""What the broker says of each worker pod (pure): the consumers its connections hold, the Celery hostname its
worker answers remote control under, the deliveries it holds unacknowledged.

The broker lists consumers and channels with the connection they are on; a connection is a pod's when it carries
the name the injected settings give it (`naming.pod_connection_name`), or else when its peer address is the IP of
exactly one of the service's pods. A pod with no consumer found is said to consume nothing only when no consumer of
the handler queues could be its own: an unnamed connection from an address the pod shares leaves it unknown.

A vhost's listing serves every service on it: indexed once by connection name and peer address (`ByConnection`), each
service's pass reads its own pods' entries, not the whole listing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Generic, Protocol, TypeVar

from celery_event_operator.core.naming import POD_CONNECTION_PREFIX, pidbox_queue_suffix, pod_connection_name
from celery_event_operator.core.service.pods import WorkerPod


@dataclasses.dataclass(frozen=True)
class Consumer:
    """A consumer as the broker lists it."""

    queue: str
    peer_host: str | None  # the address the broker sees the connection come from
    connection_name: str | None  # the name the client gave its connection, when it gave one


@dataclasses.dataclass(frozen=True)
class Holding:
    """A channel as the broker lists it: how many deliveries it holds unacknowledged."""

    unacknowledged: int
    peer_host: str | None
    connection_name: str | None


@dataclasses.dataclass(frozen=True)
class OnBroker:
    """What the broker's consumers say of one pod."""

    consuming: bool | None  # holds a consumer of a handler queue (None: cannot tell)
    # The Celery hostnames of the workers consuming on its connections (their remote-control queues
    # `<hostname>.<control exchange>.pidbox`); empty when none is seen (or none can be told to be its own).
    hostnames: frozenset[str] = frozenset()


def pod_of_connection(name: str | None, namespace: str) -> str | None:
    """The pod a client-provided connection name says it belongs to, in `namespace`."""
    if not name or not name.startswith(POD_CONNECTION_PREFIX):
        return None
    found_namespace, _, pod = name[len(POD_CONNECTION_PREFIX) :].partition("/")
    return pod if found_namespace == namespace and pod else None


class _OnConnection(Protocol):
    @property
    def peer_host(self) -> str | None: ...

    @property
    def connection_name(self) -> str | None: ...


T = TypeVar("T", bound=_OnConnection)


class ByConnection(Generic[T]):
    """A vhost's listing (consumers or channels) indexed by the name a connection was given and by its peer."""

    def __init__(self, listed: Iterable[T]) -> None:
        self.by_name: dict[str, list[T]] = {}
        self.by_peer: dict[str, list[T]] = {}
        for item in listed:
            if item.connection_name:
                self.by_name.setdefault(item.connection_name, []).append(item)
            if item.peer_host:
                self.by_peer.setdefault(item.peer_host, []).append(item)

    def of(self, pods: Iterable[WorkerPod], namespace: str) -> Iterator[T]:
        """Each entry that could be one of the pods' (named for one of them, or from one of their addresses and not
        named for a pod of the namespace), once."""
        addresses = set()
        for pod in pods:
            yield from self.by_name.get(pod_connection_name(namespace, pod.name), ())
            if pod.ip:
                addresses.add(pod.ip)
        for address in addresses:
            for item in self.by_peer.get(address, []):
                if pod_of_connection(item.connection_name, namespace) is None:
                    yield item


class _Owners:
    """Which of the pods a connection (by its name, else its peer address) belongs to."""

    SHARED = ""  # an unnamed connection from an address several pods share

    def __init__(self, pods: Iterable[WorkerPod], namespace: str) -> None:
        self.namespace = namespace
        self.by_ip: dict[str, list[str]] = {}
        self.names: set[str] = set()
        for pod in pods:
            self.names.add(pod.name)
            if pod.ip:
                self.by_ip.setdefault(pod.ip, []).append(pod.name)

    def owner(self, connection_name: str | None, peer_host: str | None) -> str | None:
        """The pod's name; SHARED when it cannot be told; None when it is none of the pods'."""
        named = pod_of_connection(connection_name, self.namespace)
        if named is not None:
            return named if named in self.names else None
        sharing = self.by_ip.get(peer_host or "", [])
        if len(sharing) == 1:
            return sharing[0]
        return self.SHARED if sharing else None


def on_broker(
    consumers: ByConnection[Consumer],
    handler_queues: frozenset[str],
    pods: Iterable[WorkerPod],
    namespace: str,
    control_exchange: str,
) -> dict[str, OnBroker]:
    """For each pod: does it hold a consumer on a handler queue, and under which Celery hostnames its worker
    answers remote control."""
    pods = list(pods)
    owners = _Owners(pods, namespace)
    suffix = pidbox_queue_suffix(control_exchange)
    consuming: set[str] = set()
    hostnames: dict[str, set[str]] = {}
    unknown_ips: set[str] = set()
    for consumer in consumers.of(pods, namespace):
        owner = owners.owner(consumer.connection_name, consumer.peer_host)
        if owner is None:
            continue
        if owner == _Owners.SHARED:
            if consumer.queue in handler_queues:
                unknown_ips.add(consumer.peer_host or "")
        elif consumer.queue in handler_queues:
            consuming.add(owner)
        elif consumer.queue.endswith(suffix) and len(consumer.queue) > len(suffix):
            hostnames.setdefault(owner, set()).add(consumer.queue[: -len(suffix)])
    return {
        pod.name: OnBroker(
            True if pod.name in consuming else (None if pod.ip in unknown_ips else False),
            frozenset(hostnames.get(pod.name, ())),
        )
        for pod in pods
    }


def unacknowledged(holdings: ByConnection[Holding], pods: Iterable[WorkerPod], namespace: str) -> dict[str, int | None]:
    """For each pod: how many deliveries its connections hold unacknowledged (None: cannot tell). With late
    acknowledgement (the injected settings) a task running on a pod holds its message until it ends."""
    pods = list(pods)
    owners = _Owners(pods, namespace)
    held: dict[str, int] = dict.fromkeys(owners.names, 0)
    shared: set[str] = set()
    for holding in holdings.of(pods, namespace):
        owner = owners.owner(holding.connection_name, holding.peer_host)
        if owner == _Owners.SHARED:
            shared.add(holding.peer_host or "")
        elif owner is not None:
            held[owner] += max(0, holding.unacknowledged)
    return {pod.name: None if pod.ip in shared and not held[pod.name] else held[pod.name] for pod in pods}
