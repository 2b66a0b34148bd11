"""The worker app of bench/wait_autoscaling.py: one handler, `bench.work(seconds, published_at)`, that sleeps
`seconds` and records when it ran.

A service's app as a user writes it (`events_app()`, the settings the webhook injected). Each run appends a JSON
line to $BENCH_RECORDS/<worker hostname>.jsonl when it ends: the task id, when it was published (by the
producer's clock, the same machine's), started and ended, and the pod.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery_event_operator.runtime import events_app

EVENT = "bench.work"

app = events_app()


@app.handler(EVENT, bind=True)
def work(self: Any, seconds: float, published_at: float) -> None:
    started_at = time.time()
    time.sleep(seconds)
    ended_at = time.time()
    hostname = str(self.request.hostname)
    record = {
        "id": self.request.id,
        "published_at": published_at,
        "started_at": started_at,
        "ended_at": ended_at,
        "seconds": seconds,
        "pod": hostname.split("@", 1)[-1],
    }
    # One write of one short line on an O_APPEND file per pod: the pod's threads never interleave a line.
    with open(os.path.join(os.environ["BENCH_RECORDS"], f"{hostname}.jsonl"), "a") as log:
        log.write(json.dumps(record) + "\n")
