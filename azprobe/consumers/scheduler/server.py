"""The extender's HTTP face and `azprobe scheduler-extender`.

    POST /filter       ExtenderArgs -> ExtenderFilterResult
    POST /prioritize   ExtenderArgs -> HostPriorityList
    GET  /metrics      Prometheus text (azprobe/contracts/prom.py names every series)
    GET  /healthz      JSON: which weights the answers follow, and why

Served by aiohttp on uvloop, like the controller. Bounds: a body larger than
`extender.max_body_bytes` is refused with 413 before it is read whole; the whole body
must arrive within `extender.request_timeout_s` (else 408); a body that is not an
ExtenderArgs gets 400 with a message naming the field, never a 500. HTTPS material
(`extender.tls_*`) follows its files on disk and SIGHUP, through tls.RotatingContext.

Which weights (fail static): the fresh document of one WeightWatcher `status()`. A
document the watcher holds while Consul is down or the key is gone stays in use until
its `expires_at`, by the contract every reader follows. Without a fresh document the
answers are neutral (nothing filtered, equal scores) and `Error` stays empty: a filter
error fails the pod, and failing pods on missing data is the incident this project
exists for. Each change of the reason is logged once and `azprobe_extender_weights_state`
says which.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import click
import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from azprobe.consumers.scheduler import scoring
from azprobe.consumers.scheduler.config import ExtenderConfig, ExtenderSettings, load_extender_config
from azprobe.consumers.scheduler.protocol import (REASON_FAILOVER, BadRequest, filter_result, parse_args,
                                                  priority_list)
from azprobe.consumers.scheduler.zones import NodeZones
from azprobe.consumers.watch import FRESH as FRESH_STATE, STALE, WatcherStatus, WeightWatcher
from azprobe.contracts import prom
from azprobe.contracts.weights import WeightsDoc
from azprobe.errors import ConfigError
from azprobe.security.tls import RotatingContext, TlsFiles, server_context

log = logging.getLogger(__name__)

FILTER, PRIORITIZE = "filter", "prioritize"
VERBS = (FILTER, PRIORITIZE)
FRESH, STALE_REASON, ABSENT, UNREACHABLE, REJECTED, WAITING = (
    "fresh", "stale", "absent", "unreachable", "rejected", "waiting")
REASONS = (FRESH, STALE_REASON, ABSENT, UNREACHABLE, REJECTED, WAITING)
CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"
ANSWER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
STATE_CHECK_S = 1.0


@dataclass(frozen=True)
class Usable:
    doc: WeightsDoc | None  # the document the answers follow; None: neutral answers
    reason: str  # one of REASONS
    detail: str  # a line for the log
    held: str = ""  # a fresh document kept although Consul cannot confirm it: why


def usable_weights(status: WatcherStatus) -> Usable:
    """The watcher's view as (document, reason). Pure.

    Everything comes from the one status: the document and its state were read together,
    so a document landing meanwhile cannot make them disagree (a separate snapshot() read
    could be None while the status already says fresh)."""
    fresh = status.doc if status.state == FRESH_STATE else None
    if fresh is not None:
        held = "key absent" if status.key_absent else ""
        detail = f"weights generation {fresh.generation} from {status.key}"
        if held:
            detail += f" (the key is absent now: holding it until it expires at {fresh.expires_at:.0f})"
        return Usable(fresh, FRESH, detail, held)
    if status.key_absent:
        return Usable(None, ABSENT, f"no weights at {status.key}")
    if status.state == STALE:
        return Usable(None, STALE_REASON, f"the weights at {status.key} expired (generation "
                                          f"{status.doc.generation if status.doc else '?'})")
    if status.rejected and status.last_error and status.last_error.startswith("rejected"):
        return Usable(None, REJECTED, status.last_error)
    if status.errors:
        return Usable(None, UNREACHABLE, f"Consul unreachable: {status.last_error or 'no answer'}")
    return Usable(None, WAITING, "no answer from Consul yet")


class WeightsSource(Protocol):
    def usable(self) -> Usable: ...


class WatcherSource:
    """The weights as the WeightWatcher holds them."""

    def __init__(self, watcher: WeightWatcher) -> None:
        self.watcher = watcher

    def usable(self) -> Usable:
        return usable_weights(self.watcher.status())


class ExtenderMetrics:
    def __init__(self) -> None:
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(prom.EXTENDER_REQUESTS.name, prom.EXTENDER_REQUESTS.help,
                                prom.EXTENDER_REQUESTS.labels, registry=r)
        self.neutral = Counter(prom.EXTENDER_NEUTRAL.name, prom.EXTENDER_NEUTRAL.help,
                               prom.EXTENDER_NEUTRAL.labels, registry=r)
        self.usable = Gauge(prom.EXTENDER_WEIGHTS.name, prom.EXTENDER_WEIGHTS.help,
                            prom.EXTENDER_WEIGHTS.labels, registry=r)
        self.filtered = Counter(prom.EXTENDER_FILTERED.name, prom.EXTENDER_FILTERED.help, registry=r)
        self.unknown_zone = Counter(prom.EXTENDER_UNKNOWN_ZONE.name, prom.EXTENDER_UNKNOWN_ZONE.help, registry=r)
        self.seconds = Histogram(prom.EXTENDER_SECONDS.name, prom.EXTENDER_SECONDS.help,
                                 prom.EXTENDER_SECONDS.labels, buckets=ANSWER_BUCKETS, registry=r)
        for verb in VERBS:
            self.seconds.labels(verb)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class Extender:
    """The protocol's answers, without HTTP: `answer(verb, body)` -> (status, JSON)."""

    def __init__(self, source: WeightsSource, node_zones: NodeZones, *, max_nodes: int = 15_000,
                 metrics: ExtenderMetrics | None = None) -> None:
        self.source = source
        self.node_zones = node_zones
        self.max_nodes = max_nodes
        self.metrics = metrics or ExtenderMetrics()
        self._detail_kind: str | None = None
        self._lock = threading.Lock()

    def observe(self) -> Usable:
        """The weights now; logs and exports each change of reason once."""
        usable = self.source.usable()
        kind = f"{usable.reason}/{usable.held}"
        with self._lock:
            changed = kind != self._detail_kind
            if changed:
                self._detail_kind = kind
        if changed:
            if usable.doc is None:
                log.warning("scheduler extender: neutral answers (filter removes nothing, equal scores): %s",
                            usable.detail)
            else:
                log.warning("scheduler extender: answers follow %s", usable.detail)
            for reason in REASONS:
                self.metrics.usable.labels(reason).set(1.0 if reason == usable.reason else 0.0)
        return usable

    def answer(self, verb: str, body: bytes) -> tuple[int, bytes]:
        started = time.perf_counter()
        try:
            candidates = parse_args(body, max_nodes=self.max_nodes, node_zones=self.node_zones,
                                    keep_nodes=verb == FILTER)
        except BadRequest as exc:
            self.metrics.requests.labels(verb, "400").inc()
            return 400, msgspec.json.encode({"Error": str(exc)})
        usable = self.observe()
        doc = usable.doc
        unknown = sum(1 for az in candidates.zones if az is None or doc is None or az not in doc.zones)
        if doc is not None and unknown:
            self.metrics.unknown_zone.inc(unknown)
        if doc is None:
            self.metrics.neutral.labels(verb, usable.reason).inc()
        if verb == FILTER:
            decision = scoring.filter_nodes(doc, candidates.zones)
            if decision.neutral_reason:
                self.metrics.neutral.labels(verb, decision.neutral_reason).inc()
                log.warning("scheduler extender: filter for %s would leave no node; removing none", candidates.pod)
            failed = {}
            if decision.removed:
                assert doc is not None
                reasons = {zone: REASON_FAILOVER.format(zone=zone, generation=doc.generation)
                           for zone in decision.failover}
                failed = {candidates.names[i]: reasons[candidates.zones[i]] for i in decision.removed}
                self.metrics.filtered.inc(len(decision.removed))
            body_out = filter_result(candidates, decision.kept, failed)
        else:
            body_out = priority_list(candidates.names, scoring.prioritize(doc, candidates.zones))
        self.metrics.requests.labels(verb, "200").inc()
        self.metrics.seconds.labels(verb).observe(time.perf_counter() - started)
        return 200, body_out

    def health(self) -> dict[str, Any]:
        usable = self.source.usable()
        return {"ok": True, "weights": usable.reason, "detail": usable.detail,
                "generation": usable.doc.generation if usable.doc else None,
                "learned_nodes": self.node_zones.learned}


