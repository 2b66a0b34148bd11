"""The chart, rendered offline by the real Helm engine (helm-python-sdk) and checked against the
Kubernetes schemas (kubernetes-validate, strict) of the oldest and newest supported versions."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from celery_event_devcluster.rbac import Identity, Policy, Request, forbidden_message
from celery_event_operator import cli
from celery_event_operator.adapters.kubeapi import API_CALLS
from celery_event_operator.core.api import crd
from celery_event_operator.core.monitoring.bounds import DEFAULT_MAX_TASK_NAMES
from celery_event_operator.core.monitoring.exposition import FAMILIES
from celery_event_operator.core.monitoring.state import QUEUE_WAIT_BUCKETS, RUNTIME_BUCKETS
from tests.conftest import REPO
from tests.support import metric_names

CHART = REPO / "charts" / "celery-event-operator"
KUBERNETES_VERSIONS = ("1.28.0", "1.37.0")  # the chart's kubeVersion floor, and the newest schemas here


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    rendered = helm.Chart.load(CHART).render(values, name="ceo", namespace="operators", is_install=True)
    return [doc for text in rendered.values() for doc in yaml.safe_load_all(text) if doc]


# No built-in schemas for these kinds (cert-manager's and the Prometheus Operator's).
CUSTOM_RESOURCE_KINDS = {"CustomResourceDefinition", "Certificate", "Issuer", "ServiceMonitor", "PrometheusRule"}
VALUE_SETS = [
    pytest.param({}, id="defaults"),
    pytest.param({"webhook": {"certManager": {"enabled": True}}}, id="cert-manager"),
    pytest.param({"webhook": {"existingCertSecret": "my-tls", "caBundle": "Y2E="}}, id="existing-certificate"),
    pytest.param({"webhook": {"enabled": False}}, id="no-webhook"),
    pytest.param(
        {
            "metrics": {
                "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                "prometheusRule": {"enabled": True},
                "dashboard": {"enabled": True},
                "runtimeBuckets": [0.1, 1],
                "queueWaitBuckets": [1, 60],
            }
        },
        id="service-monitor-rules-and-dashboard",
    ),
    pytest.param({"watchNamespaces": ["shop", "billing"]}, id="namespaced"),
    pytest.param({"crds": {"enabled": False}}, id="no-crds"),
    pytest.param({"sharding": {"shards": 3}}, id="sharded"),
    pytest.param({"replicaCount": 2}, id="two-replicas"),
    pytest.param(
        {
            "verbose": True,
            "image": {"repository": "registry.local/ceo", "tag": "dev"},
            "serviceAccount": {"create": False, "name": "existing"},
        },
        id="custom",
    ),
]


def test_lint_is_clean() -> None:
    result = helm.lint(str(CHART), strict=True)
    assert result["errors"] == []
    assert [m for m in result["messages"] if m["severity"] > 1] == []


@pytest.mark.parametrize("values", VALUE_SETS)
@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
def test_rendered_manifests_are_valid(values: dict[str, Any], kubernetes_version: str) -> None:
    for document in render(values):
        if document["kind"] in CUSTOM_RESOURCE_KINDS:
            continue  # the CRD is checked against our models; cert-manager's kinds have no schemas here
        kubernetes_validate.validate(document, kubernetes_version, strict=True)


def test_crd_equals_the_repository_crd_and_is_kept() -> None:
    crds = {d["metadata"]["name"]: d for d in render({}) if d["kind"] == "CustomResourceDefinition"}
    assert set(crds) == {
        "celeryeventservices.celeryevents.io",
        "celeryeventreplays.celeryevents.io",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    }
    for ours in crd.custom_resource_definitions():
        chart_crd = crds[ours["metadata"]["name"]]
        annotations = chart_crd["metadata"].pop("annotations")
        assert annotations == {"helm.sh/resource-policy": "keep"}
        assert chart_crd == ours
    for peering in ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        repository = yaml.safe_load((REPO / "crds" / f"{peering}.yaml").read_text())
        assert crds[peering]["spec"] == repository["spec"], "the chart's peering CRDs are the repository's"
    assert not [d for d in render({"crds": {"enabled": False}}) if d["kind"] == "CustomResourceDefinition"]
    unkept = [d for d in render({"crds": {"keep": False}}) if d["kind"] == "CustomResourceDefinition"]
    assert all("annotations" not in d["metadata"] for d in unkept)


def operator_roles(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's own Roles and ClusterRoles (not those aggregated into the users' built-in roles)."""
    return [
        d
        for d in documents
        if d["kind"] in ("ClusterRole", "Role")
        and not any(label.startswith("rbac.authorization.k8s.io/aggregate-to-") for label in d["metadata"]["labels"])
    ]


