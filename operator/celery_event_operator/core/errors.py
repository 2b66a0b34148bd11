"""The errors whose message may be shown to people: in status, Events, logs and the command line (pure).

Every such error derives from `OperatorError`, whose message is written to be shown: it names objects
(a Secret, a queue, a host) and never carries a credential or the content of a Secret. Causes are
chained (`raise ... from exc`) only where the cause is as safe to show; a library's exception that
may echo a URL or a password is summarised through `broker.address.redact` and not chained.

Each error carries the status reason it is reported under (`reason`), as kopf's errors carry their
behaviour: a failure is mapped to a condition in one place, by its class.
"""

from __future__ import annotations

from typing import ClassVar


class OperatorError(Exception):
    """An error whose message is safe to show to the resource's users."""

    reason: ClassVar[str] = "Failed"


class InvalidSpecError(OperatorError, ValueError):
    """The resource's spec cannot be acted on."""

    reason = "InvalidSpec"


class ImmutableFieldChangedError(InvalidSpecError):
    """An immutable field differs from what the operator accepted first (nothing is touched)."""

    reason = "ImmutableFieldChanged"


class BrokerSecretError(OperatorError):
    """The broker Secret is missing, unreadable or holds no usable URL."""

    reason = "BrokerSecretInvalid"


class BrokerUnavailableError(OperatorError):
    """The broker cannot be reached or refused the login."""

    reason = "BrokerUnreachable"


class BrokerRefusedError(OperatorError):
    """Connected, but the broker refused an operation, e.g. a missing permission."""

    reason = "BrokerRefused"


class UnsupportedOperationError(OperatorError):
    """The broker does not support what was asked of it, e.g. `if-empty` on a quorum queue."""

    reason = "UnsupportedOperation"


class ArchiveNotFoundError(OperatorError):
    """The service has no archive queue on the broker (archive disabled, another vhost or serviceName)."""

    reason = "ArchiveNotFound"


class ManagementUnavailableError(OperatorError):
    """The RabbitMQ management API did not answer (counts fall back to ready messages only)."""

    reason = "ManagementUnavailable"


class KubeError(OperatorError):
    """A Kubernetes API call failed; the message names the object, never its data."""

    reason = "KubernetesAPIFailed"


class NotFoundError(KubeError):
    """The object asked for does not exist."""

    reason = "NotFound"


class KubeUnavailableError(KubeError):
    """The Kubernetes API did not answer this time (a 5xx, a 429, a timeout, a broken connection): the API's
    passing fault, never the user's. Whoever meets it keeps what it knew and asks again later."""

    reason = "KubernetesAPIUnavailable"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds the API asked to wait (429's Retry-After)


class KubeForbiddenError(KubeError):
    """The operator's identity may not make a call (HTTP 403): the message names the permission it lacks."""

    reason = "KubernetesAPIForbidden"
