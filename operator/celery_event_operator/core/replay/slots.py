"""One running replay per archive (pure): the others wait, in the order they were created.

An archive is what the broker holds — (broker endpoints, vhost, serviceName) — not a resource: two resources in two
namespaces naming one serviceName on one vhost share one archive, hence one slot. Kept in memory by the operator
that runs the replays (a replay goes to the shard of its service; with replicas, only the active one runs replays),
so it needs no lock on the API. After a restart the replays that had started resume, one at a time again.
"""

from __future__ import annotations

from celery_event_operator.core.broker.address import BrokerAddress

Key = tuple[str, str, str]  # broker endpoints, vhost, serviceName


class ReplaySlots:
    """One running replay per archive, the others waiting in the order they were created; replays are named
    namespace/name."""

    def __init__(self) -> None:
        self._running: dict[Key, str] = {}
        self._waiting: dict[Key, dict[str, float]] = {}

    def wait(self, key: Key, name: str, created_at: float) -> None:
        self._waiting.setdefault(key, {})[name] = created_at

    def leave(self, key: Key, name: str) -> None:
        waiting = self._waiting.get(key, {})
        waiting.pop(name, None)
        if not waiting:
            self._waiting.pop(key, None)
        self.release(key, name)

    def take(self, key: Key, name: str) -> str | None:
        """None when `name` may run now; otherwise the replay that goes first."""
        holder = self._running.get(key)
        if holder is not None:
            return None if holder == name else holder
        waiting = self._waiting.get(key, {})
        first = min(waiting, key=lambda other: (waiting[other], other), default=name)
        if first != name:
            return first
        self._running[key] = name
        return None

    def release(self, key: Key, name: str) -> None:
        if self._running.get(key) == name:
            del self._running[key]


def archive_key(address: BrokerAddress, service_name: str) -> Key:
    """What a replay acts on, as the broker knows it: its endpoints, vhost and serviceName — whichever resource (in
    whichever namespace) names it."""
    return (",".join(sorted(endpoint.host_port for endpoint in address.endpoints)), address.vhost, service_name)
