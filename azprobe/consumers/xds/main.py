"""`azprobe xds serve --config FILE` (the daemon) and `azprobe xds status` (which
streams it holds and the view each gets).

The daemon: sources (azprobe.consumers.xds.sources) feed a refresh task that rebuilds
every view's snapshot when an input changes and once a second (a document's expiry is
a change too); the Hub wakes the streams of the views whose content changed.
Stateless: every replica computes the same snapshots from Consul, so run any number.
SIGTERM drains: no new stream is accepted, and the open ones end within
[xds] drain_s (spread out, so the clients' reconnects to other replicas are too).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from azprobe.consumers.xds.config import UNIX_PREFIX, XdsSettings, load_xds_config
from azprobe.consumers.xds.credentials import server_credentials
from azprobe.consumers.xds.metrics import XdsMetrics
from azprobe.consumers.xds.server import Hub, Limits, build_server, grpc_options
from azprobe.consumers.xds.snapshot import ViewSnapshot, build_snapshot, chain_entries
from azprobe.consumers.xds.sources import GLOBAL_VIEW, CatalogSource, WeightFeeds
from azprobe.daemon import sdnotify
from azprobe.daemon.address_file import write_address_file
from azprobe.errors import AzprobeError
from azprobe.security import reloadable

log = logging.getLogger(__name__)
REFRESH_S = 1.0
FIRST_ANSWER_S = 3.0  # wait this long for Consul at start before serving equal weights


class XdsDaemon:
    def __init__(self, settings: XdsSettings) -> None:
        self.settings = settings
        self.metrics = XdsMetrics()
        self.loop = asyncio.get_running_loop()
        self.refresh_needed = asyncio.Event()
        assert settings.consul is not None
        self.catalog = {s.name: CatalogSource(settings.consul, s.consul_service, settings.topology, self._poke)
                        for s in settings.services if s.consul_service}
        self.feeds = WeightFeeds(settings.consul, settings.views, self._poke)
        self.chain = chain_entries(s.name for s in settings.services)
        self._errors_seen = 0
        self.hub = Hub(self.build(), self.metrics)

    def _poke(self) -> None:  # from the watcher threads
        self.loop.call_soon_threadsafe(self.refresh_needed.set)

    def endpoints(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for service in self.settings.services:
            if service.static is not None:
                out[service.name] = service.static
            else:
                source = self.catalog[service.name]
                out[service.name] = source.endpoints
                self.metrics.outside.labels(service.name).set(source.outside)
            self.metrics.endpoints.labels(service.name).set(sum(len(v) for v in out[service.name].values()))
        return out

    def build(self) -> dict[str, ViewSnapshot]:
        endpoints = self.endpoints()
        snapshots = {}
        for view in (GLOBAL_VIEW, *self.settings.views):
            doc = self.feeds.document(view)
            snapshots[view] = build_snapshot(view, endpoints, doc, self.chain, self.feeds.sick(view))
            self.metrics.view_weights.labels(view, "document").set(1 if doc is not None else 0)
            self.metrics.view_weights.labels(view, "equal").set(0 if doc is not None else 1)
        errors = self.feeds.errors + sum(c.errors for c in self.catalog.values())
        if errors > self._errors_seen:
            self.metrics.consul_errors.inc(errors - self._errors_seen)
            self._errors_seen = errors
        return snapshots

    async def refresh_loop(self, notifier: sdnotify.LoopNotifier) -> None:
        while True:
            try:
                await asyncio.wait_for(self.refresh_needed.wait(), REFRESH_S)
            except asyncio.TimeoutError:
                pass
            self.refresh_needed.clear()
            changed_at = max([t for t in (self.feeds.changed_at, *(c.changed_at for c in self.catalog.values()))
                              if t is not None], default=time.monotonic())
            changed = self.hub.publish(self.build(), changed_at)
            if changed:
                log.info("views changed: %s", ", ".join(changed))
            notifier.tick()

    def status(self) -> dict[str, Any]:
        return {"streams": [s.to_json() for s in self.hub.streams.values()],
                "views": {v: {"version": s.system_version, "generation": s.weights_generation}
                          for v, s in self.hub.snapshots.items()},
                "draining": self.hub.draining}

    def status_line(self) -> str:
        return f"{len(self.hub.streams)} streams; views " + ", ".join(
            f"{v}={'gen ' + str(s.weights_generation) if s.weights_generation is not None else 'equal'}"
            for v, s in sorted(self.hub.snapshots.items()))


async def start_http(daemon: XdsDaemon, host: str, port: int) -> Any:
    from aiohttp import web

    async def handle_metrics(_: web.Request) -> web.Response:
        return web.Response(body=daemon.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def handle_status(_: web.Request) -> web.Response:
        return web.Response(text=json.dumps(daemon.status(), sort_keys=True), content_type="application/json")

    async def handle_health(_: web.Request) -> web.Response:
        return web.Response(text=json.dumps({"ok": not daemon.hub.draining}), content_type="application/json",
                            status=503 if daemon.hub.draining else 200)

    app = web.Application()
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/status", handle_status)
    app.router.add_get("/healthz", handle_health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner


def _http_port(runner: Any) -> int:
    for site in runner.sites:
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            return server.sockets[0].getsockname()[1]
    raise RuntimeError("metrics server is not listening")


def _signals(loop: asyncio.AbstractEventLoop) -> asyncio.Event:
    """SIGTERM and SIGINT set the returned event. SIGHUP's default action would end the
    server; it re-reads the rotated files instead (Consul's certificates and token file),
    the config being read at start only."""
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reloadable.on_sighup)
    return stop


async def serve(settings: XdsSettings, address_file: str | None, metrics_address_file: str | None) -> None:
    stop = _signals(asyncio.get_running_loop())
    credentials = server_credentials(settings.tls) if settings.tls is not None else None  # bad files: exit 2 now
    daemon = XdsDaemon(settings)
    for source in daemon.catalog.values():
        source.start()
    daemon.feeds.start()
    # A fresh start: give Consul a moment to answer, so clients do not get equal weights
    # first and the document a second later; with Consul down, equal weights it is.
    deadline = time.monotonic() + FIRST_ANSWER_S
    while time.monotonic() < deadline and not all(w.wait_answered(0) for w in daemon.feeds.watchers.values()):
        await asyncio.sleep(0.05)
    daemon.hub.publish(daemon.build(), time.monotonic())
    limits = Limits(max_streams=settings.max_streams, max_streams_per_client=settings.max_streams_per_client,
                    max_resource_names=settings.max_resource_names,
                    first_request_timeout_s=settings.first_request_timeout_s, idle_timeout_s=settings.idle_timeout_s,
                    drain_s=settings.drain_s)
    server = build_server(daemon.hub, limits, grpc_options(settings.max_message_bytes, settings.idle_timeout_s,
                                                           settings.keepalive_s, settings.keepalive_timeout_s))
    listen = settings.listen
    if listen.startswith(UNIX_PREFIX):
        Path(listen[len(UNIX_PREFIX):]).unlink(missing_ok=True)
    port = server.add_insecure_port(listen) if credentials is None else server.add_secure_port(listen, credentials)
    if port == 0 and not listen.startswith(UNIX_PREFIX):
        raise AzprobeError(f"xds.listen: cannot bind {listen}")
    await server.start()
    http = None
    if settings.metrics_listen is not None:
        http = await start_http(daemon, *settings.metrics_listen)
        if metrics_address_file:
            write_address_file(metrics_address_file, settings.metrics_listen[0], _http_port(http))
    if address_file:
        if listen.startswith(UNIX_PREFIX):
            Path(address_file).write_text(listen + "\n")
        else:
            write_address_file(address_file, listen.rsplit(":", 1)[0].strip("[]"), port)
    notifier = sdnotify.LoopNotifier(daemon.status_line, loop_interval_s=REFRESH_S)
    notifier.started()
    log.warning("azprobe xds serving on %s: %d services, views %s", listen, len(settings.services),
                ", ".join((GLOBAL_VIEW, *settings.views)))
    refresher = asyncio.create_task(daemon.refresh_loop(notifier))
    try:
        await stop.wait()
    finally:
        notifier.stopping()
        daemon.hub.drain()
        refresher.cancel()
        deadline = time.monotonic() + settings.drain_s + 1.0
        while daemon.hub.streams and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await server.stop(grace=1.0)
        if http is not None:
            await http.cleanup()
        for source in daemon.catalog.values():
            source.stop()
        daemon.feeds.stop()


@click.group("xds")
def xds_group() -> None:
    """The xDS management server: the weights for every Envoy and proxyless gRPC client."""


@xds_group.command("serve")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="xDS server config (TOML), see systemd/xds.toml.")
@click.option("--address-file", default=None, type=click.Path(dir_okay=False),
              help="Once serving, write the gRPC address here (for xds.listen port 0).")
@click.option("--metrics-address-file", default=None, type=click.Path(dir_okay=False),
              help="Once serving, write the /metrics address here (for xds.metrics_listen port 0).")
def serve_command(config_path: str, address_file: str | None, metrics_address_file: str | None) -> None:
    """Serve ADS (SotW and delta) and EDS; each client gets its zone's weights."""
    settings = load_xds_config(config_path)
    try:
        # grpcio's asyncio server runs on the standard event loop (not uvloop).
        asyncio.run(serve(settings, address_file, metrics_address_file))
    except KeyboardInterrupt:
        pass


@xds_group.command("status")
@click.option("--url", default="http://127.0.0.1:9742", show_default=True, help="The server's metrics_listen.")
@click.option("--json", "as_json", is_flag=True, help="Print the server's /status document.")
def status_command(url: str, as_json: bool) -> None:
    """Which streams the server holds and which view each gets."""
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=5) as response:
            doc = json.loads(response.read(4 << 20))
    except (OSError, ValueError) as exc:
        raise AzprobeError(f"cannot read {url}/status: {exc}") from None
    if as_json:
        click.echo(json.dumps(doc, sort_keys=True))
        return
    for view, info in sorted(doc.get("views", {}).items()):
        gen = info.get("generation")
        click.echo(f"view {view}: {'generation ' + str(gen) if gen is not None else 'equal weights'} "
                   f"(version {info.get('version')})")
    for s in doc.get("streams", []):
        click.echo(f"stream {s['id']} {s['kind']} view={s['view']} node={s['node']!r} peer={s['peer']} "
                   f"responses={s['responses']} nacks={s['nacks']}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(xds_group())