def test_namespaced_install_binds_roles_per_namespace() -> None:
    documents = render({"watchNamespaces": ["shop", "billing"]})
    kinds = {(d["kind"], d["metadata"].get("namespace")) for d in documents}
    assert ("Role", "shop") in kinds
    assert ("RoleBinding", "billing") in kinds
    assert "ClusterRoleBinding" not in {kind for kind, _ in kinds}
    assert {d["kind"] for d in operator_roles(documents)} == {"Role"}
    [deployment] = [d for d in documents if d["kind"] == "Deployment"]
    assert {"--namespace=shop", "--namespace=billing"} <= set(
        deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_operator_pod_is_hardened() -> None:
    [deployment] = [d for d in render({}) if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


@pytest.mark.parametrize("webhook", [True, False])
def test_the_operator_pod_is_ready_only_once_its_webhook_listens(webhook: bool) -> None:
    """Ready puts the pod behind the webhook Service; kopf opens the webhook seconds after /healthz answers, and
    a pod created in that gap is admitted unconfigured (failurePolicy Ignore)."""
    [deployment] = [d for d in render({"webhook": {"enabled": webhook}}) if d["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    readiness = container["readinessProbe"]
    if webhook:
        assert readiness["tcpSocket"] == {"port": "webhook"}
        assert "webhook" in {port["name"] for port in container["ports"]}
    else:
        assert readiness["httpGet"] == {"path": "/healthz", "port": "health"}


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"unknownKey": 1}, id="unknown-top-level-key"),
        pytest.param({"crds": {"enable": True}}, id="misspelt-nested-key"),
        pytest.param({"watchNamespaces": ["Not_A_Namespace"]}, id="bad-namespace"),
        pytest.param({"image": {"repository": "x", "pullPolicy": "Sometimes"}}, id="bad-pull-policy"),
        pytest.param({"sharding": {"shards": 0}}, id="no-shards"),
        pytest.param({"resources": {"limits": {"memory": "lots"}}}, id="bad-quantity"),
        pytest.param({"resources": {"limit": {"memory": "1Gi"}}}, id="misspelt-resources"),
        pytest.param({"metrics": {"runtimeBuckets": [0, 1]}}, id="zero-bucket"),
        pytest.param({"metrics": {"queueWaitBuckets": ["1m"]}}, id="bucket-not-a-number"),
    ],
)
def test_bad_values_are_rejected_by_the_schema(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmError):
        render(values)


