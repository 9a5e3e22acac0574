"""What the Prometheus source costs the controller per cycle: N nodes x 4 paths (3 AZs +
"other"), the answer to its one query holding `--scrapes` raw samples per series (a
lookback of that many scrape intervals), as Prometheus would send it.

Measures the answer's size and series count, and the controller CPU to decode it
(json.loads), validate and group it (parse_answer) and build every node's windows
(node_windows, each checked by parse_window). Prints ONE JSON line.

    .venv/bin/python bench/prometheus_source.py [--nodes 1000] [--scrapes 3]

`--hostile bomb|flood`: a real controller (subprocess, devconsul, leader) reads a
Prometheus (tests/hostileprom.py, loopback) that answers a small healthy fleet until the
first weights document is written, then turns hostile for --cycles cycles: `bomb` adds a
400-series, ~21 MB series bomb to every answer, `flood` sends 100 MB of tiny series (over
the default max_series). Every [prometheus] bound at its default, but query_timeout_s
with --query-timeout (the default 2 s refuses a bomb on this 2-core box; 10 s lets every
one be read and ingested). Polls the controller's /metrics and /healthz and
Consul every 0.2 s and prints ONE JSON line: cycle p50/p99 (per cycle, from the cycle
histogram's sum and count), the interval, the slowest /healthz, the controller's peak RSS,
session losses (the leader key's session changing or freed), the oldest the weights
document got (publish staleness) and the answers read. Goal: cycle p99 <= 2 x interval,
peak RSS <= 300 MB, no session lost, staleness <= heartbeat + 2 intervals.

    .venv/bin/python bench/prometheus_source.py --hostile bomb [--cycles 60] [--interval 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from azprobe.agent.prom import AgentCollector  # noqa: E402
from azprobe.controller.config import PrometheusSettings  # noqa: E402
from azprobe.controller.prom_windows import SERIES_NAMES, node_windows, parse_answer  # noqa: E402
from tests.fakeagent import PathSpec  # noqa: E402
from tests.promagent import SyntheticAgent  # noqa: E402


class SpreadPath(PathSpec):
    """Latencies spread over two octaves around the path's RTT (~8 classic buckets each),
    as real paths are, rather than one value."""

    def stats(self, src: str):
        stats = super().stats(src)
        for hist, centre_ms in ((stats.rtt_us, self.rtt_ms), (stats.connect_us, self.connect_ms)):
            n = hist.total
            hist.counts.clear()
            for i in range(n):
                hist.record(int(centre_ms * 1000 * 2 ** (2 * i / max(n - 1, 1) - 1)))
        return stats


def answer_for(nodes: int, scrapes: int) -> dict:
    paths = [SpreadPath("az-a", rtt_ms=0.4), SpreadPath("az-b", rtt_ms=0.6, failures=2),
             SpreadPath("az-c", rtt_ms=0.5), SpreadPath("other", conn_attempts=3, rtt_ms=20)]
    agent = SyntheticAgent("template", "az-a", paths)
    per_scrape = []
    for i in range(scrapes):
        agent.tick(end=1000.0 + i)
        per_scrape.append([s for f in AgentCollector(agent).collect() for s in f.samples if s.name in SERIES_NAMES])
    result = []
    for n in range(nodes):
        node = f"node-{n}"
        series: dict[tuple, dict] = {}
        for i, samples in enumerate(per_scrape):
            for s in samples:
                labels = {"__name__": s.name, **s.labels, "node": node, "instance": f"10.1.{n // 250}.{n % 250}:9740",
                          "job": "azprobe-agent"}
                entry = series.setdefault(tuple(sorted(labels.items())), {"metric": labels, "values": []})
                entry["values"].append([1000.0 + i, repr(float(s.value))])
        result.extend(series.values())
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


HEARTBEAT_S = 1.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def hostile(mode: str, cycles: int, interval_s: float, query_timeout_s: float | None) -> dict:
    from azprobe.clients.consul import ConsulSettings, make_client
    from azprobe.dev.devconsul.testing import DevConsul
    from tests.controller_harness import ControllerProcess, controller_config, leader_holder, read_weights
    from tests.hostileprom import AZS, HostilePrometheus

    with tempfile.TemporaryDirectory(prefix="azprobe-bench-prom-") as tmp, \
            DevConsul(data_dir=Path(tmp) / "devconsul") as dc, HostilePrometheus() as prom:
        config = controller_config("ctl", dc.url, [], interval_s=interval_s, evaluation_window_s=5.0)
        config["agents"] = {"source": "prometheus"}
        config["prometheus"] = {"url": prom.url("live")}
        if query_timeout_s is not None:
            config["prometheus"]["query_timeout_s"] = query_timeout_s
        config["topology"] = {"azs": list(AZS)}
        config["safety"].update(heartbeat_s=HEARTBEAT_S, stale_after_s=20, equal_after_s=40)
        client = make_client(ConsulSettings(address=dc.url))
        with ControllerProcess(Path(tmp), config) as ctl:
            deadline = time.monotonic() + 120
            while not (ctl.healthz() or {}).get("leader") or read_weights(client) is None:
                if time.monotonic() > deadline or not ctl.running:
                    raise SystemExit(f"no leader and weights within 120 s:\n{ctl.log()[-2000:]}")
                time.sleep(0.2)
            holder = leader_holder(client)
            prom.live = mode
            held, losses = holder["session"], 0
            start_count = ctl.metric("azprobe_controller_cycle_seconds_count") or 0.0
            last = (start_count, ctl.metric("azprobe_controller_cycle_seconds_sum") or 0.0)
            durations: list[float] = []
            healthz_max = staleness = 0.0
            began = time.monotonic()
            while last[0] < start_count + cycles:
                if time.monotonic() - began > cycles * interval_s * 4 + 60:
                    break  # a stalled controller: report what the polls saw
                t = time.monotonic()
                health = ctl.healthz()
                healthz_max = max(healthz_max, time.monotonic() - t if health else 2.0)
                count = ctl.metric("azprobe_controller_cycle_seconds_count")
                total = ctl.metric("azprobe_controller_cycle_seconds_sum")
                if count is not None and total is not None and count > last[0]:
                    n = int(count - last[0])
                    durations += [(total - last[1]) / n] * n
                    last = (count, total)
                session = (leader_holder(client) or {}).get("session")
                if session != held:  # the leader's session freed or replaced: one loss
                    losses += held is not None
                    held = session
                doc = read_weights(client)
                staleness = max(staleness, time.time() - doc.generated_at if doc else float("inf"))
                time.sleep(0.2)
            metrics = {name: ctl.metric(f"azprobe_controller_collect_{name}_total")
                       for name in ("windows_ingested", "pull_errors", "pull_timeouts", "pull_overruns")}
            rss = _peak_rss_mb(ctl.proc.pid)
            sent = prom.bytes_sent(mode)
    p99 = _percentile(durations, 0.99)
    return {
        "bench": "prometheus_source_hostile", "mode": mode, "interval_s": interval_s, "cycles": len(durations),
        "cycle_p50_s": round(statistics.median(durations), 3) if durations else None,
        "cycle_p99_s": round(p99, 3), "cycle_max_s": round(max(durations, default=float("nan")), 3),
        "healthz_max_s": round(healthz_max, 3), "peak_rss_mb": round(rss, 1), "session_losses": losses,
        "publish_staleness_max_s": round(staleness, 2), "heartbeat_s": HEARTBEAT_S,
        "query_timeout_s": query_timeout_s or PrometheusSettings.query_timeout_s,
        "hostile_answers": len(sent), "answer_mb_max": round(max(sent, default=0) / 1e6, 1),
        **{k: v for k, v in metrics.items()},
        "goal_met": bool(durations) and p99 <= 2 * interval_s and rss <= 300 and losses == 0
        and staleness <= HEARTBEAT_S + 2 * interval_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--scrapes", type=int, default=3)
    parser.add_argument("--hostile", choices=("bomb", "flood"), default=None)
    parser.add_argument("--cycles", type=int, default=60)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--query-timeout", type=float, default=None)
    args = parser.parse_args()
    if args.hostile:
        print(json.dumps(hostile(args.hostile, args.cycles, args.interval, args.query_timeout)))
        return
    body = json.dumps(answer_for(args.nodes, args.scrapes)).encode()
    t0 = time.process_time()
    doc = json.loads(body)
    t1 = time.process_time()
    answer = parse_answer(doc, max_series=10**8)
    t2 = time.process_time()
    windows = 0
    for series in answer.nodes.values():
        windows += len(node_windows(series, after=None).windows)
    t3 = time.process_time()
    series_count = len(doc["data"]["result"])
    print(json.dumps({
        "bench": "prometheus_source", "nodes": args.nodes, "scrapes_per_series": args.scrapes,
        "series": series_count, "series_per_node": series_count // args.nodes,
        "answer_mb": round(len(body) / 1e6, 1), "windows": windows,
        "decode_s": round(t1 - t0, 3), "parse_s": round(t2 - t1, 3), "windows_s": round(t3 - t2, 3),
        "cpu_us_per_node_window": round((t3 - t0) / max(windows, 1) * 1e6),
    }))


if __name__ == "__main__":
    main()
