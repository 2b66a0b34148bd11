"""The admission webhook's mutation of any worker pod a user writes (typed as the API server decodes a pod before the
webhooks, its values not validated yet): it never raises, keeps every entry of the user's first and unchanged, adds
its own once (a variable the user set keeps the user's value), never lowers the grace period, and applied to its own
result changes nothing more."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from celery_event_operator.core.api.metadata import HASH_ANNOTATION
from celery_event_operator.core.injection import pod
from celery_event_operator.core.injection.settings import MOUNT_PATH

NAMES = st.one_of(
    st.sampled_from(["PYTHONPATH", "CELERY_BROKER_URL", "CELERY_LOADER", "HOME", "", pod.VOLUME_NAME]),
    st.text(max_size=10),
)
VARIABLES = st.fixed_dictionaries(
    {"name": NAMES},
    optional={
        "value": st.one_of(st.text(max_size=20), st.just(f"{MOUNT_PATH}:/x"), st.just("$(PYTHONPATH)")),
        "valueFrom": st.just({"fieldRef": {"fieldPath": "metadata.name"}}),
    },
)
MOUNTS = st.fixed_dictionaries(
    {"name": NAMES, "mountPath": st.one_of(st.just(MOUNT_PATH), st.text(max_size=10))},
    optional={"readOnly": st.booleans()},
)
CONTAINERS = st.fixed_dictionaries(
    {"name": st.text(max_size=8)},
    optional={"env": st.lists(VARIABLES, max_size=4), "volumeMounts": st.lists(MOUNTS, max_size=3)},
)
VOLUMES = st.fixed_dictionaries(
    {"name": NAMES}, optional={"emptyDir": st.just({}), "configMap": st.just({"name": "other"})}
)
SPECS = st.fixed_dictionaries(
    {},
    optional={
        "containers": st.lists(CONTAINERS, max_size=3),
        "volumes": st.lists(VOLUMES, max_size=3),
        "terminationGracePeriodSeconds": st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    },
)
PODS = st.fixed_dictionaries({"metadata": st.just({}), "spec": SPECS})
INJECTIONS = st.builds(
    pod.Injection,
    service=st.just("billing"),
    secret_name=st.just("rabbitmq"),
    secret_key=st.just("url"),
    configmap=st.just("billing-celery-events"),
    config_hash=st.text(min_size=1, max_size=8),
    grace_seconds=st.one_of(st.none(), st.integers(min_value=0, max_value=10**6)),
)


OUR_VARIABLES = [
    variable["name"]
    for variable in pod.changes(
        {"spec": {"containers": [{"name": "w"}]}}, pod.Injection("s", "n", "k", "c", "h")
    ).containers[0]["env"]
    if variable["name"] != "PYTHONPATH"
]


def patched(body: dict[str, Any], changes: pod.PodChanges) -> dict[str, Any]:
    """The pod as the API server stores it once the webhook's patch is applied."""
    spec = {**body["spec"], "containers": changes.containers, "volumes": changes.volumes}
    if changes.grace_seconds is not None:
        spec["terminationGracePeriodSeconds"] = changes.grace_seconds
    return {"metadata": {"annotations": changes.annotations}, "spec": spec}


@given(body=PODS, injection=INJECTIONS)
def test_any_pod_is_mutated_by_appending_once_and_never_clobbering(
    body: dict[str, Any], injection: pod.Injection
) -> None:
    original = copy.deepcopy(body)
    changes = pod.changes(body, injection)
    assert body == original, "the admitted pod itself is not modified"
    containers = original["spec"].get("containers") or []
    assert len(changes.containers) == len(containers)
    for before, after in zip(containers, changes.containers, strict=True):
        for key in ("env", "volumeMounts"):
            assert after[key][: len(before.get(key) or [])] == (before.get(key) or []), key
        users = [variable.get("name") for variable in before.get("env") or []]
        added = [variable["name"] for variable in after["env"][len(users) :]]
        ours = [name for name in OUR_VARIABLES if name not in users]
        assert [name for name in added if name != "PYTHONPATH"] == ours, "each of ours once, unless the user set it"
        assert added.count("PYTHONPATH") <= 1
        mounts = after["volumeMounts"]
        assert any(mount.get("mountPath") == MOUNT_PATH or mount.get("name") == pod.VOLUME_NAME for mount in mounts)
    volumes = original["spec"].get("volumes") or []
    assert changes.volumes[: len(volumes)] == volumes
    assert any(volume.get("name") == pod.VOLUME_NAME for volume in changes.volumes)
    assert changes.annotations == {HASH_ANNOTATION: injection.config_hash}
    own = pod.grace_seconds(original)
    assert changes.grace_seconds is None or changes.grace_seconds > own
    again = pod.changes(patched(original, changes), injection)
    assert again.containers == changes.containers
    assert again.volumes == changes.volumes
    assert again.grace_seconds is None