def _allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    """A role's rules grant the verb on the resource (as written: no wildcards in the chart's aggregated roles)."""
    return any(group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"] for rule in rules)


# The chart's RBAC variants: cluster-wide or per namespace, one replica or a kopf peering of two.
RBAC_VARIANTS = [
    pytest.param({}, id="defaults"),
    pytest.param({"watchNamespaces": ["shop", "billing"]}, id="watchNamespaces"),
    pytest.param({"replicaCount": 2}, id="replicaCount=2"),
    pytest.param({"watchNamespaces": ["shop", "billing"], "replicaCount": 2}, id="both"),
]
# The peering object of replicas: a cluster-wide operator meets the others in a ClusterKopfPeering, a
# namespaced one in a KopfPeering per namespace; a single replica uses neither.
PEERINGS = {"kopfpeerings", "clusterkopfpeerings"}


def needed_calls(values: dict[str, Any]) -> set[tuple[str, str, str]]:
    """kubeapi.API_CALLS as this install makes them (the peering of its scope, if it has replicas)."""
    peering = "kopfpeerings" if values.get("watchNamespaces") else "clusterkopfpeerings"
    used = {peering} if values.get("replicaCount", 1) > 1 else set()
    return {call for call in API_CALLS if call[1] not in PEERINGS - used}


@pytest.mark.parametrize("values", RBAC_VARIANTS)
def test_rbac_grants_exactly_the_operators_api_calls(values: dict[str, Any]) -> None:
    """kubeapi.API_CALLS against the rendered rules, decided as the API server's RBAC decides them: every call is
    allowed where the operator makes it, and nothing else is granted. (On a real API server,
    tests/integration/cluster/test_chart_rbac_on_cluster.py checks that the running operator's calls are all in
    API_CALLS.)"""
    documents = render(values)
    [deployment] = [d for d in documents if d["kind"] == "Deployment"]
    operator = Identity.service_account("operators", deployment["spec"]["template"]["spec"]["serviceAccountName"])
    policy = Policy.of(documents)
    # Cluster-wide: granted at the cluster scope, so in every namespace; else in each watched namespace only.
    scopes = values.get("watchNamespaces") or [""]
    for namespace in scopes:
        for group, resource, verb in needed_calls(values):
            plural, _, subresource = resource.partition("/")
            request = Request(verb, group, plural, subresource, namespace if plural != "clusterkopfpeerings" else "")
            assert policy.allows(operator, request), forbidden_message(operator, request)
        assert policy.granted(operator, namespace) == needed_calls(values), "granted beyond API_CALLS"
    if values.get("watchNamespaces"):
        assert not policy.allows(operator, Request("get", "", "secrets", namespace="elsewhere")), "only watched ones"
        assert not policy.allows(operator, Request("list", "celeryevents.io", "celeryeventservices"))


def test_replicas_meet_in_a_peering_behind_a_disruption_budget() -> None:
    documents = render({"replicaCount": 2})
    [deployment] = [d for d in documents if d["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--peering=ceo-celery-event-operator" in args
    assert cli.build_parser().parse_args(args).peering == "ceo-celery-event-operator"
    [budget] = [d for d in documents if d["kind"] == "PodDisruptionBudget"]
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    single = render({})
    assert not [d for d in single if d["kind"] == "PodDisruptionBudget"]
    [role] = operator_roles(single)
    assert not [rule for rule in role["rules"] if "kopf.dev" in rule["apiGroups"]], "one replica needs no peering"
    [alone] = [d for d in single if d["kind"] == "Deployment"]
    assert alone["spec"]["strategy"] == {"type": "Recreate"}
    assert not [a for a in alone["spec"]["template"]["spec"]["containers"][0]["args"] if a.startswith("--peering")]


def test_rbac_grants_nothing_broad() -> None:
    [role] = operator_roles(render({}))
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
        if "secrets" in rule["resources"]:
            assert rule["verbs"] == ["get"], "Secrets are read by name, never listed or watched"


def test_webhook_never_blocks_pod_creation() -> None:
    documents = render({"watchNamespaces": ["shop"]})
    [configuration] = [d for d in documents if d["kind"] == "MutatingWebhookConfiguration"]
    [webhook] = configuration["webhooks"]
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["timeoutSeconds"] <= 10
    assert webhook["objectSelector"] == {"matchExpressions": [{"key": "celeryevents.io/service", "operator": "Exists"}]}
    assert webhook["namespaceSelector"]["matchExpressions"][0]["values"] == ["shop"]
    assert webhook["rules"][0]["operations"] == ["CREATE"]
    assert webhook["clientConfig"]["service"]["path"] == "/inject-celery-settings"
    assert webhook["clientConfig"]["caBundle"], "the generated CA is handed to the API server"
    [secret] = [d for d in documents if d["kind"] == "Secret"]
    assert secret["type"] == "kubernetes.io/tls"


def test_webhook_certificate_from_cert_manager() -> None:
    documents = render({"webhook": {"certManager": {"enabled": True}}})
    kinds = {d["kind"] for d in documents}
    assert {"Certificate", "Issuer"} <= kinds
    assert "Secret" not in kinds, "cert-manager writes the Secret"
    [configuration] = [d for d in documents if d["kind"] == "MutatingWebhookConfiguration"]
    assert (
        configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        == "operators/ceo-celery-event-operator-webhook"
    )
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]


def test_webhook_disabled_renders_none_of_it() -> None:
    documents = render({"webhook": {"enabled": False}})
    assert not {d["kind"] for d in documents} & {"MutatingWebhookConfiguration", "Secret"}
    assert [d["metadata"]["name"] for d in documents if d["kind"] == "Service"] == ["ceo-celery-event-operator-metrics"]
    [deployment] = [d for d in documents if d["kind"] == "Deployment"]
    assert "--webhook-port=0" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_service_monitor_scrapes_the_metrics_port() -> None:
    documents = render({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}}})
    [monitor] = [d for d in documents if d["kind"] == "ServiceMonitor"]
    [service] = [d for d in documents if d["kind"] == "Service" and d["metadata"]["name"].endswith("-metrics")]
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert not [d for d in render({}) if d["kind"] in ("ServiceMonitor", "PrometheusRule")], "both are opt-in"


