"""The labels, annotations and finalizer the operator reads and writes on Kubernetes objects (pure, no imports):
every `celeryevents.io/*` name is spelled here once."""

from __future__ import annotations

GROUP = "celeryevents.io"

# On worker pods: the label that opts a pod in (its value: the serviceName), the settings hash the webhook
# injected, and why the webhook could not inject (an unknown service).
SERVICE_LABEL = f"{GROUP}/service"
HASH_ANNOTATION = f"{GROUP}/config-hash"
WARNING_ANNOTATION = f"{GROUP}/injection-warning"

# On the resource: the entities last declared (so that what the spec drops can be removed later), and the
# immutable fields as first accepted (checked by the operator itself, for API servers that do not enforce the
# CRD's transition rules). kopf keeps its own progress under the same prefix.
DECLARED_ANNOTATION = f"{GROUP}/declared-entities"
ACCEPTED_IMMUTABLE_ANNOTATION = f"{GROUP}/accepted-immutable-fields"
KOPF_ANNOTATION_PREFIX = GROUP
# kopf's finalizer: one name per shard, since kopf takes its finalizer off every resource none of its handlers
# keeps, and shards sharing a name took off each other's. One shard (the default) keeps the name of the releases
# before sharding, so that an upgrade without sharding changes no resource.
FINALIZER = f"{GROUP}/finalizer"


def shard_finalizer(shard_index: int, shard_count: int) -> str:
    """The finalizer kopf puts on the resources of this shard."""
    return FINALIZER if shard_count <= 1 else f"{FINALIZER}-shard-{shard_index}-of-{shard_count}"


def others_finalizers(finalizers: list[str], own: str) -> list[str]:
    """The finalizers of this operator that are not this shard's: of other shard counts, or of one shard, left on
    a resource that changed shard. Nothing else takes them off once the resource's own shard is done with it."""
    return [f for f in finalizers if f != own and (f == FINALIZER or f.startswith(f"{FINALIZER}-shard-"))]


# Kubernetes' own: the ReplicaSet controller deletes the pods of lowest cost first on a scale-down.
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
