"""The rendered worker settings (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.injection import settings


def spec(**changes: Any) -> Any:
    return parse_spec(
        {"broker": {"secretRef": {"name": "rabbitmq"}}, "events": {"handlers": [{"name": "a.b"}]}, **changes}
    )


def test_robust_defaults() -> None:
    celery = settings.render("billing", spec())["celery"]
    assert celery == {
        "task_acks_late": True,
        "task_acks_on_failure_or_timeout": False,
        "task_reject_on_worker_lost": False,
        "broker_transport_options": {"confirm_publish": True},
        "broker_failover_strategy": "round-robin",
        "broker_connection_retry_on_startup": True,
        "worker_prefetch_multiplier": 1,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "result_backend": None,
        "task_ignore_result": True,
        "task_default_exchange": "events",
        "task_default_exchange_type": "topic",
        "event_exchange": "billing:celeryev",
        "event_queue_prefix": "billing:celeryev",
        "control_exchange": "billing:control",
    }
    assert "broker_url" not in celery, "the URL reaches pods only as a secretKeyRef"


@pytest.mark.parametrize(
    ("changes", "requeue_lost_task"),
    [
        pytest.param({}, False, id="classic-dead-letters-lost-tasks-through-retry-level-0"),
        pytest.param({"queueType": "quorum"}, True, id="quorum-requeues-up-to-the-delivery-limit"),
        pytest.param({"retry": {"maxRetries": 0}}, True, id="classic-without-levels-has-no-dead-letter-exchange"),
    ],
)
def test_lost_task_handling(changes: dict[str, Any], requeue_lost_task: bool) -> None:
    assert settings.render("s", spec(**changes))["celery"]["task_reject_on_worker_lost"] is requeue_lost_task


def test_entity_names_for_the_runtime() -> None:
    events = settings.render(
        "s", spec(retry={"maxRetries": 2}, events={"exchange": "domain", "handlers": [{"name": "a.b"}]})
    )
    assert events["celery_events"] == {
        "service": "s",
        "events_exchange": "domain",
        "handler_queues": {"a.b": "s.a.b"},
        "retry_exchanges": ["s:retry", "s:retry.1"],
        "archive_exchange": "s:archived",
        "queue_type": "classic",
        "vhost": None,
        "consumer_timeout_seconds": None,
    }


@pytest.mark.parametrize(
    ("workers", "seconds"),
    [
        pytest.param({}, 3660, id="the-longest-grace-period"),
        pytest.param({"maxGracePeriodSeconds": 7200}, 7260, id="a-longer-grace-period"),
        pytest.param({"celery": {"timeLimitSeconds": 600}}, 690, id="the-time-limit-and-the-pools-margin"),
        pytest.param({"maxTaskRuntimeSeconds": 900, "celery": {"timeLimitSeconds": 600}}, 960, id="the-users-limit"),
    ],
)
def test_the_workers_ask_the_broker_to_wait_for_their_tasks(workers: dict[str, Any], seconds: int) -> None:
    """Per consumer of the handler queues (x-consumer-timeout, where the broker honours it): the tasks' limit."""
    target = {"scaleTargetRef": {"name": "w"}}
    rendered = settings.render("s", spec(workers=target | workers))
    assert rendered["celery_events"]["consumer_timeout_seconds"] == seconds


def test_tuning_overrides() -> None:
    tuned = spec(
        workers={
            "scaleTargetRef": {"name": "w"},
            "celery": {"prefetchMultiplier": 4, "concurrency": 8, "timeLimitSeconds": 60, "softTimeLimitSeconds": 50},
        }
    )
    celery = settings.render("s", tuned)["celery"]
    assert (celery["worker_prefetch_multiplier"], celery["worker_concurrency"]) == (4, 8)
    assert (celery["task_time_limit"], celery["task_soft_time_limit"]) == (60, 50)


def test_hash_follows_content_only() -> None:
    base = settings.config_hash(settings.render("s", spec()))
    assert settings.config_hash(settings.render("s", spec())) == base
    assert settings.config_hash(settings.render("s", spec(retry={"maxRetries": 3}))) != base
    assert settings.config_hash(settings.render("s", spec(monitoring={"enabled": False}))) == base


def test_configmap_holds_data_and_the_fixed_loader() -> None:
    data = settings.configmap_data(settings.render("s", spec()))
    assert set(data) == {"settings.json", "celeryevents_settings.py"}
    assert data["celeryevents_settings.py"] == settings.LOADER_SOURCE
    assert "s:retry" in data["settings.json"]
