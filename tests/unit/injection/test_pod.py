"""The pod patch (pure): appended, idempotent, never clobbering."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from celery_event_operator.core.api.metadata import HASH_ANNOTATION
from celery_event_operator.core.injection import pod
from celery_event_operator.core.injection.settings import MOUNT_PATH

INJECTION = pod.Injection(
    service="billing", secret_name="rabbitmq", secret_key="url", configmap="billing-celery-events", config_hash="abc123"
)


def a_pod(*containers: dict[str, Any], volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"celeryevents.io/service": "billing"}},
        "spec": {"containers": list(containers), **({"volumes": volumes} if volumes else {})},
    }


def env_names(container: dict[str, Any]) -> list[str]:
    return [variable["name"] for variable in container["env"]]


def test_every_container_gets_env_and_mount() -> None:
    changes = pod.changes(a_pod({"name": "worker"}, {"name": "sidecar"}), INJECTION)
    for container in changes.containers:
        assert env_names(container) == [
            "CELERY_BROKER_URL",
            "CELERY_LOADER",
            "CELERY_CONFIG_MODULE",
            "CELERY_EVENTS_SETTINGS",
            "CELERY_WORKER_WITHOUT_MINGLE",
            "CELERY_WORKER_WITHOUT_GOSSIP",
            "CELERY_EVENTS_SOFT_SHUTDOWN_SECONDS",
            "CELERY_EVENTS_POD_NAME",
            "CELERY_EVENTS_POD_NAMESPACE",
            "PYTHONPATH",
        ]
        assert container["volumeMounts"] == [{"name": pod.VOLUME_NAME, "mountPath": MOUNT_PATH, "readOnly": True}]
    assert changes.volumes == [
        {"name": pod.VOLUME_NAME, "configMap": {"name": "billing-celery-events", "defaultMode": 0o444}}
    ]
    assert changes.annotations == {HASH_ANNOTATION: "abc123"}


@pytest.mark.parametrize(
    ("own", "service", "grace", "soft"),
    [
        pytest.param(None, None, None, "25", id="kubernetes-default"),
        pytest.param(30, None, None, "25", id="as-set"),
        pytest.param(None, 600, 600, "595", id="raised-to-the-services"),
        pytest.param(900, 600, None, "895", id="a-longer-own-one-is-kept"),
        pytest.param(6, None, None, "1", id="short"),
        pytest.param(1, None, None, "0", id="one-second"),
        pytest.param(0, None, None, "0", id="none"),
    ],
)
def test_the_grace_period_covers_the_services_tasks_and_is_never_lowered(
    own: int | None, service: int | None, grace: int | None, soft: str
) -> None:
    """SIGTERM is Celery's warm shutdown (it exits once its tasks ended): the grace period is what covers them. A pod
    that maps SIGTERM to the cold shutdown itself gets a soft shutdown within it."""
    worker = a_pod({"name": "worker"})
    if own is not None:
        worker["spec"]["terminationGracePeriodSeconds"] = own
    changes = pod.changes(worker, dataclasses.replace(INJECTION, grace_seconds=service))
    assert changes.grace_seconds == grace
    [container] = changes.containers
    env = {variable["name"]: variable.get("value") for variable in container["env"]}
    assert "REMAP_SIGTERM" not in env, "SIGTERM stays Celery's warm shutdown"
    assert env["CELERY_EVENTS_SOFT_SHUTDOWN_SECONDS"] == soft


def test_user_entries_are_kept_first_and_win() -> None:
    user_env = [{"name": "CELERY_LOADER", "value": "mine"}, {"name": "PYTHONPATH", "value": "/app"}]
    container = {"name": "w", "env": user_env, "volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    changes = pod.changes(a_pod(container, volumes=[{"name": "data", "emptyDir": {}}]), INJECTION)
    [patched] = changes.containers
    assert patched["env"][:2] == user_env
    assert env_names(patched).count("CELERY_LOADER") == 1
    assert patched["env"][-1] == {"name": "PYTHONPATH", "value": f"$(PYTHONPATH):{MOUNT_PATH}"}
    assert patched["volumeMounts"][0] == {"name": "data", "mountPath": "/data"}
    assert changes.volumes[0] == {"name": "data", "emptyDir": {}}
    assert container["env"] == user_env, "the input is not modified"


def test_applying_twice_changes_nothing_more() -> None:
    once = pod.changes(a_pod({"name": "w"}), INJECTION)
    twice = pod.changes({"metadata": {}, "spec": {"containers": once.containers, "volumes": once.volumes}}, INJECTION)
    assert twice.containers == once.containers
    assert twice.volumes == once.volumes


@pytest.mark.parametrize(
    ("annotations", "volumes", "expected"),
    [
        pytest.param(
            {HASH_ANNOTATION: "h1"}, [{"name": pod.VOLUME_NAME, "configMap": {"name": "c"}}], "h1", id="injected"
        ),
        # failurePolicy Ignore: admitted unchanged while the webhook did not answer, with its template's stamp.
        pytest.param({HASH_ANNOTATION: "h1"}, [{"name": "data", "emptyDir": {}}], None, id="stamp-only"),
        pytest.param({}, [{"name": pod.VOLUME_NAME}], None, id="no-hash"),
    ],
)
def test_a_pod_runs_the_settings_it_carries_not_its_templates_stamp(
    annotations: dict[str, str], volumes: list[dict[str, Any]], expected: str | None
) -> None:
    assert pod.carried_hash(annotations, volumes) == expected
