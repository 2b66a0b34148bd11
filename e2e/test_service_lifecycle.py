"""A CeleryEventService on a real cluster: the operator installed by the chart makes it Ready."""

from __future__ import annotations

import pathlib

from e2e.conftest import Kubectl, eventually

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def ready(kubectl: Kubectl, name: str) -> dict[str, str]:
    status = kubectl.json("get", "ces", name).get("status") or {}
    return next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})


def test_sample_becomes_ready_and_is_deleted(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", str(EXAMPLES / "billing.yaml"))
    try:
        condition = eventually(lambda: ready(kubectl, "billing").get("status") == "True" and ready(kubectl, "billing"))
        assert condition["reason"] == "Reconciled"
        assert "billing" in kubectl("get", "ces")
    finally:
        kubectl("delete", "-f", str(EXAMPLES / "billing.yaml"), "--timeout=60s")
    assert "billing" not in kubectl("get", "ces", "--ignore-not-found")


def test_schema_rejects_a_bad_resource(kubectl: Kubectl) -> None:
    bad = (EXAMPLES / "billing.yaml").read_text().replace("name: billing\n", "name: bad-retries\n", 1)
    bad += "  retry: {maxRetries: 99}\n"
    result = kubectl.run("apply", "-f", "-", stdin=bad)
    assert result.returncode != 0, "the API server accepted maxRetries 99"
    assert "maxRetries" in result.stderr
