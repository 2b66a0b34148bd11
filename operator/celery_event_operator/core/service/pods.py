"""A service's worker pods as the operator's index of labelled pods knows them (pure): one definition for
every module that asks for them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class WorkerPod:
    """A live (not terminating) pod labelled with a service."""

    name: str
    config_hash: str | None  # the settings hash the webhook injected (None: admitted without settings)
    ip: str | None = None  # status.podIP: the address the broker sees its connections come from
    running: bool = False  # status.phase Running
    deletion_cost: str | None = None  # its controller.kubernetes.io/pod-deletion-cost annotation


# serviceName → its live pods (a view of kopf's index: read when called)
PodsOf = Callable[[str], list[WorkerPod]]
