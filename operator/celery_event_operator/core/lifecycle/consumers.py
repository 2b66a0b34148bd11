"""Which worker pod holds which consumer of a service's handler queues (pure).

The broker lists consumers with the connection they are on; a connection is a pod's when it carries the name the
injected settings give it (`naming.pod_connection_name`), or else when its peer address is the IP of exactly one of
the service's pods. A pod with no consumer found is said to consume nothing only when no consumer of the handler
queues could be its own: an unnamed connection from an address the pod shares leaves it unknown.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from celery_event_operator.core.naming import POD_CONNECTION_PREFIX
from celery_event_operator.core.service.pods import WorkerPod


@dataclasses.dataclass(frozen=True)
class Consumer:
    """A consumer as the broker lists it."""

    queue: str
    peer_host: str | None  # the address the broker sees the connection come from
    connection_name: str | None  # the name the client gave its connection, when it gave one


def pod_of_connection(name: str | None, namespace: str) -> str | None:
    """The pod a client-provided connection name says it belongs to, in `namespace`."""
    if not name or not name.startswith(POD_CONNECTION_PREFIX):
        return None
    found_namespace, _, pod = name[len(POD_CONNECTION_PREFIX) :].partition("/")
    return pod if found_namespace == namespace and pod else None


def consuming(
    consumers: Iterable[Consumer], handler_queues: frozenset[str], pods: Iterable[WorkerPod], namespace: str
) -> dict[str, bool | None]:
    """For each pod: does it hold a consumer on a handler queue (None: cannot tell)."""
    pods = list(pods)
    by_ip: dict[str, list[str]] = {}
    for pod in pods:
        if pod.ip:
            by_ip.setdefault(pod.ip, []).append(pod.name)
    names = {pod.name for pod in pods}
    found: set[str] = set()
    unknown_ips: set[str] = set()
    for consumer in consumers:
        if consumer.queue not in handler_queues:
            continue
        named = pod_of_connection(consumer.connection_name, namespace)
        if named is not None:
            if named in names:
                found.add(named)
            continue
        sharing = by_ip.get(consumer.peer_host or "", [])
        if len(sharing) == 1:
            found.add(sharing[0])
        elif sharing:
            unknown_ips.add(consumer.peer_host or "")
    return {pod.name: True if pod.name in found else (None if pod.ip in unknown_ips else False) for pod in pods}
