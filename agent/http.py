"""The agent's HTTP face: /v1/windows, /v1/events, /metrics, /healthz (stdlib server)."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from azprobe.agent.prom import AgentCollector, MetricsSource

log = logging.getLogger(__name__)


class AgentState(MetricsSource, Protocol):
    """What the server reads from the agent (agent.main.Agent implements it)."""

    def windows_doc(self, after: int) -> dict: ...
    def events_doc(self, after: int) -> dict: ...
    def healthy(self) -> tuple[bool, str]: ...


def _after(query: dict[str, list[str]]) -> int:
    raw = query.get("after", ["0"])[-1]
    if not raw.isdigit():
        raise ValueError(f"after: expected a non-negative integer, got {raw!r:.40}")
    return int(raw)


def make_server(host: str, port: int, state: AgentState) -> ThreadingHTTPServer:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(state))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, doc: dict) -> None:
            self._send(code, json.dumps(doc, separators=(",", ":")).encode(), "application/json")

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            try:
                if url.path == "/v1/windows":
                    self._json(200, state.windows_doc(_after(query)))
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

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve_in_background(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="agent-http", daemon=True)
    thread.start()
    return thread
