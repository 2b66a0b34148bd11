"""`celery-event-operator run | dev | topology | archive | crd`."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import pathlib
import random
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from celery_event_operator import options as options_module
from celery_event_operator.monitoring.bounds import DEFAULT_MAX_TASK_NAMES
from celery_event_operator.monitoring.state import QUEUE_WAIT_BUCKETS, RUNTIME_BUCKETS
from celery_event_operator.options import OperatorOptions, WebhookOptions

DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"
DEFAULT_EXAMPLES = ("examples/broker-secret.yaml", "examples/billing.yaml", "examples/billing-worker.yaml")
COMMANDS_ENTRY_POINTS = "celery_event_operator.commands"
# The chart cannot reach files outside its directory, so it carries its own copy of the CRD.
CRD_OUTPUT_DIRS = ("crds", "charts/celery-event-operator/files/crds")


def _cmd_crd(args: argparse.Namespace) -> int:
    from celery_event_operator.api import crd

    rendered = crd.render_yaml()
    stale = False
    for directory in args.output_dir or CRD_OUTPUT_DIRS:
        target = pathlib.Path(directory) / crd.CRD_FILE_NAME
        if args.check:
            if not target.exists() or target.read_text() != rendered:
                print(f"{target} differs from the models; run `celery-event-operator crd`", file=sys.stderr)
                stale = True
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(rendered)
        print(target)
    return 1 if stale else 0


def _options(args: argparse.Namespace) -> OperatorOptions:
    webhook = (
        WebhookOptions(
            port=args.webhook_port,
            addr=args.webhook_addr,
            host=args.webhook_host,
            cert_file=args.webhook_cert,
            key_file=args.webhook_key,
        )
        if args.webhook_port
        else None
    )
    return OperatorOptions(
        resync_seconds=args.resync_seconds,
        metrics_port=args.metrics_port,
        metrics_addr=args.metrics_addr,
        runtime_buckets=args.runtime_buckets,
        queue_wait_buckets=args.queue_wait_buckets,
        per_pod_task_series=args.per_pod_task_series,
        max_task_names=args.max_task_names,
        webhook=webhook,
        namespaces=tuple(getattr(args, "namespace", ()) or ()),
        shard_index=getattr(args, "shard_index", 0),
        shard_count=getattr(args, "shard_count", 1),
        peering=getattr(args, "peering", None),
        priority=_priority(getattr(args, "priority", None)),
    )


def _priority(given: int | None) -> int:
    # Replicas of equal priority all pause (kopf's rule against double processing): a random one never ties.
    return given if given is not None else random.randint(1, 2**31 - 1)


def _add_webhook_options(parser: argparse.ArgumentParser, default_addr: str) -> None:
    parser.add_argument("--metrics-port", type=int, default=9808, help="port of /metrics (0: none)")
    parser.add_argument("--metrics-addr", default=default_addr, help="address /metrics listens on")
    parser.add_argument(
        "--runtime-buckets",
        type=_buckets,
        default=RUNTIME_BUCKETS,
        help="upper bounds of celery_task_runtime's buckets, seconds, comma-separated (+Inf is added)",
    )
    parser.add_argument(
        "--queue-wait-buckets",
        type=_buckets,
        default=QUEUE_WAIT_BUCKETS,
        help="upper bounds of celery_task_queue_wait_time's buckets, seconds, comma-separated (+Inf is added)",
    )
    parser.add_argument(
        "--per-pod-task-series",
        action="store_true",
        help="label task series with the worker's hostname (celery-exporter's shape: series per pod), for the "
        "services whose spec.monitoring.perPodTaskSeries is unset",
    )
    parser.add_argument(
        "--max-task-names",
        type=_positive_int,
        default=DEFAULT_MAX_TASK_NAMES,
        help="most task names with series of their own per service (the others count under "
        'name="__overflow__"), for the services whose spec.monitoring.maxTaskNames is unset',
    )
    parser.add_argument("--webhook-port", type=int, default=9443, help="HTTPS port of the admission webhook (0: none)")
    parser.add_argument("--webhook-addr", default=default_addr, help="address the webhook listens on")
    parser.add_argument("--webhook-host", default="localhost", help="host name in a self-signed certificate")
    parser.add_argument("--webhook-cert", help="server certificate (PEM); self-signed when absent")
    parser.add_argument("--webhook-key", help="its private key (PEM)")


def _cmd_run(args: argparse.Namespace) -> int:
    if not 0 <= args.shard_index < args.shard_count:
        print(f"error: --shard-index must be in 0..{args.shard_count - 1}", file=sys.stderr)
        return 2
    import kopf

    from celery_event_operator.handlers import admission  # importing the handlers registers them

    options = _options(args)
    if options.webhook is not None:
        admission.register(kopf.get_default_registry())
    kopf.configure(verbose=args.verbose)
    kopf.run(
        # Alone, or one of several replicas of which only the one of highest priority in the peering works.
        standalone=options.peering is None,
        peering_name=options.peering,
        priority=options.priority,
        clusterwide=not options.namespaces,
        namespaces=options.namespaces,
        liveness_endpoint=args.liveness or None,
        memo=kopf.Memo(options=options),
    )
    return 0


def _cmd_dev(args: argparse.Namespace) -> int:
    # The dev mode ships beside the operator (package celery_event_devcluster, extra `devcluster`) and is found
    # through its entry point, so the operator itself never imports it.
    try:
        (entry,) = importlib.metadata.entry_points(group=COMMANDS_ENTRY_POINTS, name="dev")
        run_dev = entry.load()
    except (ValueError, ModuleNotFoundError):
        print(
            "the dev mode needs the devcluster extra: pip install 'celery-event-operator[devcluster]'", file=sys.stderr
        )
        return 2
    status: int = run_dev(args, _options(args))
    return status


def _service_and_broker(args: argparse.Namespace, name: str) -> tuple[str, Any, Any]:
    """(serviceName, its spec or None, its broker's control connection): through the Kubernetes API (the
    resource and its Secret), or from --broker-url."""
    from celery_event_operator import service_status
    from celery_event_operator.broker import address as broker_address
    from celery_event_operator.broker.control import ControlConnection
    from celery_event_operator.broker.secret import read_settings
    from celery_event_operator.broker.tls import TlsFiles
    from celery_event_operator.kubeapi import KubeApi

    if args.broker_url and getattr(args, "no_cluster", False):
        return name, None, ControlConnection(broker_address.parse(args.broker_url))
    kube = KubeApi.from_environment()
    validated = service_status.validate(kube.read_service(args.namespace, name))
    spec = validated.spec
    if args.broker_url:
        address = broker_address.parse(
            args.broker_url, failover_strategy=spec.broker.failover_strategy, vhost_override=spec.broker.vhost
        )
        return validated.service_name, spec, ControlConnection(address)
    settings = read_settings(kube, args.namespace, spec)
    tls = TlsFiles(settings.tls) if settings.tls.ca or settings.tls.cert else None
    return validated.service_name, spec, ControlConnection(settings.address, tls)


def _cmd_topology(args: argparse.Namespace) -> int:
    from celery_event_operator.errors import OperatorError
    from celery_event_operator.topology import apply, listing, plan

    try:
        service, spec, broker = _service_and_broker(args, args.name)
        topology = plan.plan(service, spec)
        states = broker.run(lambda connection: apply.inspect(connection, topology))
    except OperatorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    listed = listing.rows(topology, states)
    print(
        json.dumps(listed, indent=2)
        if args.json
        else f"service {topology.service!r} on {broker.address.display}\n{listing.table(listed)}"
    )
    return 0 if all(row["state"] == "ok" for row in listed) else 3


def _duration(text: str) -> float:
    """'90', '90s', '5m', '2h', '1d' → seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90, 90s, 5m, 2h, 1d)") from None


