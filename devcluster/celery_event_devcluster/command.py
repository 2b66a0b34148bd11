"""`celery-event-operator dev`: its flags, added to the operator's command line through the entry point
`celery_event_operator.commands:dev` (the parser only: the dev mode itself loads when the command runs)."""

from __future__ import annotations

import argparse

from celery_event_operator import cli

DEFAULT_EXAMPLES = ("examples/broker-secret.yaml", "examples/billing.yaml", "examples/billing-worker.yaml")


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = commands.add_parser(
        formatter_class=cli.HelpFormatter,
        name="dev",
        help="run the operator with the samples on an embedded Kubernetes API",
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
    cli.add_operator_options(dev, "127.0.0.1")
    dev.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    # kopf, kmock and the emulator load only for the dev mode, never for another command's parser.
    from celery_event_devcluster import devmode

    return devmode.run_command(args, cli.operator_options(args))
