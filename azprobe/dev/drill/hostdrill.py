"""`azprobe lab drill --scenario gray-host`: a sick host is not a sick zone, on real user
traffic through a real Envoy.

One data plane (azprobe.dev.drill.runner.DataPlane: Envoy in the client AZ's namespace,
its EDS from `azprobe xds` over ADS or from `envoy-eds`, whose endpoints are the lab's
per-server addresses, and the load client sampling Envoy's per-host counters) stays up
through every phase; each phase is one scenario run on the same KV prefix (fresh
controllers on the shipped timings, azprobe.dev.demo.runner.run_scenario), which starts
only once the weights are even again and the sick-hosts document names nobody:

- gray-host: one server of az-b sick. The zone keeps its share; the sick-hosts document
  and `azprobe explain` name the server; Envoy shows it `degraded_eds_health` and sends
  it (almost) nothing from then on.
- gray-zone: most of az-b's servers sick. The zone drains, as under the documents' fault.

Times are CLOCK_MONOTONIC seconds, as everywhere in the drill.
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from azprobe.contracts.weights import WeightsDoc
from azprobe.dev.demo.processes import azprobe_argv
from azprobe.dev.demo.recorder import HostsRecorder
from azprobe.dev.demo.runner import LoopStack, ScenarioResult, run_scenario
from azprobe.dev.demo.scenarios import Scenario, get_scenario
from azprobe.dev.demo.view import ViewState
from azprobe.dev.drill.metrics import (DETECT_SHARE, MIN_HOLD_S, AdminSample, RequestRecord, WindowFigures, mode_figures,
                                       window_figures)
from azprobe.dev.drill.runner import DrillSpec, DataPlane
from azprobe.dev.lab.lab import TrafficSpec
from azprobe.dev.lab.topology import HTTP_PORT
from azprobe.errors import PrerequisiteError

DEGRADED_FLAG = "degraded_eds_health"  # Envoy's /clusters health_flags for an EDS DEGRADED host
# The lab's background traffic with 6 servers per AZ: every client node still opens 5
# connections a second to every server (the per-host evidence: a host needs
# min_node_samples per node over the evaluation window), but keeps one long-lived
# connection per server at 5 requests a second instead of two at 20: the default's
# ~6,500 requests a second toward 18 servers saturate a 2-core machine by themselves.
HOST_LAB_TRAFFIC = TrafficSpec(rate=5.0, conns=1, interval_ms=200.0)
EVEN_WITHIN_POINTS = 5  # "even weights": every zone's share within this of 100 / zones
PHASES: dict[str, tuple[str, ...]] = {"gray-host": ("gray-host", "gray-zone"), "gray-zone": ("gray-zone",)}
Progress = Callable[[str], None]


def host_drill_phases(name: str) -> tuple[Scenario, ...] | None:
    """The phases the host drill runs for scenario `name`; None: not a host scenario."""
    return tuple(get_scenario(p) for p in PHASES[name]) if name in PHASES else None


@dataclass
class HostPhaseFigures:
    scenario: str
    sick_hosts: list[str]  # the faulted servers' addresses
    fault_s: float
    kv_named_s: dict[str, float | None]  # per sick host: fault start -> the sick-hosts document names it
    explain_named_s: float | None  # fault start -> `azprobe explain` printed every sick host
    envoy_degraded_s: dict[str, float | None]  # per sick host: fault start -> Envoy shows degraded_eds_health
    envoy_shares_fault: dict[str, float]  # zone -> % of Envoy's upstream requests over the fault
    sick_hosts_share_after: float | None  # the sick hosts' fraction of Envoy's requests after detection
    baseline: WindowFigures
    after_detection: WindowFigures  # from the last sick host's degraded mark (or the drain) to the clear
    kv_shares_before: dict[str, int] = field(default_factory=dict)
    kv_min_share_during: dict[str, int] = field(default_factory=dict)
    kv_detect_s: float | None = None  # sick zone phases: the zone's share fell below the threshold in KV
    drain_detect_s: float | None = None  # sick zone phases: Envoy's share of the zone stays <= 1 %
    client_drain_detect_s: float | None = None  # the same by the client's record of who answered
    explain_excerpt: list[str] = field(default_factory=list)
    explain_runs: list[tuple[float, float, bool]] = field(default_factory=list)  # (started, took s, named)
    fault_apply_s: float | None = None  # the lab's time to put the fault in place

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("baseline", "after_detection")}
        out.update(baseline=self.baseline.to_json(), after_detection=self.after_detection.to_json())
        return out


@dataclass
class HostDrillReport:
    door: str
    rate_rps: float
    servers_per_az: int
    phases: list[HostPhaseFigures] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"drill": "hosts", "door": self.door, "rate_rps": self.rate_rps,
                "servers_per_az": self.servers_per_az, "phases": [p.to_json() for p in self.phases]}


class ExplainProbe:
    """The tick of a scenario run: when the fault phase begins, a thread waits until the
    sick-hosts document names every sick host, then runs `azprobe explain` (a subprocess,
    as an operator would) until it prints them too. A thread, so a slow explain on a
    loaded machine never holds up the scenario's timeline."""

    def __init__(self, stack: LoopStack, prefix: str, zone: str, sick: Sequence[str], hosts: HostsRecorder) -> None:
        self.stack, self.prefix, self.zone, self.sick, self.hosts = stack, prefix, zone, list(sick), hosts
        self.fault_t: float | None = None
        self.named_t: float | None = None
        self.lines: list[str] = []
        self.runs: list[tuple[float, float, bool]] = []  # (started, took s, named)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, view: ViewState) -> None:
        if view.phase == "fault" and self._thread is None:
            self.fault_t = time.monotonic() - view.phase_elapsed_s
            self._thread = threading.Thread(target=self._watch, name="explain probe", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=40.0)

    def _watch(self) -> None:
        assert self.fault_t is not None
        while not self._stop.is_set() and self.named_t is None:
            if any(self.hosts.first_naming(a, self.fault_t) is None for a in self.sick):
                self._stop.wait(0.05)
                continue
            began = time.monotonic()
            out = subprocess.run(azprobe_argv("explain", self.zone, "--consul", self.stack.consul_url,
                                              "--prefix", self.prefix),
                                 capture_output=True, text=True, timeout=30, check=False)
            named = all(a in out.stdout for a in self.sick)
            self.runs.append((began, round(time.monotonic() - began, 3), named))
            if named:
                self.named_t = time.monotonic()
                self.lines = [line for line in out.stdout.splitlines() if "host" in line or
                              any(a in line for a in self.sick)][:12]