def _buckets(text: str) -> tuple[float, ...]:
    """`0.1,0.5,1,5`: increasing, finite, positive upper bounds."""
    try:
        bounds = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated numbers: {text!r}") from None
    if not all(0 < bound < math.inf for bound in bounds) or list(bounds) != sorted(set(bounds)):
        raise argparse.ArgumentTypeError(f"bounds must be positive, finite and increasing: {text!r}")
    return bounds


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive integer: {text!r}")
    return value


def _progress(done: int, total: int) -> None:
    if sys.stderr.isatty():
        filled = int(30 * done / max(total, 1))
        print(f"\rreplaying {done}/{total} [{'#' * filled}{'.' * (30 - filled)}]", end="", file=sys.stderr, flush=True)


def _cmd_archive(args: argparse.Namespace) -> int:
    from celery_event_operator.archive import operations
    from celery_event_operator.errors import OperatorError

    if args.action == "purge" and not args.yes:
        print("error: purging deletes archived events for good; add --yes", file=sys.stderr)
        return 2
    args.no_cluster = True  # with --broker-url, SERVICE is the serviceName: no cluster needed
    try:
        service, _spec, broker = _service_and_broker(args, args.service)
        selection = operations.Selection(event=args.event, older_than=args.older_than, newer_than=args.newer_than)
        output = broker.run(lambda connection: _archive_action(args, connection, service, selection))
    except OperatorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(output)
    return 0


