"""The real operator process (`kopf run` with our handlers) against the emulated Kubernetes API."""

from __future__ import annotations

import socket
from typing import Any

import amqp
import pytest
from kombu.connection import Connection

from celery_event_operator.core.api import crd, metadata
from tests.conftest import REPO, billing_sample, create_broker_secret
from tests.support.kube import ApiError, EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess, worker_pod
from tests.support.waiting import stays

CES = "/apis/celeryevents.io/v1alpha1/namespaces/{ns}/celeryeventservices"


@pytest.fixture(autouse=True)
def broker_secrets(kube_api: EmulatedApi, test_vhost_url: str) -> None:
    for namespace in ("default", "shop", "other"):
        create_broker_secret(kube_api, test_vhost_url, namespace)


def sample(namespace: str = "default") -> dict[str, Any]:
    body: dict[str, Any] = billing_sample()
    body["metadata"]["namespace"] = namespace
    return body


def ready_condition(api: EmulatedApi, name: str = "billing", namespace: str = "default") -> dict[str, Any]:
    return condition(api, "Ready", name, namespace)


def test_sample_becomes_ready_and_tracks_generation(kube_api: EmulatedApi, operator: OperatorProcess) -> None:
    kube_api.kubectl("create", "--validate=false", "-f", str(REPO / "examples" / "billing.yaml"))
    ready = eventually(
        lambda: ready_condition(kube_api).get("status") == "True" and ready_condition(kube_api),
        message="billing never became Ready",
    )
    assert ready["reason"] == "Reconciled"
    body = kube_api.client.get(CES.format(ns="default") + "/billing")
    assert body["status"]["observedGeneration"] == 1

    table = kube_api.kubectl("get", "ces").stdout.splitlines()
    assert table[0].split() == ["NAME", "READY", "QUEUE", "CONSUMERS", "REPLICAS", "AGE"]
    assert table[1].split()[:2] == ["billing", "True"]

    kube_api.kubectl("patch", "ces", "billing", "--type=merge", "-p", '{"spec":{"retry":{"maxRetries":3}}}')
    eventually(
        lambda: kube_api.client.get(CES.format(ns="default") + "/billing")["status"].get("observedGeneration") == 2,
        message="observedGeneration did not follow the spec",
    )
    assert ready_condition(kube_api)["lastTransitionTime"] == ready["lastTransitionTime"], (
        "Ready stayed True, so its transition time must not move"
    )


def test_status_holds_only_schema_fields(kube_api: EmulatedApi, operator: OperatorProcess) -> None:
    kube_api.client.create(CES.format(ns="default"), sample())
    eventually(lambda: ready_condition(kube_api).get("status") == "True")
    body = kube_api.client.get(CES.format(ns="default") + "/billing")
    allowed = set(crd.open_api_schema()["properties"]["status"]["properties"])
    assert set(body["status"]) <= allowed, "kopf's progress and handler results stay out of status"
    # kopf's own record goes in an annotation, written after the handler's status (a moment later under load).
    eventually(
        lambda: any(
            key.startswith("celeryevents.io/")
            for key in kube_api.client.get(CES.format(ns="default") + "/billing")["metadata"].get("annotations", {})
        ),
        message="kopf's record is not in an annotation of ours",
    )


def test_invalid_spec_is_reported_without_a_retry_loop(kube_api: EmulatedApi, operator: OperatorProcess) -> None:
    # The emulated API enforces no schema: exactly a spec that "slipped past" validation.
    bad = sample()
    bad["spec"]["retry"] = {"maxRetries": 99}
    kube_api.client.create(CES.format(ns="default"), bad)
    ready = eventually(
        lambda: ready_condition(kube_api).get("reason") == "InvalidSpec" and ready_condition(kube_api),
        message="no InvalidSpec condition",
    )
    assert ready["status"] == "False"
    assert "maxRetries" in ready["message"]

    events = eventually(
        lambda: [
            e
            for e in kube_api.client.get("/api/v1/namespaces/default/events")["items"]
            if e.get("reason") == "InvalidSpec"
        ],
        message="no InvalidSpec Event",
    )
    assert events[0]["type"] == "Warning"
    assert events[0]["involvedObject"]["name"] == "billing"

    # kopf posts the Event while the handler runs and records the handled spec after it: the object settles then.
    handled = eventually(
        lambda: (
            (found := kube_api.client.get(CES.format(ns="default") + "/billing"))["metadata"]
            .get("annotations", {})
            .get("celeryevents.io/last-handled-configuration")
            and found
        ),
        message="kopf never recorded the handled spec",
    )
    version = handled["metadata"]["resourceVersion"]
    stays(
        lambda: kube_api.client.get(CES.format(ns="default") + "/billing")["metadata"]["resourceVersion"] == version,
        seconds=3,
        message="a retry loop kept patching the object",
    )
    assert operator.alive()

    kube_api.client.merge_patch(CES.format(ns="default") + "/billing", {"spec": {"retry": {"maxRetries": 5}}})
    eventually(lambda: ready_condition(kube_api).get("status") == "True", message="fixing the spec did not help")


def test_delete_completes_within_seconds(kube_api: EmulatedApi, operator: OperatorProcess) -> None:
    kube_api.client.create(CES.format(ns="default"), sample())
    eventually(lambda: ready_condition(kube_api).get("status") == "True")
    kube_api.kubectl("delete", "ces", "billing", "--wait=false")

    def gone() -> bool:
        try:
            kube_api.client.get(CES.format(ns="default") + "/billing")
        except ApiError as exc:
            return exc.status == 404
        return False

    eventually(gone, timeout=25, message="the resource was not removed")  # seconds (a loaded machine: a few more)
    assert operator.alive()