def even_and_clear(hosts: HostsRecorder, zones: int) -> Callable[[WeightsDoc], bool]:
    """The baseline a later phase waits for: even weights, and no host named."""
    def ready(doc: WeightsDoc) -> bool:
        even = all(abs(z.share - 100 / zones) <= EVEN_WITHIN_POINTS for z in doc.zones.values())
        latest = hosts.samples[-1][1] if hosts.samples else {}
        return even and not any(latest.values())
    return ready


def run_host_drill(stack: LoopStack, phases: Sequence[Scenario], *, door: str = "ads", rate: float = 100.0,
                   fault_s: float = 20.0, client_az: str = "az-a", safety: Mapping[str, float] | None = None,
                   progress: Progress = lambda m: None) -> HostDrillReport:
    """Every phase on one data plane; Envoy, the door, the load client and the
    controllers are gone on return, and the lab's faults cleared. safety: the
    controllers' [safety] keys (run_scenario's)."""
    prefix = f"azprobe/drill-hosts-{uuid.uuid4().hex[:8]}/"
    spec = DrillSpec(scenario=phases[0], modes=("azprobe",), fault_s=fault_s, rate=rate, door=door,
                     client_az=client_az)
    plane = DataPlane(stack, "azprobe", spec, stack.work_dir / "drill" / "hosts", prefix)
    hosts = HostsRecorder(stack.consul_url, prefix)
    runs: list[tuple[Scenario, ScenarioResult, ExplainProbe, float]] = []
    try:
        plane.start()
        hosts.start()
        progress(f"Envoy up ({door} door), {rate:g} requests/s through it")
        for scenario in phases:
            progress(f"phase {scenario.name}: {scenario.description}")
            sick = [stack.lab.server_addr(f.az, server=f.server) for f in scenario.faults if f.server is not None]
            probe = ExplainProbe(stack, prefix, scenario.faults[0].az, sick, hosts)
            started = time.monotonic()
            try:
                result = run_scenario(stack, scenario, fault_s=fault_s, prefix=prefix, tick=probe, safety=safety,
                                      baseline_ready=even_and_clear(hosts, len(stack.azs)) if runs else None)
            finally:
                probe.stop()
            plane.check_alive()
            runs.append((scenario, result, probe, started))
        ended = time.monotonic()
    finally:
        stack.clear()
        hosts.stop()
        records, admin = plane.close()
    if not records:
        raise PrerequisiteError(f"the load client recorded no requests; see {plane.work_dir}/load.log")
    report = HostDrillReport(door, rate, stack.servers_per_az)
    for i, (scenario, result, probe, started) in enumerate(runs):
        until = runs[i + 1][3] if i + 1 < len(runs) else ended
        report.phases.append(phase_figures(stack, scenario, result, probe, hosts, records, admin, started, until))
    return report