def _archive_action(args: argparse.Namespace, connection: Any, service: str, selection: Any) -> str:
    from celery_event_operator.archive import messages, operations

    if args.action == "list":
        items = operations.list_archive(connection, service, selection)
        now = time.time()
        if not items and not args.json:
            print(f"no archived events of {service} match", file=sys.stderr)
        return json.dumps([item.as_json(now) for item in items], indent=2) if args.json else messages.table(items, now)
    if args.action == "replay":
        summary = operations.replay(
            connection, service, selection, limit=args.limit, dry_run=args.dry_run, rate=args.rate, progress=_progress
        )
        if sys.stderr.isatty():
            print(file=sys.stderr)
        verb = "would replay" if args.dry_run else "replayed"
        return (
            f"{verb} {summary.done} of {summary.matched} matching ({summary.archived} archived) "
            f"to {summary.target}; {summary.archived - summary.done} stay archived"
            + (f"; {summary.unroutable} found no queue and stay" if summary.unroutable else "")
        )
    summary = operations.purge(connection, service, selection)
    return f"purged {summary.done} of {summary.archived} archived"


def _add_run_command(commands: Any) -> None:
    run = commands.add_parser(
        formatter_class=_Help,
        name="run",
        help="run the operator against the configured cluster (kubeconfig or in-cluster)",
    )
    run.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="serve only this namespace (repeatable); cluster-wide when absent",
    )
    run.add_argument("--liveness", default=DEFAULT_LIVENESS, help="liveness endpoint URL ('' disables)")
    run.add_argument(
        "--resync-seconds",
        type=float,
        default=options_module.DEFAULT_RESYNC_SECONDS,
        help="how often each service's topology is re-declared (its queue lengths: spec.statusIntervalSeconds)",
    )
    run.add_argument(
        "--shard-count",
        type=_positive_int,
        default=1,
        help="split the services between this many operator Deployments by a stable hash of namespace/name",
    )
    run.add_argument(
        "--shard-index", type=int, default=0, help="which of the --shard-count shards this operator keeps (0-based)"
    )
    run.add_argument(
        "--peering",
        metavar="NAME",
        help="run as one of several replicas: the one of highest priority in the kopf peering NAME reconciles, "
        "the others stand by (and answer the webhook); without it the operator runs alone",
    )
    run.add_argument(
        "--priority",
        type=int,
        help="this replica's priority in --peering (default: random, so that no two replicas tie)",
    )
    _add_webhook_options(run, "0.0.0.0")
    run.add_argument("--verbose", "-v", action="store_true", help="debug logging (kopf's --verbose)")
    run.set_defaults(handler=_cmd_run)


class _Help(argparse.HelpFormatter):
    """Each option's default in its help, where there is one worth showing and the help does not say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, [], argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


DESCRIPTION = """\
A Kubernetes operator for Celery services on RabbitMQ: each CeleryEventService gets its retry and
archive topology declared, consistent Celery settings injected into its worker pods, Prometheus
metrics from its Celery events, and its queue length in status for autoscaling.

