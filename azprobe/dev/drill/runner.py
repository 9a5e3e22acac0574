"""`azprobe lab drill`: one fault scenario, run once per mode on real user traffic.

Per mode, on the demo's running stack (lab + devconsul + agent, azprobe.dev.demo.runner):
a fresh Envoy in the client AZ's namespace, the lab's HTTP load client in front of it,
and the scenario's fault timeline. The modes differ only in who decides Envoy's weights:

- static:         equal locality weights written once; nothing updates them.
- envoy-outlier:  the same, plus Envoy's own outlier detection (azprobe.dev.lab.envoy).
- azprobe:        the real loop: agent -> controller -> Consul KV -> `azprobe envoy-eds
                  --watch` -> the EDS file Envoy watches (the demo's `run_scenario` drives
                  the controller and the fault timeline).

The door (`DrillSpec.door`) is how the weights reach Envoy: `file` (envoy-eds and a
file, above) or `ads` (`azprobe xds serve` and Envoy's ADS over a unix socket; the static
modes get it with a KV prefix that holds no document, so equal weights).

Everything started is stopped in `finally` blocks; the lab's fault is always cleared.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from azprobe.consumers.envoy import atomic_write, parse_endpoints, render_bytes
from azprobe.dev.demo.metrics import FaultEvent
from azprobe.dev.demo.processes import ManagedProcess, azprobe_argv
from azprobe.dev.demo.runner import LoopStack, run_scenario
from azprobe.dev.demo.scenarios import Scenario
from azprobe.dev.drill.metrics import ModeFigures, mode_figures, parse_admin, parse_records
from azprobe.dev.drill.xdsdoor import XdsDoor
from azprobe.dev.lab import netns
from azprobe.dev.lab.envoy import ADMIN_PORT, CLUSTER, LISTEN_PORT, EnvoyProxy
from azprobe.dev.lab.processes import spawn_in_ns, wait_ready
from azprobe.dev.lab.topology import HTTP_PORT
from azprobe.errors import ConfigError, PrerequisiteError

MODES = ("static", "envoy-outlier", "azprobe")
DOORS = ("file", "ads")
HTTP_MODULE = "azprobe.dev.lab.http"
Progress = Callable[[str], None]


@dataclass(frozen=True)
class DrillSpec:
    """What one drill runs. Times in seconds; rate in requests per second."""

    scenario: Scenario
    modes: tuple[str, ...] = MODES
    fault_s: float = 20.0
    baseline_s: float = 6.0  # static modes; the azprobe mode waits for healthy KV weights instead
    recovery_s: float = 8.0  # after the clear (the azprobe mode: after KV shows recovery)
    rate: float = 100.0
    grace_s: float = 5.0  # "after detection" starts here in a mode that never detects
    client_az: str = "az-a"
    door: str = "file"
    # the azprobe mode's controllers' [safety] keys (run_scenario's `safety`); None: the
    # controller's defaults, as installed
    safety: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        if self.door not in DOORS:
            raise ConfigError("--door", f"unknown door {self.door!r}", f"choose from {','.join(DOORS)}")
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise ConfigError("--modes", f"unknown mode(s) {', '.join(unknown) or '(none)'}",
                              f"choose from {','.join(MODES)}")
        if not 1.0 <= self.rate <= 2000:
            raise ConfigError("--rate", f"{self.rate:g} is outside 1..2000 requests/s")
        if not 2.0 <= self.fault_s <= 600:
            raise ConfigError("--fault-s", f"{self.fault_s:g} is outside 2..600 s")
        if not 1.0 <= self.baseline_s <= 600 or not 1.0 <= self.recovery_s <= 600:
            raise ConfigError("--baseline-s/--recovery-s", "must be within 1..600 s")


@dataclass
class DrillReport:
    spec: DrillSpec
    figures: list[ModeFigures] = field(default_factory=list)
    work_dir: str = ""

    def to_json(self, with_timeline: bool = False) -> dict[str, Any]:
        return {"scenario": self.spec.scenario.name, "rate_rps": self.spec.rate, "fault_s": self.spec.fault_s,
                "client_az": self.spec.client_az, "door": self.spec.door,
                "modes": {f.mode: f.to_json(with_timeline) for f in self.figures}}


class DataPlane:
    """Envoy + its EDS source + the load client for one mode; `close()` stops them and
    returns the client's records and Envoy's counter samples."""

    def __init__(self, stack: LoopStack, mode: str, spec: DrillSpec, work_dir: Path, prefix: str | None) -> None:
        self.stack, self.mode, self.spec, self.work_dir, self.prefix = stack, mode, spec, work_dir, prefix
        self.records_path = work_dir / "requests.csv"
        self.admin_path = work_dir / "envoy-admin.jsonl"
        self._exit = ExitStack()
        self.envoy: EnvoyProxy | None = None
        self.eds_watch: ManagedProcess | None = None
        self.xds: XdsDoor | None = None

    def start(self) -> "DataPlane":
        lab = self.stack.lab
        self.work_dir.mkdir(parents=True, exist_ok=True)
        for stale in (self.records_path, self.admin_path, self.work_dir / "eds.json"):
            stale.unlink(missing_ok=True)  # a previous run of this mode in the same work dir
        endpoints = {az: [f"{addr}:{HTTP_PORT}" for addr in lab.server_addrs(az)] for az in lab.azs}
        endpoints_path = self.work_dir / "endpoints.json"
        endpoints_path.write_text(json.dumps(endpoints))
        eds: Path | None = self.work_dir / "eds.json"
        try:
            if self.spec.door == "ads":
                # a static mode reads a prefix nobody writes: equal weights
                prefix = self.prefix or f"azprobe/drill-static-{uuid.uuid4().hex[:8]}/"
                self.xds = XdsDoor(self.work_dir, self.stack.consul_url, prefix, endpoints, list(lab.azs))
                self._exit.callback(self.xds.stop)
                self.xds.start()
                eds = None
            elif self.prefix is None:  # static weights: equal, written once
                atomic_write(eds, render_bytes(CLUSTER, parse_endpoints(endpoints, "endpoints"), None))
            else:
                self.eds_watch = ManagedProcess(
                    "envoy-eds", azprobe_argv("envoy-eds", "--cluster", CLUSTER, "--endpoints", str(endpoints_path),
                                              "--out", str(eds), "--watch", "--consul", self.stack.consul_url,
                                              "--prefix", self.prefix),
                    self.work_dir / "envoy-eds.log")
                self._exit.callback(self.eds_watch.stop)
                self.eds_watch.start()
                _wait(lambda: eds.exists(), 15.0, "envoy-eds wrote no EDS file", self.eds_watch.check_alive)
            self.envoy = EnvoyProxy(lab.client_ns(self.spec.client_az), self.work_dir, eds,
                                    outlier_detection=self.mode == "envoy-outlier",
                                    ads_socket=self.xds.socket if self.xds else None, zone=self.spec.client_az)
            self._exit.callback(self.envoy.stop)
            self.envoy.start()
            argv = netns.python_argv(HTTP_MODULE, "load", "--url", f"127.0.0.1:{LISTEN_PORT}",
                                     "--rate", str(self.spec.rate), "--out", str(self.records_path),
                                     "--admin", f"127.0.0.1:{ADMIN_PORT}", "--admin-out", str(self.admin_path))
            log = self.work_dir / "load.log"
            load = spawn_in_ns(lab.client_ns(self.spec.client_az), argv, log)
            self._exit.callback(lambda: netns.kill_pids([load.pid]))
            wait_ready([load], [log], timeout=30.0)  # the client waits for Envoy LIVE + healthy hosts
        except BaseException:
            self._exit.close()
            raise
        return self

    def check_alive(self) -> None:
        if self.envoy is not None:
            self.envoy.check_alive()
        if self.eds_watch is not None:
            self.eds_watch.check_alive()
        if self.xds is not None:
            self.xds.check_alive()

    def close(self) -> tuple[list[Any], list[Any]]:
        self._exit.close()
        records = parse_records(self.records_path.read_text()) if self.records_path.exists() else []
        admin = parse_admin(self.admin_path.read_text()) if self.admin_path.exists() else []
        return records, admin


def _wait(predicate: Callable[[], bool], timeout_s: float, problem: str, check: Callable[[], None]) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        check()
        if time.monotonic() > deadline:
            raise PrerequisiteError(problem)
        time.sleep(0.05)


def _hold(seconds: float, check: Callable[[], None]) -> None:
    """Let the drill run for `seconds` (pacing, not synchronisation), checking the children."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        check()
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))


