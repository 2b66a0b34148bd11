"""The wait target on the real control plane (issue 41): a ten-fold step in load scales the workers up before a
task's wait misses the target by more than the new pods take to start.

The operator as the chart's ServiceAccount decides, the Deployment controller and the ReplicaSet controller make the
pods, and real Celery workers (threads pool, 2 slots a pod) run 1-second tasks on a real RabbitMQ; a producer
publishes 0.5 tasks/s, then 5/s. Mocked: the kubelet and the container image (tests/support/process_kubelet.py).
"""

from __future__ import annotations

import json
import pathlib
import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.cluster.test_workers_on_cluster import Service
from tests.support.cluster import ChartOperator, Cluster
from tests.support.kube import eventually

TARGET_SECONDS = 10
QUIET = (0.5, 20)  # tasks per second, seconds
STEP = (5.0, 40)


def producer(published_log: pathlib.Path) -> str:
    """Code for a producer in a worker's environment: the two phases at their rates (on a schedule, so a slow
    publish does not lower the rate), each task's publish time recorded."""
    return (
        "import json, time\n"
        "from orders_app import order_created\n"
        "order_id = 0\n"
        f"for rate, seconds in [{QUIET!r}, {STEP!r}]:\n"
        "    begun = time.time()\n"
        "    for index in range(int(rate * seconds)):\n"
        "        time.sleep(max(0.0, begun + index / rate - time.time()))\n"
        "        order_id += 1\n"
        "        published = time.time()\n"
        "        order_created(order_id, 'long:1')\n"
        f"        with open({str(published_log)!r}, 'a') as log:\n"
        "            log.write(json.dumps({'order_id': order_id, 'at': published, 'rate': rate}) + '\\n')\n"
    )


def test_a_step_in_load_scales_up_before_the_wait_target_is_missed_by_more_than_a_pod_start(
    cluster: Cluster, namespace: str, chart_operator: ChartOperator, test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    billing = Service(cluster, namespace, tmp_path / "handled.jsonl")
    billing.start(test_vhost_url, 1)
    billing.settled(1)
    cluster.client.merge_patch(
        f"{billing.ces}/billing",
        {
            "spec": {
                "autoscaling": {
                    "enabled": True,
                    "minReplicas": 1,
                    "maxReplicas": 8,
                    "targetWaitSeconds": TARGET_SECONDS,
                    "scaleDownStabilizationSeconds": 120,
                },
            }
        },
    )
    published_log = tmp_path / "published.jsonl"
    worker = next(iter(cluster.kubelet.workers(namespace).values()))
    production = worker.spawn(producer(published_log))
    scaled_at: float | None = None  # when the operator first asked for more pods
    second_pod_at: float | None = None  # when the first of them ran
    grown = 1
    while production.poll() is None:
        if scaled_at is None and cluster.client.get(billing.deployment)["spec"]["replicas"] > 1:
            scaled_at = time.time()
        running = len(billing.running())
        if second_pod_at is None and running > 1:
            second_pod_at = time.time()
        grown = max(grown, running)
        time.sleep(0.5)
    assert production.returncode == 0, production.stderr.read() if production.stderr else ""
    assert scaled_at is not None, "the step did not scale the workers up"
    assert second_pod_at is not None, "no new pod ran"
    published = {line["order_id"]: line for line in map(json.loads, published_log.read_text().splitlines())}
    runs = eventually(lambda: _started(billing, set(published)), timeout=180, message="not every task started")
    pod_start = second_pod_at - scaled_at
    step_waits = sorted(runs[order] - line["at"] for order, line in published.items() if line["rate"] == STEP[0])
    p95 = step_waits[int(0.95 * (len(step_waits) - 1))]
    status = billing.cluster.client.get(f"{billing.ces}/billing")["status"]["autoscaling"]
    print(f"step: p95 wait {p95:.1f}s, max {step_waits[-1]:.1f}s; {grown} pods, started {pod_start:.1f}s after the"
          f" scale-up; status {status}")  # fmt: skip
    assert grown >= 3, f"5 tasks/s of 1 s need 3 pods of 2 slots; ran at most {grown}"
    assert p95 <= TARGET_SECONDS + pod_start, (
        f"p95 {p95:.1f}s, max {step_waits[-1]:.1f}s; the pods took {pod_start:.1f}s to start; status {status}"
    )
    assert status["slotsPerPod"] == 2

    # The estimate beside the measured waits, for a graph of how far it is off (the service's labels on both).
    def scraped() -> dict[tuple[str, str | None, str | None], float]:
        return {
            (sample.name, sample.labels.get("service_name"), sample.labels.get("le")): sample.value
            for family in text_string_to_metric_families(chart_operator.processes[0].scrape())
            for sample in family.samples
        }

    found = eventually(
        lambda: (s := scraped())[("celery_task_queue_wait_time_bucket", "billing", "+Inf")] >= len(published) and s,
        timeout=30,
        message="not every task's wait measured",
    )
    assert ("celery_event_operator_estimated_wait_seconds", "billing", None) in found, "no estimate exported"


def _started(billing: Service, orders: set[int]) -> dict[int, float]:
    text = billing.handled_log.read_text() if billing.handled_log.exists() else ""
    runs: dict[int, Any] = {
        run["order_id"]: run["at"] for run in map(json.loads, text.splitlines()) if run.get("phase") == "started"
    }
    assert orders <= set(runs), f"{len(orders - set(runs))} not started"
    return runs
