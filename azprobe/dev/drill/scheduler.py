"""`azprobe lab drill --consumer scheduler`: pods placed through the scheduler extender
during the documents' fault, on the real loop (lab + agents + controllers + Consul).

The placer stands in for kube-scheduler's own scoring. It is a simple spread placer: for
each pod it calls the extender's `filter` with the 3 AZs × K nodes (full Node objects, as
kube-scheduler sends them without nodeCacheCapable), then `prioritize` with the nodes
kept, and places the pod on the kept node with the highest

    total = SPREAD_WEIGHT × spread + extender score × EXTENDER_WEIGHT × (100 / 10)

where spread = 100 × (1 − running pods in the node's zone / running pods in the fullest
zone), each pod running POD_LIFETIME_S after its placement (a workload with turnover, so
the spread follows the recent placements, not the whole history), the
extender's term is what kube-scheduler adds for an extender of that `weight` (its 0..10
scaled to MaxNodeScore 100), ties go to the node with fewer pods, then by name. A
placement fails when the filter answers an `Error`, keeps no node, or the extender does
not answer 200 (kube-scheduler with `ignorable: false`; `ignorable: true` would place the
pod without the extender, counted apart as `ignored`).

Phases: before the fault, the fault before the controller's drain shows in KV, the fault
after it, after the clear, then the documents' incident replayed: the weights key deleted,
then Consul stopped, then a stale document served (dated now, already expired, with the
sick AZ drained: acting on it would drain that AZ), each once the weights are even again
(the steady state the documents' incident struck). Placements must stay spread and none
may fail.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from azprobe.clients.consul import ConsulSettings, make_client
from azprobe.contracts.weights import WeightsDoc, ZoneWeights, parse_weights
from azprobe.daemon.address_file import wait_for_address_file
from azprobe.dev.demo.processes import ManagedProcess, azprobe_argv
from azprobe.dev.demo.runner import LoopStack, run_scenario
from azprobe.dev.demo.scenarios import Scenario
from azprobe.dev.kube import extender_body, node_object, pod_object
from azprobe.errors import PrerequisiteError

SPREAD_WEIGHT = 2  # kube-scheduler's default weight of PodTopologySpread
EXTENDER_WEIGHT = 5  # the `weight` of docs/scheduler.md's configuration
NODE_SCORE_PER_EXTENDER_POINT = 100 // 10  # MaxNodeScore / MaxExtenderPriority
POD_LIFETIME_S = 5.0
EVEN_POINTS = 5  # "recovered": every zone's share within this many points of the others
RECOVERED_TIMEOUT_S = 60.0
PHASES = ("before", "fault, before detection", "fault, after detection", "after clear",
          "incident: key deleted", "incident: Consul stopped", "incident: stale document")
PLACER_NOTE = (f"placer: a spread placer standing in for kube-scheduler's scoring: spread score (pods "
               f"running {POD_LIFETIME_S:g} s) x {SPREAD_WEIGHT} + extender score x weight {EXTENDER_WEIGHT} x "
               f"{NODE_SCORE_PER_EXTENDER_POINT}, as kube-scheduler adds an extender's priority")
Progress = Callable[[str], None]


@dataclass
class Placement:
    t: float  # monotonic
    az: str | None  # None: failed
    failed: bool
    ignored: bool  # the extender did not answer 200; an ignorable extender is skipped
    removed: int = 0  # nodes the filter took out
    score_range: int = 0  # highest minus lowest extender score among the kept nodes


@dataclass
class PhaseFigures:
    phase: str
    pods: int
    sick_share_pct: float | None
    failed: int
    ignored: int
    shares_pct: dict[str, float] = field(default_factory=dict)
    filtered_nodes: int = 0  # nodes the filter removed, summed over the phase's placements
    max_score_range: int = 0  # the widest spread of extender scores one placement saw


@dataclass
class SchedulerDrillReport:
    scenario: str
    sick_azs: list[str]
    rate_pods_s: float
    nodes_per_az: int
    detect_s: float | None
    phases: list[PhaseFigures]
    extender_states: dict[str, list[str]]
    placer: str = PLACER_NOTE

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def failed_total(self) -> int:
        return sum(p.failed for p in self.phases)


class Placer:
    """Places `rate` pods a second through the extender until stopped (module doc)."""

    def __init__(self, host: str, port: int, azs: list[str], nodes_per_az: int, rate: float) -> None:
        self.host, self.port, self.rate = host, port, rate
        self.nodes = [node_object(f"{az}-node-{i}", az) for az in azs for i in range(nodes_per_az)]
        self.zone_of = {n["metadata"]["name"]: n["metadata"]["labels"]["topology.kubernetes.io/zone"]
                        for n in self.nodes}
        self.pods_on_node = {name: 0 for name in self.zone_of}
        self.pods_in_zone = {az: 0 for az in azs}
        self.placements: list[Placement] = []
        self._running: deque[tuple[float, str]] = deque()  # (ends at, node), oldest first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="placer", daemon=True)
        self._conn: http.client.HTTPConnection | None = None

    def start(self) -> "Placer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _post(self, verb: str, body: bytes) -> Any:
        for attempt in (1, 2):  # one reconnect: a kept-alive connection may have been closed
            try:
                if self._conn is None:
                    self._conn = http.client.HTTPConnection(self.host, self.port, timeout=2.0)
                self._conn.request("POST", f"/{verb}", body=body, headers={"Content-Type": "application/json"})
                response = self._conn.getresponse()
                data = response.read()
                if response.status != 200:
                    return None
                return json.loads(data)
            except (OSError, http.client.HTTPException, ValueError):
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                if attempt == 2:
                    return None
        return None

    def place_one(self, i: int) -> Placement:
        pod = pod_object(f"web-7c9d8f6b5-{i:05d}")
        now = time.monotonic()
        result = self._post("filter", extender_body(pod, self.nodes))
        if result is None:
            return Placement(now, None, False, True)
        if result.get("Error") or not result.get("Nodes") or not result["Nodes"].get("items"):
            return Placement(now, None, True, False)
        kept = result["Nodes"]["items"]
        scores = self._post("prioritize", extender_body(pod, kept))
        if scores is None:
            return Placement(now, None, False, True)
        extender = {s["Host"]: int(s["Score"]) for s in scores}
        removed = len(self.nodes) - len(kept)
        score_range = max(extender.values()) - min(extender.values()) if extender else 0
        while self._running and self._running[0][0] <= now:
            _, ended = self._running.popleft()
            self.pods_on_node[ended] -= 1
            self.pods_in_zone[self.zone_of[ended]] -= 1
        fullest = max(self.pods_in_zone.values()) or 1

        def total(name: str) -> tuple[float, int, str]:
            zone = self.zone_of[name]
            spread = 100.0 * (1 - self.pods_in_zone[zone] / fullest)
            score = SPREAD_WEIGHT * spread + extender.get(name, 0) * EXTENDER_WEIGHT * NODE_SCORE_PER_EXTENDER_POINT
            return (score, -self.pods_on_node[name], name)

        best = max((n["metadata"]["name"] for n in kept), key=total)
        self.pods_on_node[best] += 1
        self.pods_in_zone[self.zone_of[best]] += 1
        self._running.append((now + POD_LIFETIME_S, best))
        return Placement(now, self.zone_of[best], False, False, removed, score_range)

    def _run(self) -> None:
        i = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.placements.append(self.place_one(i))
            i += 1
            next_at += 1.0 / self.rate
            self._stop.wait(max(0.0, next_at - time.monotonic()))


def _health(host: str, port: int) -> str:
    try:
        conn = http.client.HTTPConnection(host, port, timeout=2.0)
        conn.request("GET", "/healthz")
        state = json.loads(conn.getresponse().read())["weights"]
        conn.close()
        return str(state)
    except (OSError, http.client.HTTPException, ValueError, KeyError):
        return "unanswered"


def phase_figures(phase: str, placements: list[Placement], sick: list[str], azs: list[str]) -> PhaseFigures:
    placed = [p for p in placements if p.az is not None]
    shares = {az: round(100.0 * sum(1 for p in placed if p.az == az) / len(placed), 1) if placed else 0.0
              for az in azs}
    sick_share = round(sum(shares[az] for az in sick), 1) if placed else None
    return PhaseFigures(phase, len(placements), sick_share, sum(p.failed for p in placements),
                        sum(p.ignored for p in placements), shares, sum(p.removed for p in placements),
                        max((p.score_range for p in placements), default=0))


def stale_drained_doc(azs: list[str], sick: list[str]) -> WeightsDoc:
    """A document dated now and already expired, draining the sick AZs."""
    now = time.time()
    healthy = [az for az in azs if az not in sick]
    zones = {az: ZoneWeights(0.14, 1, 0.1, 0.6, 900.0, 0.3, 500, "degraded", ("drill: stale",)) for az in sick}
    rest = 100 - len(sick)
    for i, az in enumerate(healthy):
        share = rest // len(healthy) + (1 if i < rest % len(healthy) else 0)
        zones[az] = ZoneWeights(1.0, share, 0.98, 0.999, 2.0, 0.3, 500, "ok", ("drill: stale",))
    return WeightsDoc(10**9, now - 0.5, now - 0.2, "drill-stale", "default", "degraded", zones)


def _even(client: Any, key: str) -> bool:
    """The weights document at `key` gives every zone a share within EVEN_POINTS."""
    try:
        _, entry = client.kv.get(key)
        doc = parse_weights(entry["Value"]) if entry else None
    except Exception:  # unreadable now: not even yet
        return False
    shares = [z.share for z in doc.zones.values()] if doc else []
    return bool(shares) and max(shares) - min(shares) <= EVEN_POINTS


def _hold(seconds: float, check: Callable[[], None], sample: Callable[[], None]) -> None:
    """Pacing for a phase (not synchronisation), sampling the extender's state."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        check()
        sample()
        time.sleep(min(0.25, max(0.0, end - time.monotonic())))


