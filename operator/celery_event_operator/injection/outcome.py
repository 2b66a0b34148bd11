"""What keeping a service's workers configured found and did, as the status shows it (pure)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Outcome:
    config_hash: str
    configmap_error: str | None = None
    target_error: str | None = None
    stamped: str | None = None  # "Deployment/name" when the rollout stamp was just set
    pods: int = 0
    pods_current: int = 0
    heal_after_seconds: int | None = None  # pods without the current settings are evicted after this long