def test_alert_rules_use_metrics_the_operator_exports() -> None:
    [rule] = [d for d in render({"metrics": {"prometheusRule": {"enabled": True}}}) if d["kind"] == "PrometheusRule"]
    alerts = {r["alert"]: r["expr"] for r in rule["spec"]["groups"][0]["rules"]}
    assert set(alerts) == {
        "CeleryArchiveFillingUp",
        "CeleryTaskFailureRate",
        "CeleryQueueWithoutConsumers",
        "CeleryEventsNotConsumed",
        "CeleryBrokerAlarm",
        "CeleryEventOperatorReconcileFailures",
    }
    exported = {family.name for family in FAMILIES}
    used = set(re.findall(r"\b(celery_[a-z_]+)", " ".join(alerts.values())))
    assert used <= exported, f"alerts on metrics nobody exports: {used - exported}"


def test_the_dashboard_is_an_opt_in_configmap_for_grafanas_sidecar_on_exported_metrics() -> None:
    assert not [d for d in render({}) if d["kind"] == "ConfigMap"], "opt-in"
    documents = render({"metrics": {"dashboard": {"enabled": True, "annotations": {"grafana_folder": "Celery"}}}})
    [configmap] = [d for d in documents if d["kind"] == "ConfigMap"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "Celery"}
    dashboard = json.loads(configmap["data"]["celery-event-operator.json"])
    assert dashboard == json.loads((CHART / "dashboards" / "celery-event-operator.json").read_text())
    exported = {family.name for family in FAMILIES}
    used = set(metric_names.dashboard_uses(dashboard))
    assert len(used) >= 10
    assert used <= exported, f"panels on metrics nobody exports: {used - exported}"
    other = render({"metrics": {"dashboard": {"enabled": True, "namespace": "grafana"}}})
    assert [d["metadata"]["namespace"] for d in other if d["kind"] == "ConfigMap"] == ["grafana"]


def test_metrics_options_reach_the_operator() -> None:
    def parsed(values: dict[str, Any]) -> argparse.Namespace:
        [deployment] = [d for d in render(values) if d["kind"] == "Deployment"]
        return cli.build_parser().parse_args(deployment["spec"]["template"]["spec"]["containers"][0]["args"])

    chosen = parsed(
        {
            "metrics": {
                "runtimeBuckets": [0.1, 1, 2.5, 600],
                "queueWaitBuckets": [1, 60, 3600],
                "perPodTaskSeries": True,
                "maxTaskNames": 100_000,
            }
        }
    )
    assert chosen.runtime_buckets == (0.1, 1.0, 2.5, 600.0)
    assert chosen.queue_wait_buckets == (1.0, 60.0, 3600.0)
    assert (chosen.per_pod_task_series, chosen.max_task_names) == (True, 100_000)
    defaults = parsed({})
    assert (defaults.runtime_buckets, defaults.queue_wait_buckets) == (RUNTIME_BUCKETS, QUEUE_WAIT_BUCKETS)
    assert (defaults.per_pod_task_series, defaults.max_task_names) == (False, DEFAULT_MAX_TASK_NAMES)


