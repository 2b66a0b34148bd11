"""Property-based fuzzing of every parser of input that others control (hypothesis).

A producer on a service's events exchange writes the events and the archive, a user writes a Secret's broker URL
and a resource's spec, a pod's author writes the pod the webhook mutates, and the broker writes the frames. Each test
states the contract such input is held to (handled, or refused as documented), over generated input.

Two profiles, chosen by HYPOTHESIS_PROFILE: `ci` (the default, what `./dev test` runs) is short, bounded and
repeatable — the same examples every run (derandomized), no example database; `long` is the run by hand (see
bench/README.md): many more examples, new ones each run, and the failures it finds kept in .hypothesis/ to be
replayed first the next time.
"""

from __future__ import annotations

import importlib
import os
import pkgutil

from hypothesis import HealthCheck, settings

import celery_event_devcluster
import celery_event_operator

# Hypothesis draws some values from the literals of the project's own modules loaded when it generates (its "local
# constants"): which ones depends on what ran before in the process, so `ci`'s examples changed with the test files an
# xdist worker was given (a failure seen in one run and not the next). Loading every module first makes them the same
# in every run.
for _package in (celery_event_operator, celery_event_devcluster):
    for _module in pkgutil.walk_packages(_package.__path__, f"{_package.__name__}."):
        importlib.import_module(_module.name)

settings.register_profile(
    "ci",
    max_examples=400,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "long",
    max_examples=20_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
