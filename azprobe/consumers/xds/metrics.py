"""/metrics of `azprobe xds`: every name and help text from azprobe.contracts.prom."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from azprobe.consumers.xds.streams import short_type
from azprobe.contracts import prom

disable_created_metrics()
PUSH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _gauge(family: prom.Family, registry: CollectorRegistry) -> Gauge:
    return Gauge(family.name, family.help, family.labels, registry=registry)


def _counter(family: prom.Family, registry: CollectorRegistry) -> Counter:
    return Counter(family.name, family.help, family.labels, registry=registry)


class XdsMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.streams = _gauge(prom.XDS_STREAMS, r)
        self.pushes = _counter(prom.XDS_PUSHES, r)
        self.nacks = _counter(prom.XDS_NACKS, r)
        self.refused = _counter(prom.XDS_REFUSED, r)
        self.push_delay = Histogram(prom.XDS_PUSH_DELAY.name, prom.XDS_PUSH_DELAY.help, buckets=PUSH_BUCKETS,
                                    registry=r)
        self.outside = _gauge(prom.XDS_UNZONED, r)
        self.endpoints = _gauge(prom.XDS_ENDPOINTS, r)
        self.view_weights = _gauge(prom.XDS_WEIGHTS, r)
        self.consul_errors = _counter(prom.XDS_CONSUL_ERRORS, r)
        self._pushes_by_type: dict[str, Counter] = {}  # the labelled child, looked up once per type

    def pushed(self, type_url: str) -> None:
        child = self._pushes_by_type.get(type_url)
        if child is None:
            child = self._pushes_by_type[type_url] = self.pushes.labels(short_type(type_url))
        child.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
