"""The runtime's pure parts, and that it imports with celery and kombu only."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.broker.address import with_vhost
from celery_event_operator.core.injection import settings
from celery_event_operator.core.topology import plan
from celery_event_operator.runtime import app as runtime


def test_runtime_imports_without_operator_dependencies() -> None:
    code = (
        "import sys, celery_event_operator.runtime\n"
        "heavy = {'kopf', 'pydantic', 'kubernetes', 'prometheus_client', 'cryptography'} & set(sys.modules)\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_default_names_equal_the_operators() -> None:
    spec = parse_spec({"broker": {"secretRef": {"name": "r"}}, "events": {"handlers": [{"name": "e"}]}})
    injected = runtime.EventsSettings.from_mapping(settings.render("svc", spec)["celery_events"])
    assert runtime.EventsSettings.defaults("svc") == dataclass_without_handlers(injected)
    topology = plan.plan("svc", spec)
    assert injected.queue_of("e") == "svc.e"
    assert set(injected.retry_exchanges) | {injected.archive_exchange} <= {e.name for e in topology.exchanges}


def dataclass_without_handlers(events: runtime.EventsSettings) -> runtime.EventsSettings:
    return dataclasses.replace(events, handler_queues={})


@pytest.mark.parametrize(
    ("deaths", "expected"),
    [
        pytest.param([], 0, id="none"),
        pytest.param([{"queue": "s.e", "reason": "rejected", "count": 2}], 2, id="rejected-twice"),
        pytest.param(
            [{"queue": "s:retry", "reason": "expired", "count": 2}, {"queue": "s.e", "reason": "rejected", "count": 1}],
            1,
            id="expiries-do-not-count",
        ),
        pytest.param([{"queue": "other.e", "reason": "rejected", "count": 5}], 0, id="other-queues-do-not-count"),
    ],
)
def test_rejected_passes(deaths: list[dict[str, Any]], expected: int) -> None:
    request = SimpleNamespace(**{"x-death": deaths, "headers": {}})
    assert runtime.rejected_passes(request, "s.e") == expected
    in_headers = SimpleNamespace(headers={"x-death": deaths})
    assert runtime.rejected_passes(in_headers, "s.e") == expected


PUBLISHED = "x-celery-events-published-at"


@pytest.mark.parametrize(
    ("headers", "delivery_info", "expected"),
    [
        pytest.param({PUBLISHED: 100.5, "retries": 0}, {}, 100.5, id="first-delivery"),
        pytest.param({PUBLISHED: 100}, {"redelivered": False}, 100.0, id="an-int"),
        pytest.param({"retries": 0}, {}, None, id="a-producer-that-stamps-nothing"),
        pytest.param({PUBLISHED: 100.5, "retries": 1}, {}, None, id="a-retry-waited-on-purpose"),
        pytest.param({PUBLISHED: 100.5, "x-death": [{}]}, {}, None, id="dead-lettered"),
        pytest.param({PUBLISHED: 100.5}, {"redelivered": True}, None, id="delivered-again"),
        pytest.param({PUBLISHED: "100.5"}, {}, None, id="text"),
        pytest.param({PUBLISHED: True}, {}, None, id="a-bool"),
        pytest.param({PUBLISHED: float("nan")}, {}, None, id="nan"),
        pytest.param({PUBLISHED: float("inf")}, {}, None, id="inf"),
    ],
)
def test_published_at_only_for_a_first_wait(
    headers: dict[str, Any], delivery_info: dict[str, Any], expected: float | None
) -> None:
    assert runtime.published_at(headers, delivery_info) == expected


def test_settings_file_is_optional(tmp_path: pathlib.Path) -> None:
    assert runtime.load_settings(str(tmp_path / "missing.json")) == {}
    (tmp_path / "s.json").write_text(json.dumps({"celery_events": {"service": "x"}}))
    assert runtime.load_settings(str(tmp_path / "s.json"))["celery_events"]["service"] == "x"


def test_vhost_rewrite_keeps_credentials_and_failover() -> None:
    assert with_vhost("amqp://u:p@h1/a;amqp://u:p@h2/a", "/shop") == "amqp://u:p@h1/%2Fshop;amqp://u:p@h2/%2Fshop"


def test_events_app_needs_a_service_name_without_injection(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    monkeypatch.setenv(runtime.SETTINGS_ENV, str(tmp_path / "none.json"))
    with pytest.raises(ValueError, match="pass the service name"):
        runtime.events_app()
    app = runtime.events_app("billing")
    assert app.events_settings.max_retries == 10
    assert app.conf.task_acks_late is True
