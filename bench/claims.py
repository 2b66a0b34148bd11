"""Benchmark: what the claim on each service name costs a resync (docs/user-guide/ownership.md).

    .venv/bin/python bench/claims.py [--services 1000]

On a vhost of its own on the shared RabbitMQ ($AMQP_URL), one connection as the operator's topology connection: N
service names claimed, each claim confirmed again as every resync does (on the kept resync channel), refused to
another resource, and released as a deletion does. Prints seconds; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
from collections.abc import Callable

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from kombu.connection import Connection
from tests.support import rabbitmq

from celery_event_operator.adapters.topology import apply
from celery_event_operator.core.service.ownership import Claimant


def timed(what: str, services: int, work: Callable[[int], object]) -> None:
    started = time.perf_counter()
    for index in range(services):
        work(index)
    elapsed = time.perf_counter() - started
    print(f"{what:<44} {elapsed:6.3f} s  ({elapsed / services * 1000:.2f} ms each)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--services", type=int, default=1000)
    services = parser.parse_args().services
    amqp_url = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    management = rabbitmq.Management(amqp_url)
    vhost = rabbitmq.create_vhost(management, "ceo-bench-claims")
    owners = [Claimant("bench", "shop", f"s{index}", "uid-1").arguments() for index in range(services)]
    others = [Claimant("bench", "shop2", f"s{index}", "uid-2").arguments() for index in range(services)]
    try:
        with Connection(rabbitmq.url_with_vhost(amqp_url, vhost)) as connection:
            connection.connect()
            print(f"{services} service names, RabbitMQ at {amqp_url.rsplit('@', 1)[-1]}")
            timed("claimed (first time)", services, lambda i: apply.claim(connection, f"s{i}", owners[i]))
            timed("confirmed, the resync channel", services, lambda i: apply.claim(connection, f"s{i}", owners[i]))
            timed("refused (held by another)", services, lambda i: apply.claim(connection, f"s{i}", others[i]))
            timed("released (a deletion)", services, lambda i: apply.release(connection, f"s{i}", owners[i]))
    finally:
        rabbitmq.delete_vhost(management, vhost)


if __name__ == "__main__":
    main()