def run_scheduler_drill(stack: LoopStack, scenario: Scenario, *, fault_s: float = 20.0, rate: float = 20.0,
                        nodes_per_az: int = 4, incident_s: float = 5.0, safety: Mapping[str, float] | None = None,
                        progress: Progress = lambda m: None) -> SchedulerDrillReport:
    """The drill (module doc); safety: the controllers' [safety] keys (run_scenario's)."""
    import uuid

    prefix = f"azprobe/sched-{uuid.uuid4().hex[:8]}/"
    work = stack.work_dir / "drill" / "scheduler"
    work.mkdir(parents=True, exist_ok=True)
    sick = scenario.sick_azs(stack.azs)
    config = work / "extender.toml"
    config.write_text(f'[extender]\nlisten = "127.0.0.1:0"\n[consul]\naddress = "{stack.consul_url}"\n'
                      f'prefix = "{prefix}"\n')
    address_file = work / "extender.address"
    address_file.unlink(missing_ok=True)
    states: dict[str, list[str]] = {phase: [] for phase in PHASES}
    with ExitStack() as exit_stack:
        extender = ManagedProcess("scheduler-extender", azprobe_argv("scheduler-extender", "--config", str(config),
                                                                     "--address-file", str(address_file)),
                                  work / "extender.log")
        exit_stack.callback(extender.stop)
        extender.start()
        address = wait_for_address_file(address_file, alive=extender.alive, timeout_s=30)
        if address is None:
            extender.check_alive()
            raise PrerequisiteError(f"the scheduler extender did not start; see {work / 'extender.log'}")
        host, port = address
        placer = Placer(host, port, stack.azs, nodes_per_az, rate).start()
        exit_stack.callback(placer.stop)
        phase_marks: list[tuple[str, float]] = []

        def mark(phase: str) -> None:
            phase_marks.append((phase, time.monotonic()))
            progress(f"scheduler drill: {phase}")

        def sample(phase: str) -> Callable[[], None]:
            def take() -> None:
                state = _health(host, port)
                if not states[phase] or states[phase][-1] != state:
                    states[phase].append(state)
            return take

        progress(f"scheduler drill: {rate:g} pods/s through the extender, {scenario.description}")
        result = run_scenario(stack, scenario, fault_s=fault_s, prefix=prefix, safety=safety)
        fault_start = next(e.t for e in result.events if e.action == "fault")
        fault_end = max(e.t for e in result.events if e.action == "clear")
        detect_s = result.metrics.detect_s
        detected_at = fault_start + detect_s if detect_s is not None else fault_end
        client = make_client(ConsulSettings(address=stack.consul_url))
        # The incident strikes a steady state, as in the documents: the weights back to even.
        deadline = time.monotonic() + RECOVERED_TIMEOUT_S
        while not _even(client, prefix + "weights") and time.monotonic() < deadline:
            _hold(0.5, extender.check_alive, sample("after clear"))
        _hold(POD_LIFETIME_S, extender.check_alive, sample("after clear"))  # running pods placed under even weights
        loop_end = time.monotonic()

        mark("incident: key deleted")
        client.kv.delete(prefix + "weights")
        _hold(incident_s, extender.check_alive, sample("incident: key deleted"))
        mark("incident: Consul stopped")
        stack.devconsul.kill()
        _hold(incident_s, extender.check_alive, sample("incident: Consul stopped"))
        stack.devconsul.start()
        client = make_client(ConsulSettings(address=stack.consul_url))
        mark("incident: stale document")
        client.kv.put(prefix + "weights", stale_drained_doc(stack.azs, sick).dumps())
        _hold(incident_s, extender.check_alive, sample("incident: stale document"))
        end = time.monotonic()
        placer.stop()
        placements = list(placer.placements)

    incident = [(name, t) for name, t in phase_marks if name.startswith("incident")]
    windows = [("before", float("-inf"), fault_start), ("fault, before detection", fault_start, detected_at),
               ("fault, after detection", detected_at, fault_end), ("after clear", fault_end, loop_end)]
    for i, (name, t) in enumerate(incident):
        windows.append((name, t, incident[i + 1][1] if i + 1 < len(incident) else end))
    phases = [phase_figures(name, [p for p in placements if lo <= p.t < hi], sick, stack.azs)
              for name, lo, hi in windows]
    return SchedulerDrillReport(scenario.name, sick, rate, nodes_per_az, detect_s, phases,
                                {k: v for k, v in states.items() if v})


def render(report: SchedulerDrillReport) -> str:
    header = ("phase", "pods", "sick AZ share", "failed", "ignored", "filtered", "score range", "shares")
    rows = [header] + [(p.phase, str(p.pods), "-" if p.sick_share_pct is None else f"{p.sick_share_pct:.1f}%",
                        str(p.failed), str(p.ignored), str(p.filtered_nodes), str(p.max_score_range),
                        " ".join(f"{az}={share:.0f}%" for az, share in p.shares_pct.items()))
                       for p in report.phases]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i in (0, 7) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in rows]
    detect = "never" if report.detect_s is None else f"{report.detect_s:.1f} s"
    notes = [f"scheduler drill {report.scenario}: {report.rate_pods_s:g} pods/s over {len(report.phases[0].shares_pct)}"
             f" AZs x {report.nodes_per_az} nodes through the extender's HTTP protocol; sick: "
             f"{', '.join(report.sick_azs) or '-'}; the drain showed in KV {detect} after the fault started",
             report.placer,
             "extender weights state per phase: " + "; ".join(f"{k}: {'>'.join(v)}"
                                                               for k, v in report.extender_states.items())]
    return "\n".join(lines + [""] + notes)
