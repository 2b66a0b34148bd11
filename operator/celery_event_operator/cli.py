"""`celery-event-operator run | topology | archive | crd`, and `dev` from the dev cluster's distribution."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import json
import math
import os
import pathlib
import random
import re
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from celery_event_operator.core import options as options_module
from celery_event_operator.core.lifecycle.long_tasks import DEFAULT_BROKER_CONSUMER_TIMEOUT_SECONDS
from celery_event_operator.core.monitoring.bounds import DEFAULT_MAX_TASK_NAMES
from celery_event_operator.core.monitoring.state import QUEUE_WAIT_BUCKETS, RUNTIME_BUCKETS
from celery_event_operator.core.options import OperatorOptions, WebhookOptions

DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"
INSTALLATION_ID = re.compile(r"[A-Za-z0-9._/-]{1,100}")
# Commands of other distributions: each entry point of this group names a function that adds its command's
# subparser (with its handler), so that the operator never imports them. Those a checkout ships are listed with
# how to install them, which is what the command says when it is absent.
COMMANDS_ENTRY_POINTS = "celery_event_operator.commands"
SHIPPED_COMMANDS = {
    "dev": "the distribution celery-event-devcluster (devcluster/ in the source tree): "
    "`pip install -e ./devcluster` in a checkout, as ./dev setup does",
}
# The chart cannot reach files outside its directory, so it carries its own copy of the CRD.
CRD_OUTPUT_DIRS = ("crds", "charts/celery-event-operator/files/crds")
# The fields' reference of the documentation, rendered from the same schemas.
CRD_REFERENCE_FILE = "docs/reference/crds.md"


def _cmd_crd(args: argparse.Namespace) -> int:
    from celery_event_operator.core.api import crd, crd_reference

    renderings = [
        (pathlib.Path(directory) / kind.file_name, crd.render_yaml(kind))
        for kind in crd.KINDS
        for directory in args.output_dir or CRD_OUTPUT_DIRS
    ]
    reference = args.reference_file or (None if args.output_dir else CRD_REFERENCE_FILE)
    if reference:
        renderings.append((pathlib.Path(reference), crd_reference.render_markdown()))
    stale = False
    for target, rendered in renderings:
        if args.check:
            if not target.exists() or target.read_text() != rendered:
                print(f"{target} differs from the models; run `celery-event-operator crd`", file=sys.stderr)
                stale = True
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(rendered)
        print(target)
    return 1 if stale else 0


def operator_options(args: argparse.Namespace) -> OperatorOptions:
    """The operator's options from the flags of `add_operator_options` (`run`'s, and those of `dev`)."""
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
        broker_consumer_timeout_seconds=args.broker_consumer_timeout,
        installation_id=getattr(args, "installation_id", options_module.DEFAULT_INSTALLATION_ID),
    )


def _installation_id(value: str) -> str:
    if not INSTALLATION_ID.fullmatch(value):
        raise argparse.ArgumentTypeError("1 to 100 letters, digits, '.', '_', '-' or '/'")
    return value


def _priority(given: int | None) -> int:
    # Replicas of equal priority all pause (kopf's rule against double processing): a random one never ties.
    return given if given is not None else random.randint(1, 2**31 - 1)


def add_operator_options(parser: argparse.ArgumentParser, default_addr: str) -> None:
    """The metrics and webhook flags of a command that runs the operator, and its logging."""
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging (kopf's --verbose)")
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
    parser.add_argument(
        "--broker-consumer-timeout",
        type=_positive_int,
        default=DEFAULT_BROKER_CONSUMER_TIMEOUT_SECONDS,
        help="the brokers' delivery-acknowledgement timeout in seconds (rabbitmq.conf consumer_timeout; RabbitMQ's "
        "default is 1800): a task longer than it runs twice, but on RabbitMQ 4.3's quorum queues (the workers ask for "
        "their own) and classic queues (none)",
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

    options = operator_options(args)
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


def _service_and_broker(args: argparse.Namespace, name: str) -> tuple[str, Any, Any]:
    """(serviceName, its spec or None, its broker's control connection): through the Kubernetes API (the
    resource and its Secret), or from --broker-url."""
    from celery_event_operator.adapters.broker.control import ControlConnection
    from celery_event_operator.adapters.broker.secrets import read_settings
    from celery_event_operator.adapters.broker.tls import TlsFiles
    from celery_event_operator.adapters.kubeapi import KubeApi
    from celery_event_operator.core.broker import address as broker_address
    from celery_event_operator.core.service import spec as specs

    if args.broker_url and getattr(args, "no_cluster", False):
        return name, None, ControlConnection(broker_address.parse(args.broker_url))
    kube = KubeApi.from_environment()
    validated = specs.validate(kube.read_service(args.namespace, name))
    spec = validated.spec
    if args.broker_url:
        address = broker_address.parse(
            args.broker_url, failover_strategy=spec.broker.failover_strategy, vhost_override=spec.broker.vhost
        )
        return validated.service_name, spec, ControlConnection(address)
    settings = read_settings(kube, args.namespace, spec)
    tls = TlsFiles.of(settings.tls)
    return validated.service_name, spec, ControlConnection(settings.address, tls)


def _cmd_topology(args: argparse.Namespace) -> int:
    from celery_event_operator.adapters.topology import apply
    from celery_event_operator.core.errors import OperatorError
    from celery_event_operator.core.topology import listing, plan

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


def _progress(done: int, total: int | None, verb: str = "replaying") -> None:
    if not sys.stderr.isatty():
        return
    if total is None:  # counted as it goes
        print(f"\r{verb} {done}", end="", file=sys.stderr, flush=True)
        return
    filled = int(30 * done / max(total, 1))
    print(f"\r{verb} {done}/{total} [{'#' * filled}{'.' * (30 - filled)}]", end="", file=sys.stderr, flush=True)


def _cmd_archive(args: argparse.Namespace) -> int:
    from celery_event_operator.core.archive.messages import Selection
    from celery_event_operator.core.errors import OperatorError

    if args.action == "purge" and not args.yes:
        print("error: purging deletes archived events for good; add --yes", file=sys.stderr)
        return 2
    if getattr(args, "via_cluster", False):
        return _archive_via_cluster(args)
    args.no_cluster = True  # with --broker-url, SERVICE is the serviceName: no cluster needed
    try:
        service, spec, broker = _service_and_broker(args, args.service)
        queue_type = spec.queue_type if spec is not None else args.queue_type
        selection = Selection.relative(
            events=args.event,
            exception_types=args.exception,
            task_ids=args.task_id,
            older_than=args.older_than,
            newer_than=args.newer_than,
            now=time.time(),
        )
        output = broker.run(lambda connection: _archive_action(args, connection, service, selection, queue_type))
    except OperatorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(output)
    return 0


FOLLOW_SECONDS = 0.5
NO_OPERATOR_HINT_SECONDS = 15.0


def _archive_via_cluster(args: argparse.Namespace) -> int:
    """Create a CeleryEventReplay (the user's RBAC, a record in the cluster) and follow it to its end."""
    from celery_event_operator.adapters.kubeapi import KubeApi
    from celery_event_operator.core.errors import InvalidSpecError, OperatorError
    from celery_event_operator.core.replay import replay_view

    if args.broker_url:
        print("error: --via-cluster goes through the operator's broker access: leave out --broker-url", file=sys.stderr)
        return 2
    purge = args.action == "purge"
    rate = getattr(args, "rate", None)
    if rate is not None and (rate < 1 or not float(rate).is_integer()):
        print("error: with --via-cluster, --rate is a whole number of events a second (at least 1)", file=sys.stderr)
        return 2
    try:
        manifest = replay_view.manifest(
            args.service,
            purge=purge,
            events=args.event,
            exception_types=args.exception,
            task_ids=args.task_id,
            older_than_seconds=None if args.older_than is None else round(args.older_than),
            newer_than_seconds=None if args.newer_than is None else round(args.newer_than),
            limit=getattr(args, "limit", None),
            rate_per_second=None if rate is None else int(rate),
            dry_run=getattr(args, "dry_run", False),
        )
    except InvalidSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        kube = KubeApi.from_environment()
        name = kube.create_replay(args.namespace, manifest)["metadata"]["name"]
    except OperatorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"created CeleryEventReplay {name} in namespace {args.namespace}; the operator runs it", file=sys.stderr)
    try:
        return _follow(kube, args.namespace, name, "purging" if purge else "replaying")
    except KeyboardInterrupt:
        print(
            f"\nstopped following: the replay goes on in the cluster (kubectl get cer {name} -n {args.namespace})",
            file=sys.stderr,
        )
        return 130
    except OperatorError as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        return 1