def make_app(extender: Extender, *, max_body_bytes: int, request_timeout_s: float) -> web.Application:
    app = web.Application(client_max_size=max_body_bytes)

    def handler(verb: str) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.Response:
            try:
                async with asyncio.timeout(request_timeout_s):
                    body = await request.read()
            except TimeoutError:
                extender.metrics.requests.labels(verb, "408").inc()
                return _json(408, {"Error": f"the body did not arrive within {request_timeout_s:g} s"})
            except web.HTTPRequestEntityTooLarge:
                extender.metrics.requests.labels(verb, "413").inc()
                return _json(413, {"Error": f"body over {max_body_bytes} bytes (extender.max_body_bytes)"})
            status, out = extender.answer(verb, body)
            return web.Response(status=status, body=out, content_type="application/json")
        return handle

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=extender.metrics.render(), headers={"Content-Type": CONTENT_TYPE_METRICS})

    async def healthz(_: web.Request) -> web.Response:
        return _json(200, extender.health())

    app.router.add_post("/filter", handler(FILTER))
    app.router.add_post("/prioritize", handler(PRIORITIZE))
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app


def _json(status: int, doc: dict[str, Any]) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(doc), content_type="application/json")


def _rotation_failed(exc: ConfigError) -> None:
    log.error("extender TLS files changed but do not load; serving the previous ones: %s", exc)


