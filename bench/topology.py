"""Benchmark: apply N services and print the seconds until all are Ready, and the operator's AMQP
connections and channels at steady state. Run by hand (it prints figures, asserts nothing):

    .venv/bin/python bench/topology.py [--services 100] [--handlers 2] [--max-retries 10]

Uses the real operator process, the emulated Kubernetes API and the RabbitMQ at $AMQP_URL (in a
vhost of its own, removed afterwards; the management API is needed for the connection counts).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from tests.support import rabbitmq
from tests.support.kube import EmulatedApi
from tests.support.operator_process import OperatorProcess

from celery_event_operator.api import crd
from celery_event_operator.broker.connections import CONNECTION_NAME

CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"


def service(index: int, handlers: int, max_retries: int) -> dict[str, object]:
    return {
        "apiVersion": "celeryevents.io/v1alpha1", "kind": "CeleryEventService",
        "metadata": {"name": f"svc-{index:03d}"},
        "spec": {"broker": {"secretRef": {"name": "rabbitmq"}}, "retry": {"maxRetries": max_retries},
                 "events": {"handlers": [{"name": f"domain.thing{h}.happened"} for h in range(handlers)]}},
    }


def ready_count(api: EmulatedApi) -> int:
    items = api.client.get(CES)["items"]
    return sum(1 for item in items for c in (item.get("status") or {}).get("conditions", [])
               if c["type"] == "Ready" and c["status"] == "True")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=100)
    parser.add_argument("--handlers", type=int, default=2)
    parser.add_argument("--max-retries", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()

    amqp_url = os.environ.get("AMQP_URL", rabbitmq.DEFAULT_AMQP_URL)
    management = rabbitmq.Management(amqp_url, os.environ.get("RABBITMQ_MANAGEMENT_URL"))
    vhost = rabbitmq.create_vhost(management, prefix="ceo-bench")
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="ceo-bench-"))
    try:
        with EmulatedApi(workdir / "kubeconfig") as api:
            api.client.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                              crd.custom_resource_definition())
            api.client.create("/api/v1/namespaces/default/secrets", {
                "metadata": {"name": "rabbitmq"}, "stringData": {"url": rabbitmq.url_with_vhost(amqp_url, vhost)}})
            operator = OperatorProcess(api.kubeconfig, workdir / "operator.log", resync_seconds=30).start()
            try:
                started = time.monotonic()
                for index in range(args.services):
                    api.client.create(CES, service(index, args.handlers, args.max_retries))
                created = time.monotonic() - started
                while (ready := ready_count(api)) < args.services:
                    if time.monotonic() - started > args.timeout:
                        print(f"timeout: {ready}/{args.services} Ready after {args.timeout:.0f}s")
                        return 1
                    time.sleep(0.2)
                elapsed = time.monotonic() - started
                time.sleep(2)  # steady state
                connections = [c for c in management.request("GET", "/connections")
                               if c.get("vhost") == vhost
                               and (c.get("client_properties") or {}).get("connection_name") == CONNECTION_NAME]
                channels = sum(c.get("channels", 0) for c in connections)
                queues = len(management.request("GET", f"/queues/{management.vhost_path(vhost)}"))
            finally:
                operator.stop()
        per_service = args.handlers + args.max_retries + 1  # handler queues, retry levels, archive
        print(f"services: {args.services} ({args.handlers} handlers, maxRetries {args.max_retries}: "
              f"{per_service} queues each; {queues} queues on the broker)")
        print(f"created in {created:.2f}s; all Ready after {elapsed:.2f}s "
              f"({args.services / elapsed:.1f} services/s)")
        print(f"operator AMQP connections at steady state: {len(connections)}, channels: {channels}")
        return 0
    finally:
        rabbitmq.delete_vhost(management, vhost)


if __name__ == "__main__":
    sys.exit(main())
