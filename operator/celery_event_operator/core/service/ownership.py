"""One owner per (broker, vhost, serviceName) (pure): who claims a service's topology, and how the claim reads.

The claim is the exchange `<serviceName>:owner`, declared with `alternate-exchange` = the claimant's id. RabbitMQ
compares `alternate-exchange` when an exchange is declared again (other unknown arguments it does not compare):
the first claimant's declare creates it, any other's gets 406 PRECONDITION_FAILED — an atomic test-and-set that
every operator installation sharing the broker sees, whether or not it can see the other's resources. The id
carries the installation, the namespace/name and the uid (a resource recreated under the same name is another
resource); the readable parts ride along in arguments the broker keeps but does not compare.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from celery_event_operator.core.api import conditions

# The alternate-exchange value is an exchange name: at most 255 bytes (AMQP's short string).
ID_MAX_BYTES = 255
ID_ARGUMENT = "alternate-exchange"
INSTALLATION_ARGUMENT = "x-owner-installation"
NAMESPACE_ARGUMENT = "x-owner-namespace"
NAME_ARGUMENT = "x-owner-name"
UID_ARGUMENT = "x-owner-uid"
CONFLICT_REASON = "ServiceNameConflict"
CLAIMED_REASON = "ServiceNameClaimed"  # a resource refused before took the service over
UNCLAIMED_REASON = "ServiceNameUnclaimed"  # deleted without ever having claimed its service: nothing removed
# RabbitMQ's refusal names the value it holds: "... received '<ours>' but current is '<theirs>'".
_HELD_IN_REFUSAL = re.compile(r"but current is (?:the value )?'([^']*)'")


@dataclasses.dataclass(frozen=True)
class Claimant:
    """A resource that claims (or holds) a service's topology."""

    installation: str
    namespace: str
    name: str
    uid: str

    @property
    def id(self) -> str:
        """The claim's compared value: readable when it fits an exchange name, else shortened by a digest."""
        full = f"{self.installation}/{self.namespace}/{self.name}/{self.uid}"
        if len(full.encode()) <= ID_MAX_BYTES:
            return full
        digest = hashlib.sha256(full.encode()).hexdigest()[:32]
        return f"{full.encode()[: ID_MAX_BYTES - len(digest) - 1].decode(errors='ignore')}~{digest}"

    def arguments(self) -> dict[str, str]:
        return {
            ID_ARGUMENT: self.id,
            INSTALLATION_ARGUMENT: self.installation,
            NAMESPACE_ARGUMENT: self.namespace,
            NAME_ARGUMENT: self.name,
            UID_ARGUMENT: self.uid,
        }


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a claim that is not ours, as far as the broker tells."""

    id: str | None  # None: the broker's answer did not say
    namespace: str | None = None
    name: str | None = None
    installation: str | None = None
    uid: str | None = None

    def same_resource_as(self, claimant: Claimant) -> bool:
        """Whether this claim is `claimant`'s own under another installation id (the option was changed): the uid
        names one resource, whatever the installation."""
        return self.id is not None and bool(claimant.uid) and self.uid == claimant.uid

    def describe(self, ours: Claimant) -> str:
        if self.namespace is not None and self.name is not None:
            where = f"{self.namespace}/{self.name}"
            if self.installation is not None and self.installation != ours.installation:
                where += f" of operator installation {self.installation!r}"
            return where
        if self.id is not None:
            return repr(self.id)
        return "another resource"


def holder_of(arguments: Mapping[str, Any] | None, refusal: str) -> Holder:
    """The holder of a claim from the claim exchange's arguments (the management API), else from the broker's
    refusal text (which names the held id unless it was too long to fit)."""
    if arguments and isinstance(arguments.get(ID_ARGUMENT), str):
        keys = (NAMESPACE_ARGUMENT, NAME_ARGUMENT, INSTALLATION_ARGUMENT, UID_ARGUMENT)
        namespace, name, installation, uid = (
            found if isinstance(found := arguments.get(key), str) else None for key in keys
        )
        return Holder(str(arguments[ID_ARGUMENT]), namespace, name, installation, uid)
    match = _HELD_IN_REFUSAL.search(refusal)
    if match is None:
        return Holder(None)
    held = match.group(1)
    pieces = held.split("/")
    if len(pieces) >= 4 and "~" not in held:  # installation/namespace/name/uid (the installation may hold "/")
        return Holder(held, pieces[-3], pieces[-2], "/".join(pieces[:-3]), pieces[-1])
    return Holder(held)


def shown_ours(listed_arguments: Mapping[str, Any] | None, claimant: Claimant) -> bool:
    """Whether the claim exchange as a listing shows it (its arguments; None: not listed as a durable fanout) is
    `claimant`'s: what declaring the claim would answer, since RabbitMQ compares only the id."""
    return listed_arguments is not None and listed_arguments.get(ID_ARGUMENT) == claimant.id


@dataclasses.dataclass(frozen=True)
class Claim:
    """What claiming a service's topology found: ours, or held by `holder`."""

    holder: Holder | None = None  # None: the claim is ours
    fresh: bool = False  # ours, made just now: nobody held it before (asked only at deletion)

    @property
    def ours(self) -> bool:
        return self.holder is None


def conflict_message(service: str, ours: Claimant, holder: Holder) -> str:
    return (
        f"serviceName {service!r} on this broker and vhost belongs to {holder.describe(ours)}: this resource "
        "declares, deletes, consumes and replays nothing of it, and takes it over once that resource is gone "
        "(set a spec.serviceName of its own to run a service of its own)"
    )


def shown_refused(status: Mapping[str, Any] | None) -> bool:
    """Whether a resource's status (as the API holds it) says another resource owns its service."""
    return conditions.find_written(status, conditions.READY).get("reason") == CONFLICT_REASON
