"""Soak: the loop on the lab with the shipped defaults for --minutes, false drains counted.

One lab (3 AZs x 3 client nodes x 3 servers per AZ), devconsul, one agent per client node
and a controller, all with the shipped timings (systemd/agent.toml and
systemd/controller.toml through the daemons' own parsers, as `bench/loop.py --config
shipped`). The minutes are split evenly over six conditions, none of which should drain
anything:

  healthy    no fault
  jitter     az-c +8 ms, on and off every 2 s (under the default model's 10 ms tolerance)
  uplink     az-b's uplink +200 ms and 5 % loss: a sick source, not a sick destination
  sick-host  one of az-b's 3 servers +200 ms and 5 % loss: a sick host, not a sick zone
  flap       az-b +200 ms and 5 % loss, 5 s on, 5 s off
  restarts   the agents restarted in turn (SIGTERM, started again), one every RESTART_EVERY_S

A false drain: a zone's published share falling below DETECT_BELOW_SHARE (the demo's
detection threshold), counted once per fall, from the healthy baseline through the
condition's recovery. The flapping switch is a real fault half of the time, so users are
better off with its zone drained and held; there only the falls after the first (a drain
let go and taken again: oscillation) are false. Each condition runs on fresh controllers
and a fresh KV prefix.

Prints one line per condition, then ONE JSON line:
  {"minutes", "timings", "conditions": {name: {"false_drains", "min_share", "states",
   "seconds", ...}}, "false_drains", "goal_met"}
Goal: 0 false drains. Needs root (namespaces, BPF).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loop import LoopTimings, shipped_timings  # noqa: E402  (bench/ is sys.path[0])

from azprobe.dev.demo.metrics import DETECT_BELOW_SHARE, KvSample  # noqa: E402
from azprobe.dev.demo.runner import LoopStack, run_scenario  # noqa: E402
from azprobe.dev.demo.scenarios import SCENARIOS, FaultSpec, Scenario  # noqa: E402
from azprobe.dev.demo.view import ViewState  # noqa: E402
from azprobe.dev.lab.faults import Fault  # noqa: E402
from azprobe.dev.lab.lab import unique_lab_name  # noqa: E402

SERVERS_PER_AZ = 3
RESTART_EVERY_S = 20.0
JITTER_MS = 8.0  # below DefaultModelConfig.latency_tolerance_ms (10 ms)

HELD_DRAIN_ALLOWED = frozenset({"flap"})
CONDITIONS: dict[str, Scenario] = {
    "healthy": Scenario("healthy", "no fault", (), expect_drain=False),
    "jitter": Scenario("jitter", f"az-c +{JITTER_MS:g} ms, on and off every 2 s",
                       (FaultSpec("az-c", Fault(delay_ms=JITTER_MS)),), flap_period_s=2.0, expect_drain=False),
    "uplink": SCENARIOS["uplink"],
    "sick-host": SCENARIOS["gray-host"],
    "flap": SCENARIOS["flap"],
    "restarts": Scenario("restarts", f"one agent restarted every {RESTART_EVERY_S:g} s", (), expect_drain=False),
}


def falls_below(samples: Sequence[KvSample], below: int = DETECT_BELOW_SHARE) -> int:
    """How many times any zone's share fell below `below` (entries, not samples)."""
    falls, under = 0, set()
    for sample in samples:
        now_under = {az for az, share in sample.shares.items() if share < below}
        falls += len(now_under - under)
        under = now_under
    return falls


class Restarter:
    """The `restarts` condition: from the run's view callback (the runner's own thread, so
    no agent is ever down while the runner checks that its children live), restart the
    next agent every RESTART_EVERY_S of the fault phase."""

    def __init__(self, stack: LoopStack) -> None:
        self.stack = stack
        self.names = sorted(stack.agents)
        self.next_at = 0.0
        self.done: list[float] = []  # seconds each restart took until the agent listened

    def __call__(self, state: ViewState) -> None:
        now = time.monotonic()
        if state.phase != "fault" or now < self.next_at:
            return
        if self.next_at:
            name = self.names[len(self.done) % len(self.names)]
            self.done.append(self.stack.restart_agent(name))
        self.next_at = now + RESTART_EVERY_S


def run_condition(stack: LoopStack, name: str, seconds: float, timings: LoopTimings) -> dict[str, object]:
    scenario = CONDITIONS[name]
    restarter = Restarter(stack) if name == "restarts" else None
    started = time.monotonic()
    result = run_scenario(stack, scenario, fault_s=seconds, safety=timings.safety(),
                          evaluation_window_s=timings.evaluation_window_s, tick=restarter)
    shares = [share for s in result.samples for share in s.shares.values()]
    falls = falls_below(result.samples)
    figures: dict[str, object] = {
        "false_drains": max(0, falls - 1) if name in HELD_DRAIN_ALLOWED else falls, "drains": falls,
        "min_share": min(shares, default=None),
        "states": sorted(result.metrics.states_seen), "seconds": round(time.monotonic() - started, 1),
        "generations": len(result.samples)}
    if restarter is not None:
        figures["restarts"] = len(restarter.done)
        figures["restart_s_max"] = max(restarter.done, default=None)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="total, split over the conditions (default 30)")
    parser.add_argument("--only", choices=sorted(CONDITIONS), action="append",
                        help="run only this condition (repeatable)")
    args = parser.parse_args(argv)
    names = args.only or list(CONDITIONS)
    if args.minutes <= 0:
        parser.error("--minutes must be > 0")
    seconds = args.minutes * 60.0 / len(names)
    timings = shipped_timings()
    conditions: dict[str, dict[str, object]] = {}
    with LoopStack(lab_name=unique_lab_name("soak"), servers_per_az=SERVERS_PER_AZ,
                   agent_interval_s=timings.agent_interval_s) as stack:
        for name in names:
            conditions[name] = run_condition(stack, name, seconds, timings)
            print(f"{name}: {json.dumps(conditions[name])}", file=sys.stderr, flush=True)
    false_drains = sum(int(c["false_drains"]) for c in conditions.values())  # type: ignore[call-overload]
    print(json.dumps({"minutes": args.minutes, "seconds_per_condition": round(seconds, 1),
                      "timings": asdict(timings), "conditions": conditions, "false_drains": false_drains,
                      "goal": {"false_drains": 0}, "goal_met": false_drains == 0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
