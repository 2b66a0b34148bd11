"""What every service's keeper shares (kept in kopf's root memo): the clients, opened once at start-up."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import logging
import pathlib
import tempfile
import time

from celery_event_operator.adapters import certs
from celery_event_operator.adapters.broker.brokers import Brokers
from celery_event_operator.adapters.broker.secrets import SecretReader
from celery_event_operator.adapters.cluster import Cluster
from celery_event_operator.adapters.injection.catalog import InjectionCatalog
from celery_event_operator.adapters.kubeapi import AsyncKubeApi, KubeApi
from celery_event_operator.adapters.monitoring.collector import MetricsRegistry, serve_metrics
from celery_event_operator.adapters.pods import PodWatch, watch_scopes
from celery_event_operator.adapters.replay.runner import ReplayRunner
from celery_event_operator.core.broker.settings import BrokerSettings
from celery_event_operator.core.errors import KubeError
from celery_event_operator.core.monitoring.bounds import SeriesSettings
from celery_event_operator.core.options import OperatorOptions, WebhookOptions
from celery_event_operator.core.service.watched import Labelled

# Python's cycle collector traverses every tracked object in its full passes: at a thousand services (kopf's bodies
# and indexes, the models of every spec) they held the event loop — the webhook's and the events' — ~0.9 s each,
# scrape or not. What exists once the operator has settled lives for good: frozen, it is no longer traversed (full
# passes ~0.1 s; bench/README.md). Once, after the start: what is frozen is never collected.
HEAP_FREEZE_AFTER_SECONDS = 120.0


def freeze_settled_heap() -> None:
    gc.collect()  # what is garbage by now is collected, not frozen
    gc.freeze()
    logging.getLogger(__name__).info(
        "%d objects of the settled operator frozen for the collector", gc.get_freeze_count()
    )


def webhook_certificate(options: WebhookOptions) -> tuple[str, str]:
    """The webhook's certificate and key files: the given ones, else a self-signed pair for its host."""
    if options.cert_file and options.key_file:
        return options.cert_file, options.key_file
    directory = pathlib.Path(tempfile.mkdtemp(prefix="celery-event-operator-webhook-"))
    certfile, keyfile = certs.self_signed(directory, [options.host, "localhost", "127.0.0.1"])
    return str(certfile), str(keyfile)


def forget_series(metrics: MetricsRegistry, pod: Labelled) -> None:
    """A deleted pod's metric series go at once (not at the next rollout's end)."""
    found = metrics.find(pod.namespace, pod.service)
    if found is not None:
        found.forget_worker(pod.name, time.monotonic())
        logging.getLogger(__name__).debug("series of worker %s/%s removed", pod.namespace, pod.name)


@dataclasses.dataclass
class Context:
    options: OperatorOptions
    kube: AsyncKubeApi
    cluster: Cluster
    brokers: Brokers
    metrics: MetricsRegistry
    injections: InjectionCatalog
    pods: PodWatch

    @classmethod
    def open(cls, options: OperatorOptions) -> Context:
        """The clients every keeper shares, and the /metrics server when it is wanted."""
        kube = AsyncKubeApi(KubeApi.from_environment(watches=len(watch_scopes(options.namespaces))))
        metrics = MetricsRegistry(
            options.runtime_buckets,
            options.queue_wait_buckets,
            SeriesSettings(options.per_pod_task_series, options.max_task_names),
        )
        context = cls(
            options=options,
            kube=kube,
            cluster=Cluster(kube),
            brokers=Brokers(SecretReader(kube)),
            metrics=metrics,
            injections=InjectionCatalog(kube, tuple(options.namespaces)),
            pods=PodWatch(kube.api, tuple(options.namespaces), functools.partial(forget_series, metrics)),
        )
        if options.metrics_port:
            serve_metrics(context.metrics, options.metrics_port, options.metrics_addr)
        return context

    @staticmethod
    def replay_broker(settings: BrokerSettings, queue_type: str) -> ReplayRunner:
        """A replay's own broker connection (and thread), for an archive of this queue type."""
        return ReplayRunner(settings, queue_type)

    @staticmethod
    def freeze_heap_later() -> None:
        asyncio.get_running_loop().call_later(HEAP_FREEZE_AFTER_SECONDS, freeze_settled_heap)

    async def ensure_peering(self) -> None:
        """The kopf peering object this replica meets the others in (each served namespace has its own)."""
        name = self.options.peering
        if name is None:
            return
        for namespace in self.options.namespaces or (None,):
            try:
                await self.kube.call(self.kube.api.ensure_peering, name, namespace)
            except KubeError as exc:  # e.g. the peering CRDs are not installed: kopf pauses and says so
                logging.getLogger(__name__).warning("%s", exc)

    async def close(self) -> None:
        self.pods.close()
        await self.metrics.close()
        self.injections.close()
        await self.brokers.close_all()
        self.kube.close()
