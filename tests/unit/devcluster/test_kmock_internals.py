"""What dev mode takes from kmock's internals (celery_event_devcluster/kmock_internals.py) is still
there in the installed kmock, and nothing else in the package reaches past kmock's public API.

kmock is pinned exactly; an upgrade that fails here says what in dev mode it would break.
"""

from __future__ import annotations

import inspect
import re

import attrs
import kmock
from kmock._internal import apps

from celery_event_devcluster import kmock_internals
from tests.conftest import REPO

PRIVATE_USE = re.compile(r"kmock\._internal|\._(requests|payloads|buses|raw_request|lock)\b|super\(\)\._handle")


def test_the_request_log_is_two_lists_we_can_clear() -> None:
    emulator = kmock.KubernetesEmulator()
    assert isinstance(emulator._requests, list), "breaks: the emulator's latency grows with every request served"
    assert isinstance(emulator._payloads, list), "breaks: the emulator's latency grows with every request served"
    kmock_internals.forget_served_requests(emulator)


def test_each_resource_has_a_change_bus_with_marks() -> None:
    emulator = kmock.KubernetesEmulator()
    bus = kmock_internals.change_bus(emulator, kmock.resource("", "v1", "configmaps"))
    assert isinstance(bus, kmock_internals.Bus), "breaks: watches (kopf, kubectl get -w) get no events"
    assert inspect.iscoroutinefunction(bus.mark), "breaks: watches"
    assert inspect.iscoroutinefunction(bus.unmark), "breaks: watches"


def test_a_parsed_request_carries_its_aiohttp_request() -> None:
    fields = attrs.fields_dict(kmock.Request)
    assert "_raw_request" in fields, "breaks: every watch (the emulator streams it on the aiohttp request)"


def test_requests_are_dispatched_through_the_overridden_handle() -> None:
    assert inspect.iscoroutinefunction(kmock.KubernetesEmulator._handle), "breaks: every object request"
    assert "self._handle(request)" in inspect.getsource(apps.RawHandler.__call__), (
        "breaks: every object request would be served by kmock's own storage (no resourceVersion, no JSON patch)"
    )


def test_only_the_adapter_module_reaches_into_kmock() -> None:
    package = REPO / "devcluster" / "celery_event_devcluster"
    offenders = {
        path.name
        for path in package.glob("*.py")
        if path.name != "kmock_internals.py" and PRIVATE_USE.search(path.read_text())
    }
    assert offenders == set(), "kmock internals belong in kmock_internals.py, where this test checks them"
