"""Benchmark: the webhook's answer times while the API server has a bad minute, beside its own before the window.

    .venv/bin/python bench/api_faults.py [--runs 3]

The scenario of tests/integration/test_api_faults.py (tests/support/bad_minute.py): the real operator on the
emulated API through a proxy that, for 60 s, answers 30 % of requests with 500 and 20 % with 429, every status
patch with 409, and cuts every watch after 5 s, while ten services run, one is created, one deleted and one
changed; AdmissionReviews come back to back throughout. The webhook answers from the catalog it keeps in memory,
so the faults should add nothing to its answers: printed per run, its p50, p99 and longest answer during the
window, beside the same before the window (the reference: the same webhook on the same machine, the API
answering), and the seconds until everything healed. The test asserts what must hold; this asserts nothing.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from tests.support import bad_minute, bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    for index in range(runs):
        with (
            bench.broker_vhost() as (management, vhost, vhost_url),
            tempfile.TemporaryDirectory(prefix="ceo-bench-") as workdir,
            bench.emulated_cluster(pathlib.Path(workdir), vhost_url) as api,
        ):
            outcome = bad_minute.run(api, vhost_url, vhost, management, pathlib.Path(workdir))
            print(
                f"run {index + 1}/{runs}: {outcome.webhook_figures()}; faults {dict(outcome.proxy.counts)}; "
                f"healed {outcome.heal_seconds:.1f} s after the window",
                flush=True,
            )


if __name__ == "__main__":
    main()
