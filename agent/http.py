"""The agent's HTTP face: /v1/windows, /v1/events, /metrics, /healthz (stdlib server)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger(__name__)


class AgentState(Protocol):
    """What the server reads from the agent (agent.main.Agent implements it)."""

    def windows_doc(self, after: int) -> dict: ...
    def events_doc(self, after: int) -> dict: ...
    def healthy(self) -> tuple[bool, str]: ...
    def path_totals(self) -> dict[tuple[str, str], dict[str, int]]: ...
    def event_totals(self) -> dict[str, int]: ...
    def gauges(self) -> dict[str, float]: ...
    def program_stats(self) -> dict[str, tuple[int, int]]: ...


class AgentCollector:
    """Prometheus view of the agent's cumulative totals. Labels are AZ names (bounded by
    the topology) and event kinds; never addresses or ports."""

    def __init__(self, state: AgentState) -> None:
        self.state = state

    def collect(self) -> Iterable:
        totals = self.state.path_totals()
        names = sorted({name for values in totals.values() for name in values})
        for name in names:
            family = CounterMetricFamily(f"azprobe_path_{name}", f"{name} per path (src AZ -> dst AZ)",
                                         labels=["src", "dst"])
            for (src, dst), values in sorted(totals.items()):
                family.add_metric([src, dst], values.get(name, 0))
            yield family
        events = CounterMetricFamily("azprobe_events", "events sent on the perf buffer", labels=["kind"])
        for kind, n in sorted(self.state.event_totals().items()):
            events.add_metric([kind], n)
        yield events
        stats = self.state.program_stats()
        run_time = CounterMetricFamily("azprobe_bpf_run_time_ns", "BPF handler run time (needs "
                                       "sysctl kernel.bpf_stats_enabled=1)", labels=["prog"])
        run_count = CounterMetricFamily("azprobe_bpf_run_count", "BPF handler runs (needs "
                                        "sysctl kernel.bpf_stats_enabled=1)", labels=["prog"])
        for prog, (ns, count) in sorted(stats.items()):
            run_time.add_metric([prog], ns)
            run_count.add_metric([prog], count)
        yield run_time
        yield run_count
        for name, value in sorted(self.state.gauges().items()):
            yield GaugeMetricFamily(f"azprobe_{name}", name.replace("_", " "), value=value)


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