def test_without_the_webhook_the_operator_runs_its_other_handlers(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], tmp_path: Any
) -> None:
    """Issue #15: `--webhook-port 0` (the chart's webhook.enabled=false) exited at once with code 1. And its worker
    pods, which mount the settings themselves, are not said to wait for a rollout that would never stamp them (they
    were: RolloutPending, "the others get them when they are created again", for good)."""
    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "no-webhook.log", webhook=False).start()
    try:
        kube_api.kubectl("create", "--validate=false", "-f", str(REPO / "examples" / "billing-worker.yaml"))
        pod = worker_pod({metadata.SERVICE_LABEL: "billing"})
        kube_api.client.create("/api/v1/namespaces/default/pods", pod)  # as admitted with no webhook
        kube_api.client.create(CES.format(ns="default"), sample())
        eventually(lambda: ready_condition(kube_api).get("status") == "True", message="billing never became Ready")
        workers = eventually(
            lambda: (
                condition(kube_api, "WorkersConfigured").get("reason") == "SettingsNotInjected"
                and condition(kube_api, "WorkersConfigured")
            ),
            message="the pod without the webhook's settings was not said to mount them itself",
        )
        assert workers["status"] == "Unknown"
        assert "ConfigMap billing-celery-events" in workers["message"]
        assert process.alive()
        with pytest.raises(ConnectionRefusedError):  # nothing listens for admission reviews
            socket.create_connection(("127.0.0.1", process.webhook_port), timeout=1).close()
    finally:
        process.stop()


def test_a_watch_that_lags_does_not_run_a_new_resources_handlers_twice(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], tmp_path: Any
) -> None:
    """An API server under load brings watch events late: a thousand services applied at once kept the operator's
    watch more than 5 s behind, and kopf, past its consistency timeout (5 s by default), took a body without its own
    mark of the handled spec and ran a third of the new resources' change handlers again (a second full reconcile
    each; bench/scale.py counts them). What cannot exist here is the load: the emulated API brings every watch event
    7 s late instead."""
    assert kube_api.emulator is not None
    kube_api.emulator.watch_delay_seconds = 7.0
    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "lagging-watch.log", webhook=False).start()
    try:
        kube_api.client.create(CES.format(ns="default"), sample())
        eventually(
            lambda: ready_condition(kube_api).get("status") == "True", timeout=40, message="billing never became Ready"
        )
        handled = "Creation is processed"  # kopf's line once a new resource's change handlers ran
        eventually(lambda: handled in process.log(), timeout=10, message="kopf never said the creation was handled")
        stays(
            lambda: process.log().count(handled) == 1,
            seconds=20,  # past the late events of the operator's own patches, and kopf's 5 s
            message="the creation handlers ran again on a body the watch brought late",
        )
    finally:
        process.stop()
        kube_api.emulator.watch_delay_seconds = 0.0


def test_namespaced_operator_ignores_other_namespaces(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], tmp_path: Any
) -> None:
    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "ns-operator.log", "--namespace", "shop").start()
    try:
        kube_api.client.create(CES.format(ns="shop"), sample("shop"))
        kube_api.client.create(CES.format(ns="other"), sample("other"))
        eventually(lambda: ready_condition(kube_api, namespace="shop").get("status") == "True")
        stays(
            lambda: ready_condition(kube_api, namespace="other") == {},
            seconds=1,
            message="the operator touched a namespace it does not serve",
        )
    finally:
        process.stop()


def test_a_changed_immutable_field_is_refused_by_the_operator_itself(
    kube_api: EmulatedApi, operator: OperatorProcess, test_vhost_url: str
) -> None:
    """Issue #16: the emulated API (like any server without CEL) accepted a rename, and the operator built a
    second complete topology."""
    kube_api.client.create(CES.format(ns="default"), sample())
    eventually(lambda: ready_condition(kube_api).get("status") == "True", message="billing never became Ready")
    kube_api.kubectl("patch", "ces", "billing", "--type=merge", "-p", '{"spec":{"serviceName":"billing2"}}')
    refused = eventually(
        lambda: ready_condition(kube_api).get("reason") == "ImmutableFieldChanged" and ready_condition(kube_api),
        message="the rename was not refused",
    )
    assert (
        "serviceName is immutable: it was None when the resource was accepted and is 'billing2' now"
        in (refused["message"])
    )
    with Connection(test_vhost_url) as connection, pytest.raises(amqp.exceptions.NotFound):
        connection.channel().queue_declare("billing2.orders.order.created", passive=True)
    kube_api.kubectl("patch", "ces", "billing", "--type=json", "-p", '[{"op":"remove","path":"/spec/serviceName"}]')
    eventually(lambda: ready_condition(kube_api).get("status") == "True", message="setting it back did not heal")


def test_a_port_taken_between_its_pick_and_the_operators_bind_starts_it_on_other_ports(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], tmp_path: Any
) -> None:
    """The tests' processes pick free ports and bind them later; another process of the run may take one meanwhile
    (two CI runs failed so): the operator under test starts again on other ports."""
    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "taken.log")
    taken = process.metrics_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        process.start()
    try:
        assert "address already in use" in process.log().lower()
        assert process.metrics_port != taken
        assert "celery_event_operator" in process.scrape()
    finally:
        process.stop()