def _follow(kube: Any, namespace: str, name: str, verb: str) -> int:
    """The replay's progress with the same bar as a replay from here, its waits as they change, then its outcome."""
    from celery_event_operator.core.replay import replay_status, replay_view

    created_at, told, barred = time.monotonic(), "", False
    while True:
        body = kube.read_replay(namespace, name)
        now = replay_view.seen(body)
        if now.state in ("True", "False"):
            break
        if now.reason == replay_status.RUNNING:  # its total once counted (its first walk counts as it goes)
            _progress(now.done, now.total, verb)
            barred = True
        elif now.message and now.message != told:
            if barred:
                print(file=sys.stderr)  # below the bar
            print(f"waiting: {now.message}", file=sys.stderr)
            told, barred = now.message, False
        elif not now.state and not told and time.monotonic() - created_at > NO_OPERATOR_HINT_SECONDS:
            told = "no operator"
            print(
                "waiting: no operator has taken it up yet (is one running, with the CeleryEventReplay CRD installed "
                "before it started?)",
                file=sys.stderr,
            )
        time.sleep(FOLLOW_SECONDS)
    if barred:
        _progress(now.done, now.total, verb)
        print(file=sys.stderr)
    for item in (body.get("status") or {}).get("preview") or []:
        print(
            f"  {item.get('archivedAt', '?')}  {item['event']}  {item.get('taskId', '-')}  {item.get('exception', '-')}"
        )
    print(now.message)
    return 0 if now.state == "True" else 1


