"""The operator's options: built once from the command line, handed to the handlers in kopf's memo (pure).

Handlers read `memo.options`; nothing travels through environment variables between our own modules.
"""

from __future__ import annotations

import dataclasses
import hashlib

from celery_event_operator.core.api.metadata import shard_finalizer
from celery_event_operator.core.lifecycle.long_tasks import DEFAULT_BROKER_CONSUMER_TIMEOUT_SECONDS
from celery_event_operator.core.monitoring.bounds import DEFAULT_MAX_TASK_NAMES
from celery_event_operator.core.monitoring.state import QUEUE_WAIT_BUCKETS, RUNTIME_BUCKETS

DEFAULT_RESYNC_SECONDS = 30.0
# Names this operator installation in the claims it makes on shared brokers (core/service/ownership.py); the
# chart sets it to its release's namespace/name.
DEFAULT_INSTALLATION_ID = "celery-event-operator"
DEFAULT_METRICS_PORT = 9808
DEFAULT_WEBHOOK_PORT = 9443
# A replica that stops renewing its peering record (killed) is presumed dead after this long; a standby then
# takes over. (A replica that stops gracefully withdraws its record at once.)
PEERING_LIFETIME_SECONDS = 15


@dataclasses.dataclass(frozen=True)
class WebhookOptions:
    """Where the admission webhook listens, and its TLS files (self-signed for `host` when absent)."""

    port: int = DEFAULT_WEBHOOK_PORT
    addr: str = "0.0.0.0"
    host: str = "localhost"
    cert_file: str | None = None
    key_file: str | None = None


@dataclasses.dataclass(frozen=True)
class OperatorOptions:
    resync_seconds: float = DEFAULT_RESYNC_SECONDS
    metrics_port: int = DEFAULT_METRICS_PORT  # 0: no /metrics server
    metrics_addr: str = "0.0.0.0"
    runtime_buckets: tuple[float, ...] = RUNTIME_BUCKETS  # celery_task_runtime's upper bounds, seconds
    queue_wait_buckets: tuple[float, ...] = QUEUE_WAIT_BUCKETS  # celery_task_queue_wait_time's
    per_pod_task_series: bool = False  # `hostname` on task series, unless a service's spec says otherwise
    max_task_names: int = DEFAULT_MAX_TASK_NAMES  # per service, unless its spec says otherwise
    webhook: WebhookOptions | None = dataclasses.field(default_factory=WebhookOptions)  # None: no webhook
    namespaces: tuple[str, ...] = ()  # empty: cluster-wide
    shard_index: int = 0
    shard_count: int = 1  # >1: this operator keeps only the services that hash to its shard
    peering: str | None = None  # kopf peering of the replicas: the one of highest priority reconciles
    priority: int = 0
    # The brokers' delivery-acknowledgement timeout (rabbitmq.conf `consumer_timeout`): it cannot be read remotely.
    broker_consumer_timeout_seconds: int = DEFAULT_BROKER_CONSUMER_TIMEOUT_SECONDS
    installation_id: str = DEFAULT_INSTALLATION_ID

    def owns(self, namespace: str | None, name: str | None) -> bool:
        """Whether this operator's shard keeps the resource (every replica's webhook still serves all of them)."""
        return shard_of(namespace or "", name or "", self.shard_count) == self.shard_index

    @property
    def finalizer(self) -> str:
        """kopf's finalizer on this shard's resources (no other shard's)."""
        return shard_finalizer(self.shard_index, self.shard_count)


def shard_of(namespace: str, name: str, shard_count: int) -> int:
    """A stable shard for namespace/name: the same on every replica and across restarts (not Python's hash)."""
    if shard_count <= 1:
        return 0
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % shard_count
