"""What every service's keeper shares (kept in kopf's root memo): the clients, opened once at start-up."""

from __future__ import annotations

import dataclasses
import logging

from celery_event_operator.broker.brokers import Brokers
from celery_event_operator.broker.secret import SecretReader
from celery_event_operator.cluster import Cluster
from celery_event_operator.errors import KubeError
from celery_event_operator.injection.catalog import InjectionCatalog
from celery_event_operator.kubeapi import AsyncKubeApi, KubeApi
from celery_event_operator.monitoring.collector import MetricsRegistry, serve_metrics
from celery_event_operator.options import OperatorOptions


@dataclasses.dataclass
class Context:
    options: OperatorOptions
    kube: AsyncKubeApi
    cluster: Cluster
    brokers: Brokers
    metrics: MetricsRegistry
    injections: InjectionCatalog

    @classmethod
    def open(cls, options: OperatorOptions) -> Context:
        """The clients every keeper shares, and the /metrics server when it is wanted."""
        kube = AsyncKubeApi(KubeApi.from_environment())
        context = cls(
            options=options,
            kube=kube,
            cluster=Cluster(kube),
            brokers=Brokers(SecretReader(kube)),
            metrics=MetricsRegistry(options.runtime_buckets, options.queue_wait_buckets),
            injections=InjectionCatalog(kube, tuple(options.namespaces)),
        )
        if options.metrics_port:
            serve_metrics(context.metrics, options.metrics_port, options.metrics_addr)
        return context

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
        self.injections.close()
        await self.brokers.close_all()
        self.kube.close()
