"""The data-plane drill: az-b +200 ms and 5 % loss, users' requests through a real Envoy,
for static weights, Envoy's outlier detection and azprobe; N runs; plus fail-static.

One lab + devconsul + agent for all runs. Per run and mode: the after-detection window's
requests, ok %, P50/P95/P99/P99.9, the sick AZ's share (Envoy's counters and the
client's view), the whole fault window's P99 and ok %, detection and recovery. Then the
fail-static check (az-b drained and frozen, az-a and az-c blackholed): seconds until the
users succeed through az-b.

Prints one line per run on stderr, then ONE final JSON line on stdout:
  {"runs": N, "modes": {mode: {figure: [per run ...]}}, "fail_static": [...], ...}
Needs root (namespaces, BPF).
"""

from __future__ import annotations

import argparse
import json
import sys

from azprobe.dev.demo.runner import LoopStack
from azprobe.dev.demo.scenarios import DEFAULT_SCENARIO, get_scenario
from azprobe.dev.drill.failstatic import run_fail_static
from azprobe.dev.drill.runner import MODES, DrillSpec, run_drill_modes
from azprobe.dev.lab.lab import unique_lab_name

FIGURES = ("requests", "success_pct", "p50_ms", "p95_ms", "p99_ms", "p999_ms", "sick_share_envoy",
           "sick_share_client")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="drills to run (default 1; 5 for the doc's figures)")
    parser.add_argument("--fault-s", type=float, default=20.0, help="fault per mode (default 20 s)")
    parser.add_argument("--rate", type=float, default=100.0, help="user requests per second (default 100)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--no-fail-static", action="store_true")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    spec = DrillSpec(scenario=get_scenario(DEFAULT_SCENARIO), modes=tuple(args.modes.split(",")),
                     fault_s=args.fault_s, rate=args.rate)
    table: dict[str, dict[str, list]] = {m: {} for m in spec.modes}
    fail_static = []
    with LoopStack(lab_name=unique_lab_name("bdr")) as stack:
        for run in range(1, args.runs + 1):
            report = run_drill_modes(stack, spec)
            for f in report.figures:
                row = table[f.mode]
                after = f.after_detection.to_json()
                for name in FIGURES:
                    row.setdefault(name, []).append(after[name])
                row.setdefault("baseline_p99_ms", []).append(f.baseline.p99_ms)
                row.setdefault("fault_p99_ms", []).append(f.fault.p99_ms)
                row.setdefault("fault_success_pct", []).append(f.fault.success_pct)
                row.setdefault("detect_s", []).append(f.detect_s)
                row.setdefault("recover_s", []).append(f.recover_s)
                row.setdefault("kv_detect_s", []).append(f.kv_detect_s)
                print(f"run {run}/{args.runs} {f.mode}: after detection {after}", file=sys.stderr, flush=True)
            if not args.no_fail_static:
                result = run_fail_static(stack)
                fail_static.append(result.to_json())
                print(f"run {run}/{args.runs} fail-static: {result.to_json()}", file=sys.stderr, flush=True)
    print(json.dumps({"scenario": spec.scenario.name, "runs": args.runs, "fault_s": args.fault_s,
                      "rate_rps": args.rate, "window": "after detection (or after 5 s when never detected)",
                      "modes": table, "fail_static": fail_static,
                      "fail_static_failover_s": [r["failover_s"] for r in fail_static]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
