"""Two replicas of the real operator on the emulated API: one reconciles, both answer the webhook, and the
standby takes over when the active one is killed."""

from __future__ import annotations

import pathlib
import time
from typing import Any

import yaml

from tests.conftest import REPO, billing_sample, create_broker_secret
from tests.integration.injection.test_webhook import admitted, worker_pod
from tests.support.kube import EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess

CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
PEERING = "ceo"
LABELS = {"celeryevents.io/service": "billing"}
TAKEOVER_LIMIT_SECONDS = 40  # the peering lifetime (15 s) plus a resync and kopf's re-listing, with margin


def injects(operator: OperatorProcess) -> bool:
    pod = worker_pod(LABELS) | {"metadata": {"name": "w", "namespace": "default", "labels": LABELS}}
    patched, _ = admitted(operator, pod)
    return "celeryevents.io/config-hash" in patched["metadata"].get("annotations", {})


def generation_observed(api: EmulatedApi, generation: int) -> bool:
    return bool(api.client.get(f"{CES}/billing").get("status", {}).get("observedGeneration") == generation)


def test_one_replica_reconciles_both_answer_the_webhook_and_the_standby_takes_over(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    for name in ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        kube_api.client.create(CRDS, yaml.safe_load((REPO / "crds" / f"{name}.yaml").read_text()))
    create_broker_secret(kube_api, test_vhost_url)
    active = OperatorProcess(kube_api.kubeconfig, tmp_path / "active.log", "--peering", PEERING, "--priority", "200")
    standby = OperatorProcess(kube_api.kubeconfig, tmp_path / "standby.log", "--peering", PEERING, "--priority", "100")
    active.start()
    standby.start()
    try:
        eventually(
            lambda: "Pausing the watch-stream for celeryeventservices" in standby.log(), timeout=30, message="no pause"
        )
        kube_api.client.create(CES, billing_sample())
        eventually(lambda: condition(kube_api, "Ready").get("status") == "True", timeout=30)
        assert "Handler 'reconcile_service" not in standby.log(), "the standby reconciled"
        eventually(lambda: injects(active), timeout=10, message="the active replica's webhook")
        eventually(lambda: injects(standby), timeout=10, message="the standby's webhook (its kopf is paused)")

        active.process.kill()  # type: ignore[union-attr]  # SIGKILL: no goodbye in the peering
        killed_at = time.monotonic()
        kube_api.kubectl("patch", "ces", "billing", "--type=merge", "-p", '{"spec":{"retry":{"maxRetries":3}}}')
        assert injects(standby), "the webhook answers throughout"
        eventually(
            lambda: generation_observed(kube_api, 2),
            timeout=TAKEOVER_LIMIT_SECONDS,
            message="the standby did not take over",
        )
        print(f"takeover after SIGKILL: {time.monotonic() - killed_at:.1f} s")
        assert "Resuming operations after the pause" in standby.log()
    finally:
        active.stop()
        standby.stop()
