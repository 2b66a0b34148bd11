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
FINALIZER = f"{GROUP}/finalizer"

# Kubernetes' own: the ReplicaSet controller deletes the pods of lowest cost first on a scale-down.
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
