"""A hostile Prometheus query API over real sockets, for the tests and bench/prometheus_source.py.

`HostilePrometheus` serves /<mode>/api/v1/query from a thread:
- `honest`: the last two scrapes of a small healthy fleet (SyntheticAgents, three AZs);
- `bomb`: the same, plus a series bomb: BOMB_NODES nodes whose info series hold
  MAX_SAMPLES_PER_SERIES scrapes and whose counters have a sample at every other scrape
  (so every window's t0 is missing from them), ~21 MB of valid samples in 400 series;
- `flood`: the honest fleet, then tiny series until `flood_bytes`, streamed piece by
  piece as the client reads (never held whole, in the server either), for answers over
  max_response_bytes or max_series;
- `live`: whichever of those `live` names at the time of the query (a Prometheus that
  turns hostile).

Every answer stamps its scrapes later than the previous answer's, as a live Prometheus
does, so each one brings new windows: the samples of answer k are at k*10^4 + i s. The
bomb's body is rendered once with a placeholder for k and patched per answer
(bytes.replace), so serving it costs the server little. `sent` records the bytes written
per answer.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from azprobe.agent.prom import AgentCollector
from azprobe.contracts import prom
from azprobe.controller.prom_windows import MAX_SAMPLES_PER_SERIES, SERIES_NAMES
from tests.fakeagent import PathSpec
from tests.promagent import SyntheticAgent

AZS = ("az-a", "az-b", "az-c")
BLOCK = 10_000  # answer k's scrapes are at k * BLOCK + i s, i < MAX_SAMPLES_PER_SERIES
BOMB_NODES = 80  # x 5 series: info, CPU, conn_attempts, conn_ok, lost events
PIECE = 64 << 10
_MARK = b"@"  # the placeholder for k in the bomb's timestamps


class HonestFleet:
    """NODES_PER_AZ synthetic agents per AZ, every path healthy; each answer holds their
    previous and newest scrape."""

    NODES_PER_AZ = 2

    def __init__(self) -> None:
        self.agents = [SyntheticAgent(f"node-{az}-{n}", az, [PathSpec(dst, rtt_ms=0.5, connect_ms=0.4) for dst in AZS])
                       for az in AZS for n in range(self.NODES_PER_AZ)]
        self.lock = threading.Lock()

    def series(self, t0: float, t1: float) -> list[dict]:
        out = []
        with self.lock:
            for agent in self.agents:
                before = _scrape(agent)
                agent.tick()
                after = _scrape(agent)
                for (labels, v0), (_, v1) in zip(before, after):
                    out.append({"metric": labels, "values": [[t0, repr(v0)], [t1, repr(v1)]]})
        return out


def _scrape(agent: SyntheticAgent) -> list[tuple[dict, float]]:
    return [({"__name__": s.name, **s.labels, "instance": f"{agent.node}:9740", "job": "azprobe-agent"},
             float(s.value))
            for family in AgentCollector(agent).collect() for s in family.samples if s.name in SERIES_NAMES]


def bomb_template() -> bytes:
    """The bomb's series, comma-separated, with _MARK where each timestamp's k goes."""
    n = MAX_SAMPLES_PER_SERIES
    every = [f'[@{i:04d},"1"]' for i in range(n)]
    cpu = [f'[@{i:04d},"0.250000"]' for i in range(n)]
    odd = [f'[@{i:04d},"{i * 1000003}"]' for i in range(1, n, 2)]
    parts = []
    for node in range(BOMB_NODES):
        base = {"node": f"bomb-{node}", "instance": f"bomb-{node}:9740", "job": "azprobe-agent"}
        path = {**base, prom.LABEL_SRC: "az-a", prom.LABEL_DST: "az-b"}
        for labels, values in (({"__name__": prom.INFO_SERIES, **base, "az": "az-a", "boot_id": "bomb"}, every),
                               ({"__name__": prom.CPU_SERIES, **base}, cpu),
                               ({"__name__": prom.COUNTER_SERIES["conn_attempts"], **path}, odd),
                               ({"__name__": prom.COUNTER_SERIES["conn_ok"], **path}, odd),
                               ({"__name__": prom.LOST_SERIES, **base}, odd)):
            parts.append(f'{{"metric":{json.dumps(labels)},"values":[{",".join(values)}]}}')
    return ",".join(parts).encode()


class HostilePrometheus:
    """`with HostilePrometheus() as prom:` ... prom.url("bomb"), prom.sent."""

    def __init__(self, flood_bytes: int = 100 << 20) -> None:
        self.flood_bytes = flood_bytes
        self.fleet = HonestFleet()
        self.live = "honest"  # what /live answers
        self.sent: list[tuple[str, int]] = []  # (mode, bytes written) per answer
        self._answers = 0
        self._lock = threading.Lock()
        self._bomb: bytes | None = None
        self._server: ThreadingHTTPServer | None = None

    def url(self, mode: str) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/{mode}"

    def bytes_sent(self, mode: str) -> list[int]:
        with self._lock:
            return [n for m, n in self.sent if m == mode]

    def body(self, mode: str) -> Iterator[bytes]:
        """The answer's body, piece by piece."""
        with self._lock:
            self._answers += 1
            k = self._answers
        newest = k * BLOCK + MAX_SAMPLES_PER_SERIES - 1
        honest = self.fleet.series(newest - 1, newest)
        head = b'{"status":"success","data":{"resultType":"matrix","result":['
        yield head + ",".join(json.dumps(s) for s in honest).encode()
        if mode == "bomb":
            if self._bomb is None:
                self._bomb = bomb_template()
            body = self._bomb.replace(_MARK, str(k).encode())
            for i in range(0, len(body), PIECE):
                yield (b"," if i == 0 else b"") + body[i:i + PIECE]
        elif mode == "flood":
            item = b',{"metric":{"__name__":"unrelated_series","node":"flood"},"values":[[1,"1"]]}'
            piece = item * (PIECE // len(item))
            for _ in range(self.flood_bytes // len(piece)):
                yield piece
        yield b"]}}"

    def start(self) -> "HostilePrometheus":
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # no length: the body ends when the connection does

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                mode = self.path.split("/")[1]
                mode = owner.live if mode == "live" else mode
                if mode not in ("honest", "bomb", "flood") or "/api/v1/query" not in self.path:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                sent = 0
                try:
                    for piece in owner.body(mode):
                        self.wfile.write(piece)
                        sent += len(piece)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client refused the answer: what the tests look for
                with owner._lock:
                    owner.sent.append((mode, sent))

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="hostile-prometheus", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "HostilePrometheus":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