def _run_timeline(stack: LoopStack, scenario: Scenario, fault_s: float, check: Callable[[], None]) -> list[FaultEvent]:
    """The scenario's faults at their offsets, without a controller (static modes)."""
    events: list[FaultEvent] = []
    t0 = time.monotonic()
    for step in scenario.timeline(fault_s):
        _hold(max(0.0, t0 + step.at_s - time.monotonic()), check)
        if step.action == "fault":
            stack.apply(step.faults)
        elif step.action == "clear":
            stack.clear()
        else:
            continue  # kill-leader: there is no controller in a static mode
        events.append(FaultEvent(time.monotonic(), step.action))
    return events


def run_mode(stack: LoopStack, mode: str, spec: DrillSpec, progress: Progress = lambda m: None) -> ModeFigures:
    """One mode, start to finish; Envoy, the EDS watcher and the load client are gone on return."""
    work = stack.work_dir / "drill" / mode
    prefix = f"azprobe/drill-{uuid.uuid4().hex[:8]}/" if mode == "azprobe" else None
    sick = spec.scenario.sick_azs(stack.azs)
    plane = DataPlane(stack, mode, spec, work, prefix)
    kv = None
    try:
        plane.start()
        run_start = time.monotonic()
        progress(f"{mode}: Envoy up, {spec.rate:g} requests/s through it")
        if mode == "azprobe":
            result = run_scenario(stack, spec.scenario, fault_s=spec.fault_s, prefix=prefix, safety=spec.safety)
            events = result.events
            kv = result.metrics
            plane.check_alive()
            _hold(spec.recovery_s, plane.check_alive)  # the data plane shows the recovery after KV does
        else:
            _hold(spec.baseline_s, plane.check_alive)
            events = _run_timeline(stack, spec.scenario, spec.fault_s, plane.check_alive)
            _hold(spec.recovery_s, plane.check_alive)
        run_end = time.monotonic()
    finally:
        stack.clear()
        records, admin = plane.close()
    fault_start = next(e.t for e in events if e.action == "fault")
    fault_end = max(e.t for e in events if e.action == "clear")
    if not records:
        raise PrerequisiteError(f"the load client recorded no requests; see {work}/load.log")
    figures = mode_figures(mode, records, admin, sick, run_start=run_start, fault_start=fault_start,
                           fault_end=fault_end, run_end=run_end, grace_s=spec.grace_s, azs=stack.azs)
    if kv is not None:
        figures.kv_detect_s, figures.kv_recover_s = kv.detect_s, kv.recover_s
    return figures


def run_drill_modes(stack: LoopStack, spec: DrillSpec, progress: Progress = lambda m: None) -> DrillReport:
    report = DrillReport(spec, work_dir=str(stack.work_dir))
    for mode in spec.modes:
        progress(f"mode {mode}: {spec.scenario.description}")
        report.figures.append(run_mode(stack, mode, spec, progress))
    return report
