"""What the Prometheus source costs the controller per cycle: N nodes x 4 paths (3 AZs +
"other"), the answer to its one query holding `--scrapes` raw samples per series (a
lookback of that many scrape intervals), as Prometheus would send it.

Measures the answer's size and series count, and the controller CPU to decode it
(json.loads), validate and group it (parse_answer) and build every node's windows
(node_windows, each checked by parse_window). Prints ONE JSON line.

    .venv/bin/python bench/prometheus_source.py [--nodes 1000] [--scrapes 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from azprobe.agent.prom import AgentCollector  # noqa: E402
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--scrapes", type=int, default=3)
    args = parser.parse_args()
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