def _archive_action(
    args: argparse.Namespace, connection: Any, service: str, selection: Any, queue_type: str | None
) -> str:
    from celery_event_operator.adapters.archive import operations
    from celery_event_operator.core.archive import messages

    if args.action == "list":
        listing = operations.list_archive(connection, service, selection, queue_type)
        items = listing.items
        now = time.time()
        if not listing.whole:
            print(
                f"only the first {listing.seen} archived events were read (one walk holds no more): more may match",
                file=sys.stderr,
            )
        if not items and not args.json:
            print(f"no archived events of {service} match", file=sys.stderr)
        return json.dumps([item.as_json(now) for item in items], indent=2) if args.json else messages.table(items, now)
    if args.action == "replay":
        summary = operations.replay(
            connection,
            service,
            selection,
            limit=args.limit,
            dry_run=args.dry_run,
            rate=args.rate,
            progress=_progress,
            queue_type=queue_type,
        )
        if sys.stderr.isatty():
            print(file=sys.stderr)
        verb = "would replay" if args.dry_run else "replayed"
        return (
            f"{verb} {summary.done} of {'' if summary.whole else 'at least '}{summary.matched} matching "
            f"({summary.archived} archived) "
            f"to {summary.target}; {summary.archived - summary.done} stay archived"
            + (f"; {summary.unroutable} found no queue and stay" if summary.unroutable else "")
        )
    summary = operations.purge(connection, service, selection, queue_type)
    return f"purged {summary.done} of {summary.archived} archived"


