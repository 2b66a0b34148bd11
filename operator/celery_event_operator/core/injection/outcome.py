"""What keeping a service's workers configured found and did, as the status shows it (pure)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True)
class WorkersOutcome:
    config_hash: str
    configmap_error: str | None = None
    target_error: str | None = None
    target_reason: str = "ScaleTargetNotFound"  # why the target could not be seen (a 403: KubernetesAPIForbidden)
    stamped: str | None = None  # "Deployment/name" when the rollout stamp was just set
    pods: int = 0
    pods_current: int = 0
    heal_after_seconds: int | None = None  # pods without the current settings are evicted after this long
    unavailable: str | None = None  # the Kubernetes API did not answer: nothing known of this pass (keep the last)
    # No webhook stamps the pods (--webhook-port 0): the ConfigMap they mount themselves; None: the webhook injects.
    mounted_from: str | None = None


def count_pods(config_hash: str, pod_hashes: Iterable[str | None]) -> WorkersOutcome:
    """How many of the service's pods run with the current settings."""
    hashes = list(pod_hashes)
    return WorkersOutcome(
        config_hash, pods=len(hashes), pods_current=sum(1 for found in hashes if found == config_hash)
    )