def test_sharded_install_runs_one_operator_per_shard_behind_the_same_services() -> None:
    documents = render({"sharding": {"shards": 3}})
    deployments = [d for d in documents if d["kind"] == "Deployment"]
    assert [d["metadata"]["name"] for d in deployments] == [f"ceo-celery-event-operator-shard-{i}" for i in range(3)]
    selectors = [d["spec"]["selector"]["matchLabels"] for d in deployments]
    for index, deployment in enumerate(deployments):
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        owned = [i for i, selector in enumerate(selectors) if selector.items() <= pod_labels.items()]
        assert owned == [index], "each Deployment selects its own pods only"
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert {f"--shard-index={index}", "--shard-count=3"} <= set(args)
        parsed = cli.build_parser().parse_args(args)  # the CLI accepts exactly what the chart passes
        assert (parsed.shard_index, parsed.shard_count) == (index, 3)
        for service in (d for d in documents if d["kind"] == "Service"):
            assert service["spec"]["selector"].items() <= pod_labels.items(), "every shard serves webhook and metrics"
    [unsharded] = [d for d in render({}) if d["kind"] == "Deployment"]
    assert unsharded["metadata"]["name"] == "ceo-celery-event-operator", "an upgrade keeps the Deployment"
    assert not any(arg.startswith("--shard") for arg in unsharded["spec"]["template"]["spec"]["containers"][0]["args"])


def test_every_value_is_described_in_the_schema() -> None:
    def undescribed(node: dict[str, Any], path: str) -> list[str]:
        missing = [] if "description" in node or not path else [path]
        for key, child in node.get("properties", {}).items():
            missing += undescribed(child, f"{path}.{key}")
        return missing

    assert undescribed(json.loads((CHART / "values.schema.json").read_text()), "") == []


def test_namespace_editors_may_replay_and_viewers_may_read() -> None:
    """Whoever may edit a namespace may create replays there (aggregated into `edit` and `admin`); nothing lets
    them read the broker's Secret through it."""
    roles = {d["metadata"]["name"]: d for d in render({}) if d["kind"] == "ClusterRole"}
    edit = roles["ceo-celery-event-operator-replays-edit"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert _allows(edit["rules"], "celeryevents.io", "celeryeventreplays", "create")
    assert _allows(edit["rules"], "celeryevents.io", "celeryeventreplays", "delete")
    assert not _allows(edit["rules"], "celeryevents.io", "celeryeventreplays/status", "patch"), "status: the operator's"
    assert not [
        rule for rule in edit["rules"] if "secrets" in rule["resources"] or "celeryeventservices" in rule["resources"]
    ]
    view = roles["ceo-celery-event-operator-view"]
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert {verb for rule in view["rules"] for verb in rule["verbs"]} == {"get", "list", "watch"}
    assert not [d for d in render({"watchNamespaces": ["shop"]}) if d["kind"] == "ClusterRoleBinding"]
    kinds = [d["metadata"]["name"] for d in render({"rbac": {"aggregateToEdit": False, "aggregateToView": False}})]
    assert "ceo-celery-event-operator-replays-edit" not in kinds
    assert "ceo-celery-event-operator-view" not in kinds


def test_each_installation_names_itself_in_its_claims_every_shard_alike() -> None:
    def installation_ids(values: dict[str, Any]) -> set[str]:
        deployments = [d for d in render(values) if d["kind"] == "Deployment"]
        args = [d["spec"]["template"]["spec"]["containers"][0]["args"] for d in deployments]
        return {cli.build_parser().parse_args(arguments).installation_id for arguments in args}

    assert installation_ids({}) == {"operators/ceo-celery-event-operator"}
    assert installation_ids({"sharding": {"shards": 3}}) == {"operators/ceo-celery-event-operator"}
    assert installation_ids({"installationId": "team-a"}) == {"team-a"}
