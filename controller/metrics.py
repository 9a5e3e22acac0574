"""The controller's Prometheus metrics (own registry) and its /metrics + /healthz server.

Totals that other modules already count (the collector's and the publisher's counters)
are exported by a custom collector reading them at scrape time, so there is one source
of truth per number and no double bookkeeping.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sized
from dataclasses import fields
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from azprobe.contracts import prom
from azprobe.contracts.weights import ZONE_STATES, ZoneWeights

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)


class _TotalsCollector(Collector):
    """Exports each int field of the counters dataclass registered under a prefix as the
    counter azprobe.contracts.prom.controller_total names."""

    def __init__(self, sources: Mapping[str, Callable[[], Any]]) -> None:
        self.sources = sources  # metric name prefix -> function returning a counters dataclass
        for prefix, get in sources.items():  # a field without a help text fails at start, not at a scrape
            for name in _int_fields(get()):
                prom.controller_total(prefix, name)

    def collect(self) -> Iterable[CounterMetricFamily]:
        for prefix, get in self.sources.items():
            counters = get()
            for name in _int_fields(counters):
                family = prom.controller_total(prefix, name)
                yield CounterMetricFamily(family.name, family.help, value=getattr(counters, name))


class _ReasonTotalsCollector(Collector):
    """Exports counters kept as {reason: count} dicts (a bounded set of reasons each)."""

    def __init__(self, sources: Mapping[prom.Family, Callable[[], Mapping[str, int]]]) -> None:
        self.sources = sources

    def collect(self) -> Iterable[CounterMetricFamily]:
        for family, get in self.sources.items():
            counter = CounterMetricFamily(family.name, family.help, labels=list(family.labels))
            for reason, n in sorted(get().items()):
                counter.add_metric([reason], n)
            yield counter


def _int_fields(counters: Any) -> list[str]:
    return [f.name for f in fields(counters) if isinstance(getattr(counters, f.name), int)]


def _gauge(family: prom.Family, registry: CollectorRegistry) -> Gauge:
    return Gauge(family.name, family.help, family.labels, registry=registry)


class ControllerMetrics:
    def __init__(self) -> None:
        # `<name>_created` samples would double every counter and histogram with a second
        # series of its own (the 0.0.4 text format has no place for them but a gauge).
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.zone_health = _gauge(prom.ZONE_HEALTH, r)
        self.zone_weight = _gauge(prom.ZONE_WEIGHT, r)
        self.zone_share = _gauge(prom.ZONE_SHARE, r)
        self.zone_rtt_p95 = _gauge(prom.ZONE_RTT_P95, r)
        self.zone_success = _gauge(prom.ZONE_SUCCESS, r)
        self.zone_state = _gauge(prom.ZONE_STATE, r)
        self.cycle = Histogram(prom.CYCLE.name, prom.CYCLE.help, buckets=CYCLE_BUCKETS, registry=r)
        self.pull = Histogram(prom.PULL.name, prom.PULL.help, buckets=CYCLE_BUCKETS, registry=r)
        self.agents = _gauge(prom.AGENTS, r)
        self.leader = _gauge(prom.LEADER, r)
        self.consul_up = _gauge(prom.CONSUL_UP, r)
        self.spike = _gauge(prom.SPIKE, r)
        self.spike_lambda = _gauge(prom.SPIKE_LAMBDA, r)
        self.generation = _gauge(prom.GENERATION, r)
        self.last_write = _gauge(prom.LAST_WRITE, r)
        self.sick_hosts = _gauge(prom.SICK_HOSTS, r)
        self.pinned_hosts = _gauge(prom.PINNED_HOSTS, r)
        self.host_naming_off = _gauge(prom.HOST_NAMING_OFF, r)
        self.control_keys_ignored = _gauge(prom.CONTROL_KEYS_IGNORED, r)
        self.spikes = Counter(prom.SPIKES.name, prom.SPIKES.help, prom.SPIKES.labels, registry=r)
        self.catalog_read_errors = Counter(prom.CATALOG_READ_ERRORS.name, prom.CATALOG_READ_ERRORS.help, registry=r)
        self._spiking: dict[str, bool] = {}
        self._known_zones: set[str] = set()  # zones with gauges, to drop those that leave

    def add_totals(self, sources: Mapping[str, Callable[[], Any]]) -> None:
        self.registry.register(_TotalsCollector(sources))

    def add_reason_totals(self, sources: Mapping[prom.Family, Callable[[], Mapping[str, int]]]) -> None:
        self.registry.register(_ReasonTotalsCollector(sources))

    def observe_zones(self, zones: Mapping[str, ZoneWeights], sick: Mapping[str, Sized] | None = None) -> None:
        """This controller's own global decision (every cycle, leader or standby); `sick`:
        zone -> its named hosts. Labelled by the decision's zones only (the topology's)."""
        for az in self._known_zones - set(zones):
            for g in (self.zone_health, self.zone_weight, self.zone_share, self.zone_rtt_p95, self.zone_success,
                      self.sick_hosts):
                g.remove(az)
            for state in ZONE_STATES:
                self.zone_state.remove(az, state)
        self._known_zones = set(zones)
        for az, z in zones.items():
            self.zone_health.labels(az).set(z.health)
            self.zone_weight.labels(az).set(z.weight)
            self.zone_share.labels(az).set(z.share)
            self.zone_rtt_p95.labels(az).set(z.p95_ms / 1000 if z.p95_ms is not None else float("nan"))
            self.zone_success.labels(az).set(z.success if z.success is not None else float("nan"))
            self.sick_hosts.labels(az).set(len((sick or {}).get(az, ())))
            for state in ZONE_STATES:
                self.zone_state.labels(az, state).set(1.0 if z.state == state else 0.0)

    def observe_controls(self, pinned: int, hosts_off: bool, ignored: int) -> None:
        """The operator switches of the last read of control/."""
        self.pinned_hosts.set(pinned)
        self.host_naming_off.set(1.0 if hosts_off else 0.0)
        self.control_keys_ignored.set(ignored)

    def observe_spikes(self, results: Mapping[str, Any]) -> None:
        for az, result in results.items():
            self.spike.labels(az).set(1.0 if result.spike else 0.0)
            self.spike_lambda.labels(az).set(result.lam)
            if result.spike and not self._spiking.get(az, False):
                self.spikes.labels(az).inc()
            self._spiking[az] = result.spike

    def render(self) -> bytes:
        return generate_latest(self.registry)


async def start_server(metrics: ControllerMetrics, host: str, port: int,
                       health: Callable[[], dict[str, Any]]) -> web.AppRunner:
    """Serve /metrics and /healthz on the controller's own event loop."""

    async def handle_metrics(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def handle_health(_: web.Request) -> web.Response:
        body = {"ok": True, "time": time.time(), **health()}
        return web.Response(text=json.dumps(body, sort_keys=True), content_type="application/json")

    app = web.Application()
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/healthz", handle_health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    for site in runner.sites:
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            return server.sockets[0].getsockname()[1]
    raise RuntimeError("metrics server is not listening")
