"""The pod patch (pure): appended, idempotent, never clobbering."""

from __future__ import annotations

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
            "REMAP_SIGTERM",
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
    ("grace", "soft"), [(None, "25"), (30, "25"), (120, "115"), (6, "1"), (3, "1"), (1, "0"), (0, "0")]
)
def test_soft_shutdown_fits_the_pods_grace_period(grace: int | None, soft: str) -> None:
    worker = a_pod({"name": "worker"})
    if grace is not None:
        worker["spec"]["terminationGracePeriodSeconds"] = grace
    [container] = pod.changes(worker, INJECTION).containers
    env = {variable["name"]: variable.get("value") for variable in container["env"]}
    assert env["REMAP_SIGTERM"] == "SIGQUIT", "SIGTERM starts Celery's cold shutdown, with the soft one first"
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
