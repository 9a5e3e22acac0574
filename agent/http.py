"""The agent's HTTP face: /v1/windows, /v1/events, /metrics, /healthz.

Served by agent.httpserver, which bounds what the network can take (connections, whole-
request deadlines, requests in flight per pool; docs/scale.md): /v1/* and the open
endpoints are answered from separate pools, so neither can take the other's slots, and
connections that proved the token are the last pushed out when connections run short.
With a bearer token configured (agent.token_file) every /v1/* request must carry it;
without one, /v1/events (peer addresses of failing connections) is served only on a
loopback listener. /metrics and /healthz stay open for scrapers and probes.
/v1/windows speaks JSON, or the compact encoding when the client's Accept asks for it.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import threading
from collections.abc import Iterable
from typing import Protocol

from azprobe.contracts import prom
from azprobe.contracts.window import Window, is_decimal
from azprobe.contracts.windowcodec import encode_page, negotiate

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from azprobe.agent.httpserver import (BoundedHTTPServer, ConnectionLimits, Pool, Request, Response, Work,
                                     error_response)
from azprobe.agent.httpserver.tlsserve import ServerTls, TlsHTTPServer
from azprobe.agent.prom import AgentCollector, MetricsSource


class ServedState(MetricsSource, Protocol):
    """What the server reads from the agent (agent.main.Agent implements it)."""

    def windows_page(self, after: int) -> tuple[dict[str, str], list[Window]]: ...  # ({node, az, boot_id}, windows)
    def events_doc(self, after: int) -> dict: ...
    def healthy(self) -> tuple[bool, str]: ...


def _after(query: dict[str, list[str]]) -> int:
    raw = query.get("after", ["0"])[-1]
    if not is_decimal(raw):
        raise ValueError(f"after: expected a non-negative integer, got {raw!r:.40}")
    return int(raw)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


# /v1/* (the windows and events; the authorised clients when a token is set): a controller
# or three pulling every interval, `azprobe top`, `azprobe trace`; answered on the IO loop
# (a page is encoded in tens of µs). /metrics and /healthz (open by design): Prometheus and
# health checks, on one worker of their own: a flood of scrapes is one thread's work and
# 8 slots, and the pulls keep the IO loop.
V1_POOL = Pool(workers=0, slots=64)
OPEN_POOL = Pool(workers=1, slots=8)


class BearerToken:
    """The token /v1/* requests must carry ("": none). The agent's reload sets the token
    file's new content, so a rotation needs no restart: each request is checked against
    the token current when it arrives (one already routed finishes)."""

    def __init__(self, token: str = "") -> None:
        self.set(token)

    def set(self, token: str) -> None:
        # One attribute, assigned whole: the IO thread reads either token, never a mix.
        self.expected = f"Bearer {token}".encode() if token else b""


def make_server(host: str, port: int, state: ServedState, *, token: str | BearerToken = "",
                limits: ConnectionLimits = ConnectionLimits(), v1_pool: Pool = V1_POOL,
                open_pool: Pool = OPEN_POOL, tls: ServerTls | None = None) -> BoundedHTTPServer:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(state))
    bearer = token if isinstance(token, BearerToken) else BearerToken(token)
    loopback = is_loopback(host)

    def windows(after: int, media: str) -> Response:
        header, page = state.windows_page(after)
        return Response(200, encode_page(header["node"], header["az"], header["boot_id"], page, media), media)

    def events(after: int) -> Response:
        return Response(200, json.dumps(state.events_doc(after), separators=(",", ":")).encode())

    def metrics() -> Response:
        return Response(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    def healthz() -> Response:
        ok, why = state.healthy()
        return Response(200 if ok else 503, (why + "\n").encode(), "text/plain")

    def route(request: Request) -> Response | Work:
        """Cheap, on the server's IO thread: the token, the query, which pool answers.
        /v1/*: the bearer token when one is set; /v1/events also needs a token or a
        loopback listener (it names peers' addresses)."""
        path = request.path
        if path.startswith("/v1/"):
            expected = bearer.expected  # once per request: a reload may swap it meanwhile
            if expected:
                got = request.headers.get("authorization", "").encode("latin-1", "replace")
                if not hmac.compare_digest(got, expected):
                    return Response(401, b'{"error":"a bearer token is required (the controller\'s agents.token_file)"}',
                                    headers=(("WWW-Authenticate", 'Bearer realm="azprobe"'),))
            elif path == "/v1/events" and not loopback:
                return error_response(403, "/v1/events names peer addresses: set agent.token_file, "
                                           "or listen on a loopback address")
            try:
                after = _after(request.query)
            except ValueError as exc:
                return error_response(400, str(exc))
            authenticated = bool(expected)
            if path == "/v1/windows":
                media = negotiate(request.headers.get("accept"))
                return Work("v1", lambda: windows(after, media), authenticated)
            if path == "/v1/events":
                return Work("v1", lambda: events(after), authenticated)
        elif path == "/metrics":
            return Work("open", metrics)
        elif path == "/healthz":
            return Work("open", healthz)
        return error_response(404, f"no such endpoint {path[:200]}")

    pools = {"v1": v1_pool, "open": open_pool}
    server = (TlsHTTPServer((host, port), route, pools, limits, tls) if tls is not None
              else BoundedHTTPServer((host, port), route, pools, limits))
    registry.register(HttpServerCollector(server))
    return server


class HttpServerCollector:
    """What the network did to the agent's HTTP server (a slow-client flood shows here)."""

    def __init__(self, server: BoundedHTTPServer) -> None:
        self.server = server

    def collect(self) -> Iterable:
        server = self.server
        yield GaugeMetricFamily(prom.HTTP_CONNECTIONS.name, prom.HTTP_CONNECTIONS.help,
                                value=server.open_connections)
        closed = CounterMetricFamily(prom.HTTP_CLOSED.name, prom.HTTP_CLOSED.help,
                                     labels=list(prom.HTTP_CLOSED.labels))
        tls, rotated = (server.tls.refused, server.rotated) if isinstance(server, TlsHTTPServer) else (0, 0)
        for reason, n in (("evicted", server.evicted), ("timeout", server.timed_out), ("refused", server.refused),
                          ("tls", tls), ("rotated", rotated)):
            closed.add_metric([reason], n)
        yield closed
        busy = CounterMetricFamily(prom.HTTP_BUSY.name, prom.HTTP_BUSY.help,
                                   labels=list(prom.HTTP_BUSY.labels))
        for pool, n in sorted(server.busy().items()):
            busy.add_metric([pool], n)
        yield busy


def serve_in_background(server: BoundedHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="agent-http", daemon=True)
    thread.start()
    return thread
