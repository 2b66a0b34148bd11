"""A service's worker pods as the operator's watch of labelled pods knows them (pure): one definition for
every module that asks for them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping


@dataclasses.dataclass(frozen=True)
class WorkerPod:
    """A live (not terminating) pod labelled with a service."""

    name: str
    config_hash: str | None  # the settings hash the webhook injected (None: admitted without settings)
    ip: str | None = None  # status.podIP: the address the broker sees its connections come from
    running: bool = False  # status.phase Running
    deletion_cost: str | None = None  # its controller.kubernetes.io/pod-deletion-cost annotation
    template: str | None = None  # the revision of its workload's pod template (a rollout makes another)


# The labels that name a pod's template revision: a Deployment's ReplicaSet's, a StatefulSet's.
TEMPLATE_LABELS = ("pod-template-hash", "controller-revision-hash")


def template_of(labels: Mapping[str, str]) -> str | None:
    return next((labels[label] for label in TEMPLATE_LABELS if labels.get(label)), None)


# serviceName → its live pods (a view of the watched pods: read when called)
PodsOf = Callable[[str], list[WorkerPod]]