"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="celery-event-operator",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="`celery-event-operator COMMAND --help` for a command's options. Documentation: README.md.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {importlib.metadata.version('celery-event-operator')}"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_run_command(commands)

    dev = commands.add_parser(
        formatter_class=_Help, name="dev", help="run the operator with the samples on an embedded Kubernetes API"
    )
    dev.add_argument("--api-port", type=int, default=18443, help="port of the embedded API (0: any free port)")
    dev.add_argument("--state-dir", default=".dev", help="where the kubeconfig is written")
    dev.add_argument(
        "--broker-url",
        help="broker URL put into the sample's Secret, used as it is (default: $AMQP_URL or the local broker, "
        "in a vhost of the dev mode's own, celery-event-operator-dev, made at start)",
    )
    dev.add_argument(
        "--down",
        action="store_true",
        help="remove what the dev mode made on the broker (its vhost, with everything declared in it) and stop",
    )
    dev.add_argument(
        "--example",
        action="append",
        default=[],
        help=f"manifests to create at start (repeatable; default: {' '.join(DEFAULT_EXAMPLES)})",
    )
    dev.add_argument("--liveness", default="http://127.0.0.1:8080/healthz", help="liveness endpoint URL ('' disables)")
    dev.add_argument(
        "--resync-seconds", type=float, default=10.0, help="how often each service's topology is re-declared"
    )
    dev.add_argument(
        "--no-sample-worker",
        action="store_true",
        help="do not run examples/app/billing_app.py locally with a trickle of events",
    )
    _add_webhook_options(dev, "127.0.0.1")
    dev.add_argument("--verbose", "-v", action="store_true", help="debug logging (kopf's --verbose)")
    dev.set_defaults(handler=_cmd_dev)

    topology = commands.add_parser(
        formatter_class=_Help,
        name="topology",
        help="list a service's planned queues and exchanges with their depths on the broker",
    )
    topology.add_argument("name", help="the CeleryEventService")
    topology.add_argument("--namespace", "-n", default="default", help="the resource's namespace")
    topology.add_argument("--broker-url", help="use this URL instead of the resource's Secret")
    topology.add_argument("--json", action="store_true", help="print JSON rows")
    topology.set_defaults(handler=_cmd_topology)

    archive = commands.add_parser(
        formatter_class=_Help, name="archive", help="list, replay or purge a service's archived events"
    )
    actions = archive.add_subparsers(dest="action", required=True)
    for action, text in (
        ("list", "show the archived events (reading changes nothing)"),
        ("replay", "send archived events back to the service's handler queues"),
        ("purge", "delete archived events"),
    ):
        sub = actions.add_parser(formatter_class=_Help, name=action, help=text)
        sub.add_argument("service", help="the CeleryEventService (with --broker-url: its serviceName)")
        sub.add_argument("--namespace", "-n", default="default", help="the resource's namespace")
        sub.add_argument("--broker-url", help="connect here instead of through the resource's Secret")
        sub.add_argument("--event", help="only events of this name (routing key)")
        sub.add_argument("--older-than", type=_duration, help="only events archived longer ago (90s, 5m, 2h, 1d)")
        sub.add_argument("--newer-than", type=_duration, help="only events archived more recently")
        sub.set_defaults(handler=_cmd_archive)
        if action == "list":
            sub.add_argument("--json", action="store_true", help="print JSON rows")
        if action == "replay":
            sub.add_argument("--limit", type=int, help="replay at most this many")
            sub.add_argument("--dry-run", action="store_true", help="count what would be replayed; change nothing")
            sub.add_argument("--rate", type=float, help="at most this many per second")
        if action == "purge":
            sub.add_argument("--yes", action="store_true", help="confirm the deletion")

    crd_command = commands.add_parser(formatter_class=_Help, name="crd", help="render crds/ from the API models")
    crd_command.add_argument(
        "--output-dir",
        action="append",
        default=[],
        help=f"where to write (repeatable; default: {' '.join(CRD_OUTPUT_DIRS)})",
    )
    crd_command.add_argument("--check", action="store_true", help="fail if the committed CRD is stale")
    crd_command.set_defaults(handler=_cmd_crd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.handler(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly, as Unix tools do, with SIGPIPE's status.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return status


if __name__ == "__main__":
    sys.exit(main())
