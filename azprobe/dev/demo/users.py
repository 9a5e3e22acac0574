"""`make demo` on user traffic: the demo's scenario run with a real Envoy and the lab's HTTP
load in front of the loop, the users' P99, ok % and Envoy's per-AZ split in the live
view; then the drill's table for static weights vs azprobe (short windows)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from azprobe.dev.demo.runner import LoopStack, Tick, run_scenario
from azprobe.dev.demo.scenarios import Scenario
from azprobe.dev.lab.topology import DEFAULT_NODES_PER_AZ
from azprobe.dev.demo.view import UserView, ViewState
from azprobe.dev.drill.metrics import envoy_share, in_window, parse_admin, parse_records, percentile
from azprobe.dev.drill.runner import DataPlane, DrillReport, DrillSpec, run_drill_modes

LIVE_WINDOW_S = 3.0
# The closing side-by-side drill is short so `make demo` stays a few minutes; bench/drill.py
# runs the full-length one.
SHORT_DRILL = {"fault_s": 12.0, "baseline_s": 4.0, "recovery_s": 4.0}


def user_view(records_path: Path, admin_path: Path, azs: list[str], now: float | None = None,
              window_s: float = LIVE_WINDOW_S) -> UserView | None:
    """The last `window_s` of the load client's records and Envoy's counters."""
    now = time.monotonic() if now is None else now
    try:
        records = in_window(parse_records(records_path.read_text()), now - window_s - 0.5, now - 0.5)
    except FileNotFoundError:
        return None
    admin = parse_admin(admin_path.read_text()) if admin_path.exists() else []
    split = {az: envoy_share(admin, [az], now - window_s, now) for az in azs}
    source = "envoy"
    if any(v is None for v in split.values()):
        split = {az: (sum(1 for r in records if r.az == az) / len(records) if records else 0.0) for az in azs}
        source = "client"
    latencies = sorted(r.latency_ms for r in records)
    return UserView(window_s=window_s, requests=len(records), p99_ms=percentile(latencies, 99),
                    success_pct=100.0 * sum(1 for r in records if r.ok) / len(records) if records else None,
                    split={az: v or 0.0 for az, v in split.items()}, split_source=source)


def run_user_demo(scenario: Scenario, *, fault_s: float | None, tick: Tick | None, lab_name: str,
                  keep: bool = False, progress: Callable[[str], None] = lambda m: None,
                  compare: bool = True, nodes_per_az: int = DEFAULT_NODES_PER_AZ) -> tuple[Any, DrillReport | None]:
    """Stack up; the scenario run with users through Envoy; the static-vs-azprobe
    drill's table; stack down (always). Returns (the demo's ScenarioResult, the table's report)."""
    stack = LoopStack(keep=keep, lab_name=lab_name, nodes_per_az=nodes_per_az,
                      servers_per_az=scenario.servers_per_az)
    try:
        stack.start(progress)
        prefix = f"azprobe/demo-{uuid.uuid4().hex[:8]}/"
        spec = DrillSpec(scenario=scenario, modes=("azprobe",))
        plane = DataPlane(stack, "azprobe", spec, stack.work_dir / "demo-users", prefix)
        progress("Envoy and user traffic (envoy-eds --watch keeps Envoy's EDS in step with KV)")
        plane.start()
        try:
            def with_users(state: ViewState) -> None:
                plane.check_alive()
                state.users = user_view(plane.records_path, plane.admin_path, stack.azs)
                if tick is not None:
                    tick(state)

            progress(f"scenario {scenario.name}")
            result = run_scenario(stack, scenario, fault_s=fault_s, prefix=prefix, tick=with_users)
        finally:
            plane.close()
        report = None
        if compare:
            progress("side by side: static weights vs azprobe on user traffic (short windows)")
            report = run_drill_modes(stack, DrillSpec(scenario=scenario, modes=("static", "azprobe"), **SHORT_DRILL),
                                     progress)
        return result, report
    finally:
        progress("teardown" + (f" (keeping the lab and {stack.work_dir})" if keep else ""))
        stack.close()
