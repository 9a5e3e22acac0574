"""The controller's Prometheus metrics (own registry) and its /metrics + /healthz server.

Totals that other modules already count (the collector's and the publisher's counters)
are exported by a custom collector reading them at scrape time, so there is one source
of truth per number and no double bookkeeping.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from azprobe.contracts.weights import ZONE_STATES, ZoneWeights

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)


class _TotalsCollector(Collector):
    """Exports each int field of the given dataclass instances as a counter."""

    def __init__(self, sources: Mapping[str, Callable[[], Any]]) -> None:
        self.sources = sources  # metric name prefix -> function returning a counters dataclass

    def collect(self) -> Iterable[CounterMetricFamily]:
        for prefix, get in self.sources.items():
            counters = get()
            for f in fields(counters):
                value = getattr(counters, f.name)
                if isinstance(value, int):
                    yield CounterMetricFamily(f"{prefix}_{f.name}", f"{f.name.replace('_', ' ')} (total)",
                                              value=value)


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.zone_health = Gauge("azprobe_zone_health", "Health H of the destination AZ (global view)", ["az"], registry=r)
        self.zone_weight = Gauge("azprobe_zone_weight", "Decay weight of the destination AZ", ["az"], registry=r)
        self.zone_share = Gauge("azprobe_zone_share", "Traffic share (percent) of the destination AZ", ["az"], registry=r)
        self.zone_p95 = Gauge("azprobe_zone_p95_ms", "P95 smoothed RTT towards the AZ (ms)", ["az"], registry=r)
        self.zone_success = Gauge("azprobe_zone_success", "Connect success rate towards the AZ", ["az"], registry=r)
        self.zone_state = Gauge("azprobe_zone_state", "1 for the AZ's current state", ["az", "state"], registry=r)
        self.cycle = Histogram("azprobe_controller_cycle_seconds", "Duration of one collect+decide cycle",
                               buckets=CYCLE_BUCKETS, registry=r)
        self.pull = Histogram("azprobe_controller_pull_seconds", "Duration of one cycle's agent pulls",
                              buckets=CYCLE_BUCKETS, registry=r)
        self.agents = Gauge("azprobe_controller_agents", "Agents by state", ["state"], registry=r)
        self.leader = Gauge("azprobe_controller_leader", "1 while this controller is the leader", registry=r)
        self.consul_up = Gauge("azprobe_controller_consul_up", "1 while Consul answers", registry=r)
        self.spike = Gauge("azprobe_detector_spike", "1 while the AZ's failure count is a spike", ["az"], registry=r)
        self.spike_lambda = Gauge("azprobe_detector_lambda", "Mean failures per detector bucket", ["az"], registry=r)
        self.generation = Gauge("azprobe_controller_generation", "Generation of the last document written",
                                registry=r)
        self.last_write = Gauge("azprobe_controller_last_write_timestamp", "Unix time of the last write", registry=r)
        self.spikes = Counter("azprobe_detector_spikes", "Failure spikes detected (starts)", ["az"], registry=r)
        self._spiking: dict[str, bool] = {}
        self._known_zones: set[str] = set()  # zones with gauges, to drop those that leave

    def add_totals(self, sources: Mapping[str, Callable[[], Any]]) -> None:
        self.registry.register(_TotalsCollector(sources))

    def observe_zones(self, zones: Mapping[str, ZoneWeights]) -> None:
        """This controller's own global decision (every cycle, leader or standby)."""
        for az in self._known_zones - set(zones):
            for g in (self.zone_health, self.zone_weight, self.zone_share, self.zone_p95, self.zone_success):
                g.remove(az)
            for state in ZONE_STATES:
                self.zone_state.remove(az, state)
        self._known_zones = set(zones)
        for az, z in zones.items():
            self.zone_health.labels(az).set(z.health)
            self.zone_weight.labels(az).set(z.weight)
            self.zone_share.labels(az).set(z.share)
            self.zone_p95.labels(az).set(z.p95_ms if z.p95_ms is not None else float("nan"))
            self.zone_success.labels(az).set(z.success if z.success is not None else float("nan"))
            for state in ZONE_STATES:
                self.zone_state.labels(az, state).set(1.0 if z.state == state else 0.0)

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
