"""Benchmark: the controller's per-cycle CPU without the network, phase by phase.

bench/controller_scale.py measures whole cycles, pulls included. This one feeds the same
controller (Collector, WindowStore, Decider) the pages the bulk fake agents serve
(tests/fakeagent.py, compact encoding), already read off the wire, for `--agents` agents
over `--rounds` rounds, each round one interval later than the last. It times, in CPU
seconds of this process, each phase of a cycle: decoding the pages, pruning the store,
ingesting the windows, the survey (the zones seen, and the spike detector fed), and the
decision (every node's evidence, the quorum's four views, safety). The work of every round after
the warmup is the same, so the spread between the fastest and the slowest round is the
box's, not the controller's.

Prints ONE JSON line: each phase's p50 (ms), the round's total p50 / p99 / min / max
(ms), max / min, the windows the store holds, and load_avg_1m.

    .venv/bin/python bench/controller_cycle_cpu.py [--agents 5000] [--rounds 40] [--warmup 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from azprobe.clients.transport import MAX_BODY_BYTES  # noqa: E402
from azprobe.contracts.windowcodec import COMPACT_TYPE, decode_page  # noqa: E402
from azprobe.controller.gcpace import pace_gc  # noqa: E402
from azprobe.controller.main import Controller  # noqa: E402
from bench.controller_scale import BENCH_AZS, bench_config, quantile  # noqa: E402
from tests.fakeagent import _BulkAgents  # noqa: E402

INTERVAL_S = 1.0
PHASES = ("decode", "prune", "ingest", "survey", "decide")


def run(agents: int, rounds: int, warmup: int) -> dict:
    # bench/controller_scale.py's controller; its agents are never pulled (port 9: discard)
    controller = Controller(bench_config([f"http://127.0.0.1:9/a/{i}" for i in range(agents)], INTERVAL_S))
    collector, decider = controller.collector, controller.decider
    fakes = _BulkAgents(agents, BENCH_AZS, INTERVAL_S, attempts=50)
    cursors = list(collector.cursors.values())
    base = time.time()
    pace_gc()  # as run_event_loop does for the daemon
    spent: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for index in range(warmup + rounds):
        # The rounds run on a clock of their own, one interval apart, whatever they take
        # (the fakes too): one new window per agent per round.
        now = base + index * INTERVAL_S
        bodies = [fakes.body(key, cursor.last_seq, compact=True, now=fakes.started + (index + 0.5) * INTERVAL_S)
                  for key, cursor in enumerate(cursors)]
        marks = [time.process_time()]
        pages = [decode_page(body, COMPACT_TYPE, max_bytes=MAX_BODY_BYTES) for body in bodies]
        marks.append(time.process_time())
        collector.store.prune(now)
        marks.append(time.process_time())
        for cursor, page in zip(cursors, pages):
            collector.ingest(cursor, page, now)
        marks.append(time.process_time())
        seen, spikes = decider.survey(now)
        marks.append(time.process_time())
        decider.decide(seen, spikes, now, controller.handover.take_inputs().controls.controls)
        marks.append(time.process_time())
        if index >= warmup:
            for phase, before, after in zip(PHASES, marks, marks[1:]):
                spent[phase].append(after - before)
    totals = [sum(parts) for parts in zip(*spent.values())]
    return {**{f"{phase}_p50_ms": round(1000 * statistics.median(v), 1) for phase, v in spent.items()},
            "total_p50_ms": round(1000 * statistics.median(totals), 1),
            "total_p99_ms": round(1000 * quantile(totals, 0.99), 1),
            "total_min_ms": round(1000 * min(totals), 1), "total_max_ms": round(1000 * max(totals), 1),
            "max_over_min": round(max(totals) / min(totals), 2),
            "windows_in_evaluation": len(collector.store)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=6)
    args = parser.parse_args()
    result = run(args.agents, args.rounds, args.warmup)
    result.update({"agents": args.agents, "rounds": args.rounds, "load_avg_1m": round(os.getloadavg()[0], 2)})
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
