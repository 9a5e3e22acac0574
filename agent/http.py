"""The agent's HTTP face: /v1/windows, /v1/events, /metrics, /healthz (stdlib server).

Bounded against the network (docs/scale.md): at most `max_connections` connections are
served at once (one thread each; more are answered 503 and closed), every socket read
and write has a timeout, and a client that goes away is a debug line, not a traceback.
With a bearer token configured (agent.token_file) every /v1/* request must carry it;
without one, /v1/events (peer addresses of failing connections) is served only on a
loopback listener. /metrics and /healthz stay open for scrapers and probes.
/v1/windows speaks JSON, or the compact encoding when the client's Accept asks for it.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from azprobe.contracts.window import Window
from azprobe.contracts.windowcodec import encode_page, negotiate

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from azprobe.agent.prom import AgentCollector, MetricsSource

log = logging.getLogger(__name__)


class AgentState(MetricsSource, Protocol):
    """What the server reads from the agent (agent.main.Agent implements it)."""

    def windows_page(self, after: int) -> tuple[dict[str, str], list[Window]]: ...  # ({node, az, boot_id}, windows)
    def events_doc(self, after: int) -> dict: ...
    def healthy(self) -> tuple[bool, str]: ...


def _after(query: dict[str, list[str]]) -> int:
    raw = query.get("after", ["0"])[-1]
    if not raw.isdigit():
        raise ValueError(f"after: expected a non-negative integer, got {raw!r:.40}")
    return int(raw)


MAX_CONNECTIONS = 64  # served at once; a pulling controller or two, top, trace, Prometheus
SOCKET_TIMEOUT_S = 10.0  # per read/write: longer than a controller's keep-alive gap
BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
                 b"Connection: close\r\nRetry-After: 1\r\n\r\nbusy\n")


class BoundedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a cap on concurrent connections and quiet disconnects."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], handler: Any, max_connections: int = MAX_CONNECTIONS) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._slots = threading.BoundedSemaphore(max_connections)
        self._count_lock = threading.Lock()
        self.active = 0  # connections being served now
        self.rejected = 0  # connections answered 503 because every slot was taken
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.rejected += 1
            try:
                request.settimeout(0.5)  # the accept loop must not wait on a slow client
                request.sendall(BUSY_RESPONSE)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        with self._count_lock:
            self.active += 1
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def _release(self) -> None:
        with self._count_lock:
            self.active -= 1
        self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("http: client %s went away: %s", client_address[0], exc)
        else:
            log.exception("http: error serving %s", client_address[0])


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def make_server(host: str, port: int, state: AgentState, *, token: str = "",
                max_connections: int = MAX_CONNECTIONS, timeout_s: float = SOCKET_TIMEOUT_S) -> BoundedHTTPServer:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(state))
    expected = f"Bearer {token}".encode() if token else b""
    events_open = bool(token) or is_loopback(host)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = timeout_s  # every read and write on the connection (StreamRequestHandler)

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, doc: dict) -> None:
            self._send(code, json.dumps(doc, separators=(",", ":")).encode(), "application/json")

        def _authorised(self, path: str) -> bool:
            """/v1/*: the bearer token when one is set; /v1/events also needs a token or a
            loopback listener (it names peers' addresses)."""
            if not path.startswith("/v1/"):
                return True
            if expected:
                got = self.headers.get("Authorization", "").encode("latin-1", "replace")
                if not hmac.compare_digest(got, expected):
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Bearer realm="azprobe"')
                    body = b'{"error":"a bearer token is required (the controller\'s agents.token_file)"}'
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return False
            elif path == "/v1/events" and not events_open:
                self._json(403, {"error": "/v1/events names peer addresses: set agent.token_file, "
                                          "or listen on a loopback address"})
                return False
            return True

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            if not self._authorised(url.path):
                return
            try:
                if url.path == "/v1/windows":
                    header, windows = state.windows_page(_after(query))
                    media = negotiate(self.headers.get("Accept"))
                    body = encode_page(header["node"], header["az"], header["boot_id"], windows, media)
                    self._send(200, body, media)
                elif url.path == "/v1/events":
                    self._json(200, state.events_doc(_after(query)))
                elif url.path == "/metrics":
                    self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif url.path == "/healthz":
                    ok, why = state.healthy()
                    self._send(200 if ok else 503, (why + "\n").encode(), "text/plain")
                else:
                    self._json(404, {"error": f"no such endpoint {url.path}"})
            except ValueError as exc:
                self._json(400, {"error": str(exc)})

        def log_message(self, fmt: str, *args: object) -> None:
            log.debug("http: " + fmt, *args)

    return BoundedHTTPServer((host, port), Handler, max_connections)


def serve_in_background(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="agent-http", daemon=True)
    thread.start()
    return thread
