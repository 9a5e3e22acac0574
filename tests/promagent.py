"""An agent without a kernel, served by the real agent HTTP code (azprobe.agent.http):
/v1/windows for the direct path and /metrics for Prometheus carry the *same* traffic, so
a test can feed identical input through both sources.

Each tick makes one window from the PathSpecs (tests.fakeagent) and adds it to the
cumulative totals /metrics exports, exactly as azprobe.agent.main.Agent does.

`python -m tests.promagent --agents N` serves N such agents, each on its own loopback
port through its own agent HTTP server, ticks them all every --interval, and prints their
base URLs as one JSON line on stdout once they all listen (bench/controller_scale.py
--real-agents runs it as a separate process).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from collections import Counter, deque

from azprobe.agent.http import make_server, serve_in_background
from azprobe.contracts.sketch import Histogram
from azprobe.contracts.window import COUNTER_FIELDS, HISTOGRAM_FIELDS, Utilisation, Window
from tests.fakeagent import PathSpec


class SyntheticAgent:
    """Implements azprobe.agent.http.ServedState from PathSpecs."""

    def __init__(self, node: str, az: str, paths: list[PathSpec], *, cpu: float = 0.2, mem: float = 0.3) -> None:
        self.node, self.az, self.paths = node, az, paths
        self.util = Utilisation(cpu, mem)
        self.boot_id = uuid.uuid4().hex
        self.seq = 0
        self.ring: deque[Window] = deque(maxlen=600)
        self.totals: dict[tuple[str, str], Counter] = {}
        self.hists: dict[tuple[str, str], dict[str, Histogram]] = {}
        self.lock = threading.Lock()
        self._prev_end = time.time()
        self._stop = threading.Event()
        self._server = None

    def tick(self, end: float | None = None) -> Window:
        with self.lock:
            end = time.time() if end is None else end
            self.seq += 1
            window = Window(node=self.node, az=self.az, boot_id=self.boot_id, seq=self.seq, start=self._prev_end,
                            end=max(end, self._prev_end), util=self.util, paths=[p.stats(self.az) for p in self.paths])
            self._prev_end = window.end
            self.ring.append(window)
            for p in window.paths:
                key = (p.src, p.dst)
                self.totals.setdefault(key, Counter()).update({n: getattr(p, n) for n in COUNTER_FIELDS})
                hists = self.hists.setdefault(key, {n: Histogram() for n in HISTOGRAM_FIELDS})
                for n in HISTOGRAM_FIELDS:
                    hists[n].merge(getattr(p, n))
            return window

    # --- ServedState --------------------------------------------------------------
    def windows_page(self, after: int) -> tuple[dict[str, str], list[Window]]:
        with self.lock:
            windows = [w for w in self.ring if w.seq > after]
        return {"node": self.node, "az": self.az, "boot_id": self.boot_id}, windows

    def events_doc(self, after: int) -> dict:
        return {"node": self.node, "az": self.az, "boot_id": self.boot_id, "events": []}

    def healthy(self) -> tuple[bool, str]:
        return True, "ok"

    def path_totals(self) -> dict[tuple[str, str], dict[str, int]]:
        with self.lock:
            return {k: {n: v.get(n, 0) for n in COUNTER_FIELDS} for k, v in self.totals.items()}

    def path_histograms(self) -> dict[tuple[str, str], dict[str, Histogram]]:
        with self.lock:
            return {k: {n: Histogram(h.counts) for n, h in v.items()} for k, v in self.hists.items()}

    def identity(self) -> dict[str, str]:
        return {"node": self.node, "az": self.az, "boot_id": self.boot_id}

    def latest_util(self) -> Utilisation | None:
        return self.util if self.seq else None

    def event_totals(self) -> dict[str, int]:
        return {}

    def gauges(self) -> dict[str, float]:
        return {"window_seq": float(self.seq), "lost_events_total": 0.0}

    def program_stats(self) -> dict[str, tuple[int, int]]:
        return {}

    # --- serving ------------------------------------------------------------------
    def serve(self, interval_s: float) -> str:
        """Serve on a free loopback port and tick every interval_s; returns the base URL."""
        url = self.serve_http()
        threading.Thread(target=self._ticker, args=(interval_s,), daemon=True).start()
        return url

    def serve_http(self) -> str:
        """Serve on a free loopback port (windows only when tick() is called); the base URL."""
        self._server = make_server("127.0.0.1", 0, self)
        serve_in_background(self._server)
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _ticker(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.tick()

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _serve_many(n: int, azs: list[str], interval_s: float, attempts: int) -> None:
    agents = [SyntheticAgent(f"n{i}", azs[i % len(azs)], [PathSpec(dst=d, conn_attempts=attempts) for d in azs])
              for i in range(n)]
    print(json.dumps([agent.serve_http() for agent in agents]), flush=True)
    next_at = time.monotonic()
    while True:  # one ticker for all: N ticker threads would cost the box more than the agents
        next_at += interval_s
        time.sleep(max(0.0, next_at - time.monotonic()))
        for agent in agents:
            agent.tick()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="N synthetic agents, each behind a real agent HTTP server")
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--azs", default="az-a,az-b,az-c")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--attempts", type=int, default=50)
    args = parser.parse_args()
    try:
        _serve_many(args.agents, args.azs.split(","), args.interval, args.attempts)
    except KeyboardInterrupt:
        sys.exit(0)
