"""Closed-loop latency: a scenario run (default: az-b +200 ms, 5 % loss) N times.

One lab + devconsul + agent for all runs; every run starts fresh controllers on a fresh
KV prefix, so each detect/recover figure is the whole loop's (probe -> agent window ->
controller pull/merge/model/safety -> fenced KV txn -> blocking watch).

Prints one line per run, then ONE final JSON line:
  {"runs": N, "detect_s": {"p50", "max", "values"}, "recover_s": {...}, "goal_met": bool, ...}
Goal: detect p50 <= 3 s, max <= 5 s. Needs root (namespaces, BPF).

`--scenario controller-failover --fault-s 36` also reports the failover figures the
tests only order (tests/e2e/test_loop.py): takeover_s, write_after_release_s (goal:
lock-delay + 2 s) and max_generation_gap (goal: lock-delay + 2 s + one probe per cycle).

`--source prometheus`: the controllers read the agent through a real Prometheus server
scraping it every --scrape-interval-s (docs/prometheus.md) instead of pulling it.

`--config shipped`: the agents' window interval, the controllers' evaluation window and
drain dwell come from systemd/agent.toml and systemd/controller.toml, read by the
daemons' own parsers (what a fresh install runs), instead of the demo's shorter ones.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from azprobe.dev.demo.metrics import percentile
from azprobe.dev.demo.configs import LEADER_PROBE_FAILURES
from azprobe.agent.config import DEFAULT_INTERVAL_S
from azprobe.controller.config import DEFAULT_EVALUATION_WINDOW_S
from azprobe.dev.demo.runner import LOCK_DELAY_S, LoopStack, run_scenario
from azprobe.dev.demo.scenarios import DEFAULT_SCENARIO, SCENARIOS, get_scenario
from azprobe.dev.lab.lab import unique_lab_name

GOAL_DETECT_P50_S = 3.0
GOAL_DETECT_MAX_S = 5.0
SHIPPED = Path(__file__).resolve().parent.parent / "systemd"


@dataclass(frozen=True)
class LoopTimings:
    agent_interval_s: float
    evaluation_window_s: float
    drain_dwell_s: float | None  # None: the controller's default

    def safety(self) -> dict[str, float] | None:
        """The controllers' [safety] keys these timings set (run_scenario's `safety`)."""
        return None if self.drain_dwell_s is None else {"drain_dwell_s": self.drain_dwell_s}


def shipped_timings() -> LoopTimings:
    """The timing fields a fresh install runs, through the daemons' own parsers."""
    from azprobe.agent.config import load_agent_config
    from azprobe.controller.config import load_config

    controller = load_config(SHIPPED / "controller.toml")
    return LoopTimings(load_agent_config(SHIPPED / "agent.toml").interval_s,
                       controller.controller.evaluation_window_s, controller.safety.drain_dwell_s)


def summarize(values: list[float | None]) -> dict[str, object]:
    seen = [v for v in values if v is not None]
    return {"p50": percentile(seen, 50), "max": max(seen, default=None), "values": values,
            "missed": len(values) - len(seen)}


def failover_figures(failover: dict[str, list[float | None]]) -> dict[str, object]:
    """The failover run's figures and their goals; nothing for a run without a kill."""
    if all(v is None for v in failover["takeover_s"]):
        return {}
    goals = {"write_after_release_s": LOCK_DELAY_S + 2.0,
             "max_generation_gap": LOCK_DELAY_S + 2.0 + LEADER_PROBE_FAILURES * 1.0}  # + a probe per cycle
    return {**{name: summarize(values) for name, values in failover.items()}, "failover_goal": goals}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="scenario runs (default 5)")
    parser.add_argument("--scenario", default=DEFAULT_SCENARIO, choices=sorted(SCENARIOS),
                        help=f"the scenario (default {DEFAULT_SCENARIO})")
    parser.add_argument("--fault-s", type=float, default=10.0, help="fault phase per run (default 10 s)")
    parser.add_argument("--drain-dwell-s", type=float, default=None,
                        help="controllers' drain dwell (default: the controller's own)")
    parser.add_argument("--source", choices=("direct", "prometheus"), default="direct",
                        help="how the controllers read the agent (default direct)")
    parser.add_argument("--scrape-interval-s", type=float, default=1.0, help="Prometheus scrape interval")
    parser.add_argument("--config", choices=("demo", "shipped"), default="demo",
                        help="timings: the demo's (default) or systemd/*.toml's, as installed")
    args = parser.parse_args(argv)
    timings = (shipped_timings() if args.config == "shipped"
               else LoopTimings(DEFAULT_INTERVAL_S, DEFAULT_EVALUATION_WINDOW_S, args.drain_dwell_s))
    dwell = timings.drain_dwell_s
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    scenario = get_scenario(args.scenario)
    detects: list[float | None] = []
    recovers: list[float | None] = []
    reversals: list[int] = []
    failover: dict[str, list[float | None]] = {"takeover_s": [], "write_after_release_s": [],
                                               "max_generation_gap": []}
    with LoopStack(lab_name=unique_lab_name("bench"), agent_interval_s=timings.agent_interval_s) as stack, \
            ExitStack() as extra:
        prometheus_url = None
        if args.source == "prometheus":
            from azprobe.dev.promserver import PrometheusServer

            prom = extra.enter_context(PrometheusServer(stack.work_dir / "prometheus",
                                                        [u.removeprefix("http://") for u in stack.agent_urls.values()],
                                                        scrape_interval_s=args.scrape_interval_s))
            prometheus_url = prom.url
        for run in range(1, args.runs + 1):
            result = run_scenario(stack, scenario, fault_s=args.fault_s, safety=timings.safety(),
                                  prometheus_url=prometheus_url, evaluation_window_s=timings.evaluation_window_s)
            m = result.metrics
            detects.append(m.detect_s)
            recovers.append(m.recover_s)
            reversals.append(m.direction_reversals)
            for name, values in failover.items():
                values.append(getattr(m, name))
            print(f"run {run}/{args.runs}: detect_s={m.detect_s} recover_s={m.recover_s} "
                  f"during={m.shares_during} reversals={m.direction_reversals}", file=sys.stderr, flush=True)
    detect = summarize(detects)
    goal_met = (detect["missed"] == 0 and detect["p50"] is not None
                and detect["p50"] <= GOAL_DETECT_P50_S and detect["max"] <= GOAL_DETECT_MAX_S)
    print(json.dumps({"scenario": scenario.name, "source": args.source, "runs": args.runs, "fault_s": args.fault_s,
                      "config": args.config, "timings": asdict(timings),
                      "drain_dwell_s": dwell if dwell is not None else "controller default",
                      "detect_s": detect, "recover_s": summarize(recovers),
                      "direction_reversals": reversals,
                      **failover_figures(failover),
                      "goal": {"detect_p50_s": GOAL_DETECT_P50_S, "detect_max_s": GOAL_DETECT_MAX_S},
                      "goal_met": goal_met}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