def _add_run_command(commands: Any) -> None:
    run = commands.add_parser(
        formatter_class=HelpFormatter,
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
        "--installation-id",
        type=_installation_id,
        default=options_module.DEFAULT_INSTALLATION_ID,
        help="names this operator installation in the claims of service names it makes on shared brokers (the "
        "chart: its release's namespace/name); installations sharing a broker never act on each other's services",
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
    add_operator_options(run, "0.0.0.0")
    run.set_defaults(handler=_cmd_run)


class HelpFormatter(argparse.HelpFormatter):
    """Each option's default in its help, where there is one worth showing and the help does not say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, [], argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def _add_installed_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for entry in importlib.metadata.entry_points(group=COMMANDS_ENTRY_POINTS):
        with contextlib.suppress(ModuleNotFoundError):  # a distribution removed but its metadata left behind
            entry.load()(commands)
    for name, install in SHIPPED_COMMANDS.items():
        if name not in commands.choices:
            # No argument can hold a NUL, so no option is recognised: any arguments reach the message.
            absent = commands.add_parser(name, help=f"(not installed) {install}", prefix_chars="\0", add_help=False)
            absent.add_argument("arguments", nargs="*", help="ignored: the command is not installed")
            absent.set_defaults(handler=functools.partial(_not_installed, name, install))


def _not_installed(name: str, install: str, _args: argparse.Namespace) -> int:
    print(f"error: the command {name!r} is not installed; it comes with {install}", file=sys.stderr)
    return 2


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
        epilog="`celery-event-operator COMMAND --help` for a command's options. Documentation: docs/index.md.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {importlib.metadata.version('celery-event-operator')}"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_run_command(commands)
    _add_installed_commands(commands)

    topology = commands.add_parser(
        formatter_class=HelpFormatter,
        name="topology",
        help="list a service's planned queues and exchanges with their depths on the broker",
    )
    topology.add_argument("name", help="the CeleryEventService")
    topology.add_argument("--namespace", "-n", default="default", help="the resource's namespace")
    topology.add_argument("--broker-url", help="use this URL instead of the resource's Secret")
    topology.add_argument("--json", action="store_true", help="print JSON rows")
    topology.set_defaults(handler=_cmd_topology)

    archive = commands.add_parser(
        formatter_class=HelpFormatter, name="archive", help="list, replay or purge a service's archived events"
    )
    actions = archive.add_subparsers(dest="action", required=True)
    for action, text in (
        ("list", "show the archived events (reading changes nothing)"),
        ("replay", "send archived events back to the service's handler queues"),
        ("purge", "delete archived events"),
    ):
        sub = actions.add_parser(formatter_class=HelpFormatter, name=action, help=text)
        sub.add_argument("service", help="the CeleryEventService (with --broker-url: its serviceName)")
        sub.add_argument("--namespace", "-n", default="default", help="the resource's namespace")
        sub.add_argument("--broker-url", help="connect here instead of through the resource's Secret")
        sub.add_argument(
            "--queue-type",
            choices=("classic", "quorum"),
            help="with --broker-url: the service's queueType (classic archives are walked faster; without it, the "
            "walk that suits both)",
        )
        sub.add_argument(
            "--event", action="append", default=[], help="only events of this name (routing key; repeatable)"
        )
        sub.add_argument(
            "--exception",
            action="append",
            default=[],
            help="only events archived after this exception class, e.g. TypeError (repeatable)",
        )
        sub.add_argument("--task-id", action="append", default=[], help="only the event of this task id (repeatable)")
        sub.add_argument("--older-than", type=_duration, help="only events archived longer ago (90s, 5m, 2h, 1d)")
        sub.add_argument("--newer-than", type=_duration, help="only events archived more recently")
        sub.set_defaults(handler=_cmd_archive)
        if action == "list":
            sub.add_argument("--json", action="store_true", help="print JSON rows")
        if action != "list":
            sub.add_argument(
                "--via-cluster",
                action="store_true",
                help="create a CeleryEventReplay and follow it: the operator does it with its own broker access, "
                "under your Kubernetes RBAC, recorded in the cluster",
            )
        if action == "replay":
            sub.add_argument("--limit", type=int, help="replay at most this many")
            sub.add_argument("--dry-run", action="store_true", help="count what would be replayed; change nothing")
            sub.add_argument("--rate", type=float, help="at most this many per second")
        if action == "purge":
            sub.add_argument("--yes", action="store_true", help="confirm the deletion")

    crd_command = commands.add_parser(
        formatter_class=HelpFormatter, name="crd", help="render crds/ and the CRD reference from the API models"
    )
    crd_command.add_argument(
        "--output-dir",
        action="append",
        default=[],
        help=f"where to write (repeatable; default: {' '.join(CRD_OUTPUT_DIRS)})",
    )
    crd_command.add_argument(
        "--reference-file",
        help=f"where to write the fields' reference (default: {CRD_REFERENCE_FILE}; none when --output-dir is given)",
    )
    crd_command.add_argument("--check", action="store_true", help="fail if a committed CRD or the reference is stale")
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
