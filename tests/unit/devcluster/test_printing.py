from __future__ import annotations

import datetime
from typing import Any

import pytest

from celery_event_devcluster import printing
from celery_event_operator.core.api import crd

OBJ = {
    "metadata": {"name": "billing", "creationTimestamp": "2026-01-01T00:00:00Z"},
    "status": {
        "queueLength": 42,
        "conditions": [{"type": "Other", "status": "False"}, {"type": "Ready", "status": "True"}],
    },
}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param(".status.queueLength", [42], id="dotted"),
        pytest.param('.status.conditions[?(@.type=="Ready")].status', ["True"], id="filter"),
        pytest.param(".status.conditions[0].type", ["Other"], id="index"),
        pytest.param(".status.replicas", [], id="absent"),
    ],
)
def test_jsonpath(path: str, expected: list[Any]) -> None:
    assert printing.jsonpath(OBJ, path) == expected


@pytest.mark.parametrize(
    ("seconds", "expected"), [(5, "5s"), (119, "119s"), (600, "10m"), (7200, "2h"), (3 * 86400, "3d")]
)
def test_human_age(seconds: int, expected: str) -> None:
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(seconds=seconds)
    assert printing.human_age("2026-01-01T00:00:00Z", now) == expected


def test_table_uses_the_crd_printer_columns() -> None:
    table = printing.table([OBJ], crd.PRINTER_COLUMNS, "9")
    names = [column["name"] for column in table["columnDefinitions"]]
    assert names == ["Name", *(column["name"] for column in crd.PRINTER_COLUMNS)]
    cells = dict(zip(names, table["rows"][0]["cells"], strict=True))
    assert (cells["Name"], cells["Ready"], cells["Queue"], cells["Replicas"]) == ("billing", "True", 42, None)