def phase_figures(stack: LoopStack, scenario: Scenario, result: ScenarioResult, probe: ExplainProbe,
                  hosts: HostsRecorder, records: Sequence[RequestRecord], admin: Sequence[AdminSample],
                  started: float, until: float) -> HostPhaseFigures:
    fault_start = next(e.t for e in result.events if e.action == "fault")
    fault_end = max(e.t for e in result.events if e.action == "clear")
    sick = probe.sick
    keys = {a: f"{a}:{HTTP_PORT}" for a in sick}

    def since_fault(t: float | None) -> float | None:
        return None if t is None else round(t - fault_start, 3)

    degraded = {a: since_fault(next((s.t for s in admin if fault_start <= s.t <= fault_end
                                     and DEGRADED_FLAG in s.host_flags.get(keys[a], "")), None)) for a in sick}
    zone_sick = scenario.sick_azs(stack.azs)
    drain = client_drain = None
    if zone_sick:
        drain = envoy_drain_s(admin, zone_sick, fault_start, fault_end)
        client_drain = mode_figures("azprobe", records, admin, zone_sick, run_start=started, fault_start=fault_start,
                                    fault_end=fault_end, run_end=until, grace_s=5.0, azs=stack.azs).detect_s
    marks = [d for d in degraded.values() if d is not None]
    after = drain if zone_sick else (max(marks) if len(marks) == len(sick) else None)
    after_start = fault_start + (after if after is not None else 5.0)
    m = result.metrics
    return HostPhaseFigures(
        scenario=scenario.name, sick_hosts=sick, fault_s=round(fault_end - fault_start, 3),
        kv_named_s={a: since_fault(hosts.first_naming(a, fault_start)) for a in sick},
        explain_named_s=since_fault(probe.named_t), envoy_degraded_s=degraded,
        envoy_shares_fault=zone_shares(admin, fault_start, fault_end),
        sick_hosts_share_after=host_share(admin, list(keys.values()), after_start, fault_end),
        baseline=window_figures(records, admin, zone_sick, started + 1.0, fault_start, fault_start),
        after_detection=window_figures(records, admin, zone_sick, after_start, fault_end, fault_start),
        kv_shares_before=dict(m.shares_before), kv_min_share_during=dict(m.min_share_during),
        kv_detect_s=m.detect_s, drain_detect_s=drain, explain_excerpt=probe.lines, explain_runs=[(since_fault(t), took, named) for t, took, named in probe.runs],
        client_drain_detect_s=client_drain,
        fault_apply_s=next(e.apply_s for e in result.events if e.action == "fault"))


def _deltas(admin: Sequence[AdminSample], start: float, end: float,
            counts: Callable[[AdminSample], dict[str, int]]) -> dict[str, int]:
    inside = [s for s in admin if start <= s.t <= end]
    if len(inside) < 2:
        return {}
    first, last = counts(inside[0]), counts(inside[-1])
    return {k: v - first.get(k, 0) for k, v in last.items()}


def zone_shares(admin: Sequence[AdminSample], start: float, end: float) -> dict[str, float]:
    """Zone -> its % of Envoy's upstream requests in [start, end] (by Envoy's counters)."""
    delta = _deltas(admin, start, end, lambda s: s.rq_total)
    total = sum(delta.values())
    return {az: round(100.0 * n / total, 2) for az, n in sorted(delta.items())} if total > 0 else {}


def host_share(admin: Sequence[AdminSample], hosts: Sequence[str], start: float, end: float) -> float | None:
    """The fraction of Envoy's upstream requests in [start, end] that went to `hosts`."""
    delta = _deltas(admin, start, end, lambda s: s.host_rq)
    total = sum(delta.values())
    return round(sum(delta.get(h, 0) for h in hosts) / total, 5) if total > 0 else None


def envoy_drain_s(admin: Sequence[AdminSample], zones: Sequence[str], start: float, end: float) -> float | None:
    """Seconds from `start` to the first admin sample from which the zones' share of
    Envoy's upstream requests stays at or below DETECT_SHARE between every pair of
    samples until `end` (the drill's detection, by Envoy's own counters: they hold when
    the load client's requests time out on an overloaded machine)."""
    inside = [s for s in admin if start <= s.t <= end]
    first = None
    for a, b in zip(inside, inside[1:]):
        total = sum(b.rq_total.values()) - sum(a.rq_total.values())
        mine = sum(b.rq_total.get(z, 0) - a.rq_total.get(z, 0) for z in zones)
        if total <= 0:
            continue
        if mine <= DETECT_SHARE * total:
            first = a.t if first is None else first
        else:
            first = None
    return None if first is None or end - first < MIN_HOLD_S else round(first - start, 3)