def server_tls(settings: ExtenderSettings) -> RotatingContext | None:
    """The listener's TLS material from the one builder (key-file checks included), asking
    for a client certificate when tls_ca_file is set; None: plain HTTP. ConfigError when
    a file cannot be loaded at start. The files are followed on disk and re-read on
    SIGHUP (RotatingContext): a connection made after a rotation gets the new material,
    and a rotation that does not load keeps the current one and logs one line."""
    if not settings.tls_cert_file:
        return None
    return RotatingContext(TlsFiles(cert_file=settings.tls_cert_file, key_file=settings.tls_key_file or None,
                                    ca_file=settings.tls_ca_file or None), "extender.tls", server_context,
                           on_error=_rotation_failed)


async def serve(config: ExtenderConfig, stop: asyncio.Event, *, tls: RotatingContext | None = None,
                on_listening: Callable[[str, int], None] | None = None) -> None:
    """Run until `stop` is set; `tls` (server_tls): HTTPS, else plain HTTP."""
    from azprobe.daemon import sdnotify

    settings = config.extender
    watcher = WeightWatcher(config.consul, config.weights_key)
    node_zones = NodeZones(config.node_zones, config.name_patterns, capacity=settings.max_nodes)
    extender = Extender(WatcherSource(watcher), node_zones, max_nodes=settings.max_nodes)
    watcher.start()
    runner = web.AppRunner(make_app(extender, max_body_bytes=settings.max_body_bytes,
                                    request_timeout_s=settings.request_timeout_s),
                           access_log=None, handle_signals=False)
    await runner.setup()
    ssl_context = tls.serving_context() if tls is not None else None
    site = web.TCPSite(runner, settings.listen[0], settings.listen[1], ssl_context=ssl_context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    log.warning("scheduler extender serving on %s:%d (%s), weights from %s", settings.listen[0], port,
                "https" if ssl_context else "http", config.consul.key(config.weights_key))
    if on_listening is not None:
        on_listening(settings.listen[0], port)
    notifier = sdnotify.LoopNotifier(lambda: str(extender.health()["detail"]), loop_interval_s=STATE_CHECK_S)
    notifier.started()
    try:
        while not stop.is_set():
            extender.observe()  # a change of state is logged even while no pod is scheduled
            notifier.tick()
            try:
                await asyncio.wait_for(stop.wait(), STATE_CHECK_S)
            except TimeoutError:
                pass
    finally:
        notifier.stopping()
        watcher.stop()
        await runner.cleanup()


def _reload_files() -> None:
    from azprobe.security import reloadable

    reloaded = reloadable.reload_all()
    log.warning("SIGHUP: %d rotated file(s) taken; the extender's config is read at start only, "
                "restart it to apply changes", reloaded)


@click.command("scheduler-extender")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="Extender config (TOML), see systemd/scheduler-extender.toml.")
@click.option("--address-file", default=None, type=click.Path(dir_okay=False),
              help="Once serving, write the bound host:port here (for extender.listen port 0).")
def scheduler_extender_command(config_path: str, address_file: str | None) -> None:
    """Serve kube-scheduler's extender protocol (filter, prioritize) from the weights."""
    import uvloop

    from azprobe.daemon.address_file import write_address_file

    config = load_extender_config(config_path)
    tls = server_tls(config.extender)  # exit 2 here
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # SIGHUP's default action would end the daemon. The config is read at start only;
        # the files it names (the listener's and Consul's certificates, the token file) are
        # re-read now.
        loop.add_signal_handler(signal.SIGHUP, _reload_files)
        await serve(config, stop, tls=tls, on_listening=(lambda host, port: write_address_file(address_file, host, port))
                    if address_file else None)

    uvloop.run(main())
