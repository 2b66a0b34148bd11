"""The documentation's metrics table and the alert parser behind the scrape check of tests/integration/monitoring."""

from __future__ import annotations

from celery_event_operator.core.monitoring.exposition import FAMILIES
from tests.conftest import REPO
from tests.support import metric_names


def test_the_metrics_reference_documents_every_exported_metric() -> None:
    exported = {family.name for family in FAMILIES}
    assert exported == set(metric_names.documented_uses((REPO / metric_names.METRICS_PAGE).read_text()))


def test_alert_expressions_yield_their_metrics_and_labels() -> None:
    rule = {
        "spec": {
            "groups": [
                {
                    "rules": [
                        {
                            "expr": 'sum by (ns, name) (rate(a_total{q="x", skip!="y", n=~"z"}[5m])) / on (ns) b > 1',
                            "annotations": {"summary": "{{ $labels.task }} fails"},
                        }
                    ]
                }
            ]
        }
    }
    assert metric_names.alert_uses(rule) == {}, "no celery_ metric"
    rule["spec"]["groups"][0]["rules"][0]["expr"] = rule["spec"]["groups"][0]["rules"][0]["expr"].replace(
        "a_total", "celery_a_total"
    )
    assert metric_names.alert_uses(rule) == {"celery_a_total": {"ns", "name", "q", "n", "task"}}


def test_a_scrape_without_a_metric_or_a_label_is_reported() -> None:
    scrape = '# TYPE celery_worker_up gauge\ncelery_worker_up{namespace="a",hostname=""} 1.0\n'
    uses = {"celery_worker_up": {"namespace", "hostname"}, "celery_queue_length": {"queue_name"}}
    assert metric_names.missing_from(scrape, uses) == [
        "celery_queue_length (no series)",
        "celery_worker_up ['hostname']",
    ]
