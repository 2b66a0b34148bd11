"""`celery-event-operator dev`: the operator and its samples on an embedded Kubernetes API."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import pathlib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Any

import kopf

from celery_event_devcluster import sample_worker
from celery_event_devcluster.command import DEFAULT_EXAMPLES
from celery_event_devcluster.manifests import create_all, load_documents
from celery_event_devcluster.server import serve, write_kubeconfig
from celery_event_operator.core.api import crd
from celery_event_operator.core.broker import address as broker_address
from celery_event_operator.core.errors import BrokerSecretError
from celery_event_operator.core.options import OperatorOptions
from celery_event_operator.handlers import admission  # importing the handlers registers them


def with_broker_url(documents: Iterable[dict[str, Any]], broker_url: str) -> Iterator[dict[str, Any]]:
    """Point the samples' broker Secrets at the local broker."""
    for document in documents:
        if document.get("kind") == "Secret" and "url" in (document.get("stringData") or {}):
            yield {**document, "stringData": {**document["stringData"], "url": broker_url}}
        else:
            yield document


async def _sample_worker(
    url: str, broker_url: str, examples: pathlib.Path, state_dir: pathlib.Path, stop: asyncio.Event
) -> None:
    try:
        async with sample_worker.running(url, broker_url, examples, state_dir):
            print(
                f"Sample worker {sample_worker.POD_NAME} runs examples/app/billing_app.py with an event a second "
                f"(log: {state_dir / 'sample-worker.log'}).",
                flush=True,
            )
            await stop.wait()
    except (LookupError, OSError) as exc:
        print(f"The sample worker did not start: {exc}", flush=True)


DEV_VHOST = "celery-event-operator-dev"
PERMISSIONS = {"configure": ".*", "write": ".*", "read": ".*"}


def _management(amqp_url: str) -> tuple[str, str, str]:
    """The management API of the broker at `amqp_url` (as the operator derives it), its Basic authorization,
    and the user."""
    address = broker_address.parse(amqp_url)
    first = address.endpoints[0]
    user, password = first.user or "guest", first.password or "guest"
    authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    return f"{address.management_url()}/api", authorization, user


def _call(amqp_url: str, method: str, path: str, body: dict[str, Any] | None = None) -> None:
    api, authorization, _ = _management(amqp_url)
    request = urllib.request.Request(
        f"{api}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": authorization, "Content-Type": "application/json"},
    )
    with contextlib.suppress(urllib.error.HTTPError) if method == "DELETE" else contextlib.nullcontext():
        urllib.request.urlopen(request, timeout=10).close()


def dev_broker_url(base_url: str) -> str:
    """The dev mode's own vhost on the broker of `base_url`, made (with the user's permissions) if missing:
    the samples never touch the broker's other vhosts or their shared exchanges."""
    vhost = urllib.parse.quote(DEV_VHOST, safe="")
    _call(base_url, "PUT", f"/vhosts/{vhost}", {})
    user = _management(base_url)[2]
    _call(base_url, "PUT", f"/permissions/{vhost}/{urllib.parse.quote(user, safe='')}", PERMISSIONS)
    return broker_address.with_vhost(base_url, DEV_VHOST)


def run_command(args: argparse.Namespace, options: OperatorOptions) -> int:
    """`celery-event-operator dev`, with the flags `command.add_command` defines."""
    base_url = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    try:
        if args.down:
            _call(base_url, "DELETE", f"/vhosts/{urllib.parse.quote(DEV_VHOST, safe='')}")
            print(f"removed the vhost {DEV_VHOST} and everything in it", flush=True)
            return 0
        broker_url = args.broker_url or dev_broker_url(base_url)
    except (OSError, BrokerSecretError) as exc:
        action = "remove" if args.down else "make"
        print(f"error: cannot {action} the vhost {DEV_VHOST} through the management API: {exc}", flush=True)
        return 1
    return asyncio.run(
        main(
            options=options,
            api_port=args.api_port,
            state_dir=pathlib.Path(args.state_dir),
            broker_url=broker_url,
            examples=[pathlib.Path(path) for path in args.example or DEFAULT_EXAMPLES],
            liveness=args.liveness or None,
            verbose=args.verbose,
            with_sample_worker=not args.no_sample_worker,
        )
    )


async def main(
    *,
    options: OperatorOptions,
    api_port: int,
    state_dir: pathlib.Path,
    broker_url: str,
    examples: list[pathlib.Path],
    liveness: str | None,
    verbose: bool,
    with_sample_worker: bool = True,
) -> int:
    if options.webhook is not None:
        admission.register(kopf.get_default_registry())
    kopf.configure(verbose=verbose)
    # One access-log line per API request drowns the operator's own log.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    async with serve(port=api_port) as (_emulator, url):
        kubeconfig = write_kubeconfig(state_dir / "kubeconfig", url).resolve()
        os.environ["KUBECONFIG"] = str(kubeconfig)  # for the operator's own API client

        # kopf logs in through the kubernetes client when it is installed, and that client reads
        # $KUBECONFIG at import time: hand kopf the embedded API directly instead.
        @kopf.on.login()
        def login_to_embedded_api(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=url, default_namespace="default")

        documents = [*crd.custom_resource_definitions(), *with_broker_url(load_documents(examples), broker_url)]
        created = await create_all(url, documents)
        print(
            f"Embedded Kubernetes API at {url} (no cluster needed); created: {', '.join(created)}\n"
            f"In another shell:\n"
            f"  export KUBECONFIG={kubeconfig}\n"
            f"  kubectl get ces\n"
            f"  kubectl apply --validate=false -f examples/shipping-quorum.yaml\n"
            f"  .venv/bin/celery-event-operator topology billing\n"
            f"  .venv/bin/celery-event-operator archive replay billing --via-cluster --exception TypeError\n"
            f"Stop with Ctrl-C.",
            flush=True,
        )
        if options.metrics_port:
            print(f"  curl -s http://127.0.0.1:{options.metrics_port}/metrics | grep celery_task", flush=True)
        stop = asyncio.Event()
        # The sample app lives beside the sample manifests (examples/app/).
        examples_dir = examples[0].parent if examples else pathlib.Path("examples")
        worker = (
            asyncio.create_task(_sample_worker(url, broker_url, examples_dir, state_dir, stop))
            if with_sample_worker
            else None
        )
        try:
            await kopf.operator(
                clusterwide=True, standalone=True, liveness_endpoint=liveness, memo=kopf.Memo(options=options)
            )
        finally:
            stop.set()
            if worker is not None:
                await worker
    return 0
