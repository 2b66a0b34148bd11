"""The lifecycle tests' fleet of worker pods (fleet.py)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from tests.conftest import REPO
from tests.integration.lifecycle.fleet import Fleet
from tests.support.kube import EmulatedApi
from tests.support.operator_process import OperatorProcess


@pytest.fixture
def fleet(kube_api: EmulatedApi, operator: OperatorProcess, tmp_path: pathlib.Path) -> Iterator[Fleet]:
    """The real operator (conftest's, stopped after the workers) and the sample's workload, workers to start."""
    kube_api.kubectl("create", "--validate=false", "-f", str(REPO / "examples" / "billing-worker.yaml"))
    found = Fleet(kube_api, operator, tmp_path, tmp_path / "handled.jsonl")
    yield found
    found.stop_all()
