"""Which metric names and labels the chart's alerts, the documentation and the celery-mixin rely on, and whether a
scrape of /metrics carries them (pure text work: the tests feed it a real scrape)."""

from __future__ import annotations

import collections
import itertools
import re
from collections.abc import Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Uses = dict[str, set[str]]  # metric (family or sample name) → labels its users select, group or print by
SERVICE_LABELS = {"namespace", "service_name"}

# What danihodovic/celery-exporter's celery-mixin (its alerts and its three dashboards) selects, groups by or
# reads with label_values (`cluster` and `job` are Prometheus' target labels; negative matchers need no label).
CELERY_MIXIN: Uses = {
    **{
        f"celery_task_{kind}_total": {"namespace", "name", "queue_name"}
        for kind in ("sent", "received", "succeeded", "retried", "revoked", "rejected")
    },
    "celery_task_failed_total": {"namespace", "name", "queue_name", "exception"},
    "celery_task_runtime_bucket": {"namespace", "name", "queue_name", "le"},
    "celery_task_runtime_sum": {"namespace", "name", "queue_name"},
    "celery_queue_length": {"namespace", "queue_name"},
    "celery_worker_up": {"namespace", "hostname"},
    "celery_worker_tasks_active": {"namespace"},
}


def labels_in(promql: str) -> set[str]:
    """Labels an expression matches positively, groups or joins by."""
    grouped = {
        label.strip()
        for clause in re.findall(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)", promql)
        for label in clause.split(",")
    }
    matched = {
        label
        for selector in re.findall(r"\{([^}]*)\}", promql)
        for label in re.findall(r"([a-zA-Z_]\w*)\s*=~?(?!=)", selector)
    }
    return (grouped | matched) - {""}


def alert_uses(prometheus_rule: dict[str, Any]) -> Uses:
    uses: Uses = collections.defaultdict(set)
    for group in prometheus_rule["spec"]["groups"]:
        for rule in group["rules"]:
            labels = labels_in(rule["expr"])
            labels |= set(re.findall(r"\$labels\.(\w+)", " ".join(rule.get("annotations", {}).values())))
            for metric in set(re.findall(r"\b(celery_\w+)", rule["expr"])):
                uses[metric] |= labels
    return dict(uses)


def dashboard_uses(dashboard: dict[str, Any]) -> Uses:
    """Every query of a Grafana dashboard: its panels' targets (and legends) and its variables."""
    queries = [
        (target["expr"], target.get("legendFormat", ""))
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]
    queries += [(variable["query"], "") for variable in dashboard["templating"]["list"] if variable["type"] == "query"]
    uses: Uses = collections.defaultdict(set)
    for expr, legend in queries:
        labels = labels_in(expr) | set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
        labels |= set(re.findall(r"label_values\(.*,\s*(\w+)\s*\)", expr))
        for metric in set(re.findall(r"\b(celery_\w+)", expr)):
            uses[metric] |= labels
    return dict(uses)


def _expand(name: str) -> list[str]:
    """`celery_task_{sent,received}_total` → both names."""
    parts = re.split(r"\{([^}]*)\}", name)
    choices = [[part] if index % 2 == 0 else part.split(",") for index, part in enumerate(parts)]
    return ["".join(combination) for combination in itertools.product(*choices)]


def _backticked(text: str) -> list[str]:
    groups = re.findall(r"`([^`]*)`", text.split("(", 1)[0])
    return [item.strip() for group in groups for item in re.split(r",(?![^{]*\})", group)]  # not inside {a,b}


# The page whose table lists every metric the operator exports, with its labels.
METRICS_PAGE = "docs/reference/metrics.md"


def documented_uses(page: str) -> Uses:
    """The metrics table of the documentation (`METRICS_PAGE`): metric | labels (`…` continues the row above; `only`:
    no service labels)."""
    table = page.split("| metric | labels |", 1)[1].split("\n\n", 1)[0]
    uses: Uses = {}
    previous: set[str] = set()
    for row in table.splitlines()[2:]:
        metric_cell, labels_cell = (cell.strip() for cell in row.strip("|").split("|")[:2])
        labels = set(_backticked(labels_cell)) | (previous if labels_cell.startswith("…") else set())
        previous = labels
        if not labels_cell.split("(", 1)[0].rstrip().endswith("only"):
            labels = labels | SERVICE_LABELS
        for pattern in _backticked(metric_cell):
            for metric in _expand(pattern):
                uses[metric] = labels
    return uses


def missing_from(scrape: str, uses: Uses) -> list[str]:
    """Each metric with the labels it is used with that no series of the scrape carries."""
    carried: dict[str, set[str]] = collections.defaultdict(set)
    for family in text_string_to_metric_families(scrape):
        for sample in family.samples:
            for name in (family.name, sample.name):
                carried[name] |= {label for label, value in sample.labels.items() if value != ""}
    return [
        f"{metric} {sorted(labels - carried[metric])}" if metric in carried else f"{metric} (no series)"
        for metric, labels in sorted(uses.items())
        if metric not in carried or not labels <= carried[metric]
    ]


def merged(*uses: Iterable[tuple[str, set[str]]]) -> Uses:
    found: Uses = collections.defaultdict(set)
    for items in uses:
        for metric, labels in items:
            found[metric] |= labels
    return dict(found)
