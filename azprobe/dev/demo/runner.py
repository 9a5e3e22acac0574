"""Orchestration of the closed loop: lab, devconsul, agent, controllers, a fault scenario.

Two layers, so tests can share the expensive part:
- `LoopStack` (context manager): lab up with traffic and several client nodes per AZ,
  devconsul, one agent per client node on that node's config (`[node] addresses`: each
  counts only its own node's sockets, though the tracepoints are global), all on loopback
  port 0 (each reports the port it bound), so the controller sees real vantage points and
  its per-node quorum has nodes to count.
- `run_scenario(stack, scenario)`: fresh controllers on a fresh KV prefix, a blocking watch
  recording every generation, the scenario's fault timeline, recovery, figures.
Everything started is stopped in `finally` blocks, also on Ctrl-C and errors; children
are stopped by pid, the lab by its own `down`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import tomllib
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from azprobe.daemon.address_file import format_host_port, wait_for_address_file
from azprobe.dev.demo import DEMO_LAB_NAME
from azprobe.dev.demo.configs import ControllerPlan, agent_config_for_demo, controller_config
from azprobe.dev.demo.metrics import ScenarioMetrics, FaultEvent, KvSample, compute_metrics
from azprobe.dev.demo.processes import ManagedProcess, azprobe_argv
from azprobe.dev.demo.recorder import KvRecorder, LeaderRecorder
from azprobe.dev.demo.scenarios import ALL_AZS, FaultSpec, Scenario, Step
from azprobe.dev.demo.view import ViewState, zone_rows
from azprobe.dev.lab.topology import DEFAULT_NODES_PER_AZ
from azprobe.agent.config import DEFAULT_INTERVAL_S
from azprobe.commands.top import summarise
from azprobe.controller.config import DEFAULT_EVALUATION_WINDOW_S
from azprobe.errors import PrerequisiteError
from azprobe.clients.agent import WindowReader
from azprobe.contracts.weights import WeightsDoc
from azprobe.contracts.window import Window

log = logging.getLogger(__name__)

LAB_NAME = DEMO_LAB_NAME
LOCK_DELAY_S = 2.0  # short, so a failover scenario takes seconds (Consul's default is 15 s)
SESSION_TTL_S = 10.0  # Consul's minimum
# The demo runs the shipped timings (agent windows, evaluation window, safety dwells), so a
# scenario shows what an install does; only Consul's lock delay and TTL are shortened.
VIEW_WINDOWS = 3  # the live view merges the agent's last 3 windows (~3 s)
SHARES_HELD_POINTS = 5  # a scenario that should move nothing: no share falls more than this

Tick = Callable[[ViewState], None]


@dataclass
class ScenarioResult:
    scenario: str
    sick_azs: list[str]
    fault_s: float
    metrics: ScenarioMetrics
    samples: list[KvSample]
    events: list[FaultEvent]
    work_dir: str = ""
    leader_events: list[tuple[float, str | None]] = field(default_factory=list)

    expect_drain: bool = True
    expect_panic: bool = False

    def checks(self) -> dict[str, bool]:
        """What the scenario promises, checked against the figures."""
        m = self.metrics
        if self.sick_azs:
            out = {"recovered": m.recover_s is not None}
        else:  # nothing was meant to move (an uplink fault): back to ok, every share held
            out = {"recovered": bool(self.samples) and self.samples[-1].state == "ok",
                   "shares_held": bool(m.shares_before) and all(
                       m.min_share_during.get(az, 0) >= share - SHARES_HELD_POINTS
                       for az, share in m.shares_before.items())}
        if self.expect_drain:
            out["drained"] = m.detect_s is not None
        if self.expect_panic:
            out["panic_seen"] = "panic" in m.states_seen
        return out

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, **self.metrics.to_json(), "fault_s": self.fault_s,
                "sick_azs": self.sick_azs,
                "fault_apply_s": max((e.apply_s for e in self.events if e.action == "fault"), default=None),
                "checks": self.checks()}


class AgentPoller:
    """Pulls one agent's new windows for the live view (the controllers pull their own)."""

    def __init__(self, url: str) -> None:
        self.reader = WindowReader(url, timeout_s=0.5)
        self.recent: deque[Window] = deque(maxlen=VIEW_WINDOWS)

    def fetch(self) -> list[Window]:
        pulled = self.reader.pull()
        for exc in pulled.errors:
            log.warning("agent sent a bad window: %s", exc)
        self.recent.extend(pulled.windows)
        return pulled.windows

    def poll(self) -> None:
        try:
            self.fetch()
        except (OSError, ValueError) as exc:
            log.debug("agent poll: %s", exc)


class FleetPoller:
    """Every node agent's recent windows together: the lab as all its nodes see it."""

    def __init__(self, urls: list[str]) -> None:
        self.pollers = [AgentPoller(url) for url in urls]

    @property
    def recent(self) -> list[Window]:
        return [w for p in self.pollers for w in p.recent]

    def poll(self) -> None:
        for poller in self.pollers:
            poller.poll()


class LoopStack:
    """Lab (with traffic), devconsul and one agent per client node, up until close()."""

    def __init__(self, *, work_dir: Path | None = None, azs: int = 3, lab_name: str = LAB_NAME,
                 keep: bool = False, nodes_per_az: int = DEFAULT_NODES_PER_AZ, servers_per_az: int = 1,
                 agent_interval_s: float = DEFAULT_INTERVAL_S, traffic: Any = True) -> None:
        self.keep = keep
        self.traffic = traffic  # the lab's background traffic: True (its default) or a TrafficSpec
        self.agent_interval_s = agent_interval_s
        self.servers_per_az = servers_per_az
        self._own_work_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="azprobe-demo-"))
        self.azs_requested = azs
        self.nodes_per_az = nodes_per_az
        self.lab_name = lab_name
        self.lab: Any = None
        self.azs: list[str] = []
        self.devconsul: Any = None
        self.agents: dict[str, ManagedProcess] = {}  # node name -> its agent
        self.agent_urls: dict[str, str] = {}  # node name -> its agent's base URL
        self._exit = ExitStack()
        self._owner_pid = os.getpid()

    # --- lifecycle ----------------------------------------------------------------
    def __enter__(self) -> "LoopStack":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, progress: Callable[[str], None] = lambda msg: None) -> None:
        from azprobe.dev.lab.netns import require_root

        require_root()  # the lab's namespaces and the agent's BPF both need it
        progress("lab up (namespaces, router, servers, traffic)")
        self._lab_up()
        progress("devconsul")
        self._devconsul_up()
        progress(f"{self.nodes_per_az * len(self.azs)} agents, one per client node (loading the BPF probe)")
        self._agents_up()

    def close(self) -> None:
        """Stop everything we started, in reverse order; never raises."""
        if os.getpid() != self._owner_pid:
            return  # a forked child unwinding (e.g. on Ctrl-C): the parent cleans up
        try:
            self._exit.close()
        except Exception as exc:  # cleanup must go on whatever failed first
            log.warning("demo cleanup: %s", exc)
        stop_strays(self.work_dir)
        if self._own_work_dir and not self.keep:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    # --- pieces -------------------------------------------------------------------
    def _lab_up(self) -> None:
        from azprobe.dev.lab.lab import Lab, LabSpec  # the lab helper's API

        state_dir = self.work_dir / "lab"
        # Lab.up removes what it built when it fails part-way, so only a lab that came
        # up needs our teardown.
        self.lab = Lab.up(LabSpec(name=self.lab_name, azs=self.azs_requested, nodes_per_az=self.nodes_per_az,
                                  servers_per_az=self.servers_per_az, state_dir=state_dir, traffic=self.traffic))
        if not self.keep:
            self._exit.callback(self.lab.down)
        self.azs = list(self.lab.azs)

    def _devconsul_up(self) -> None:
        from azprobe.dev.devconsul.testing import DevConsul

        # a deadline, not a pause: on a machine loaded by other labs devconsul's start takes
        # longer than its 15 s default
        self.devconsul = self._exit.enter_context(DevConsul(data_dir=str(self.work_dir / "consul"),
                                                            start_timeout=60.0))

    @property
    def consul_url(self) -> str:
        return self.devconsul.url

    def _agents_up(self) -> None:
        """One agent per client node, all started at once (each compiles the BPF program),
        on the node's own config from the lab, on port 0, with the demo's interval."""
        configs = self.work_dir / "agents"
        configs.mkdir(parents=True, exist_ok=True)
        address_files: dict[str, Path] = {}
        for node in self.lab.nodes:
            node_config = tomllib.loads(Path(self.lab.node_agent_config_path(node)).read_text())
            config = configs / f"{node.name}.toml"
            config.write_text(agent_config_for_demo(node_config, "127.0.0.1:0", interval_s=self.agent_interval_s))
            address_files[node.name] = configs / f"{node.name}.address"
            address_files[node.name].unlink(missing_ok=True)
            agent = ManagedProcess(f"agent {node.name}",
                                   azprobe_argv("agent", "--config", str(config),
                                                "--address-file", str(address_files[node.name])),
                                   configs / f"{node.name}.log")
            self._exit.callback(agent.stop)  # before start(): an interrupt right after it is covered
            self.agents[node.name] = agent
            agent.start()
        deadline = time.monotonic() + 60 + 5 * len(self.agents)
        for name, agent in self.agents.items():
            address = wait_for_address_file(address_files[name], alive=agent.alive,
                                            timeout_s=max(1.0, deadline - time.monotonic()))
            if address is None:
                agent.check_alive()
                raise PrerequisiteError(f"agent of {name} reported no listen address in time; see {agent.log_path}")
            self.agent_urls[name] = f"http://{format_host_port(*address)}"
        # Ready = every probe is loaded and a window of every node already shows lab traffic.
        for name, agent in self.agents.items():
            poller = AgentPoller(self.agent_urls[name])
            while not any(p.dst in self.azs and p.conn_attempts for w in poller.recent for p in w.paths):
                agent.check_alive()
                if time.monotonic() > deadline:
                    raise PrerequisiteError(f"agent of {name} showed no lab traffic in time; see {agent.log_path}")
                poller.poll()
                time.sleep(0.2)

    def restart_agent(self, name: str, timeout_s: float = 60.0) -> float:
        """Stop node `name`'s agent (SIGTERM) and start it again on the same address, as a
        reboot or an upgrade of the node does; the seconds until it listened again."""
        configs = self.work_dir / "agents"
        config, address_file = configs / f"{name}.toml", configs / f"{name}.address"
        listen = self.agent_urls[name].removeprefix("http://")
        config.write_text(agent_config_for_demo(tomllib.loads(config.read_text()), listen))
        agent = self.agents[name]
        started = time.monotonic()
        agent.stop()
        address_file.unlink(missing_ok=True)
        agent.start()
        if wait_for_address_file(address_file, alive=agent.alive, timeout_s=timeout_s) is None:
            agent.check_alive()
            raise PrerequisiteError(f"agent of {name} did not listen again in time; see {agent.log_path}")
        return round(time.monotonic() - started, 3)

    def fleet_poller(self) -> FleetPoller:
        return FleetPoller(list(self.agent_urls.values()))

    # --- faults -------------------------------------------------------------------
    def apply(self, faults: tuple[FaultSpec, ...]) -> None:
        # Every server the step names at once (Lab.set_host_faults starts their delay
        # lines in parallel), so "4 of 6 servers sick" never spends seconds as "1 of 6".
        hosts = {self.lab.server_addr(az, server=spec.server): spec.fault for spec in faults
                 if spec.server is not None for az in (self.azs if spec.az == ALL_AZS else [spec.az])}
        if hosts:
            self.lab.set_host_faults(hosts)
        for spec in faults:  # every AZ of one spec at once (Lab.set_faults)
            if spec.server is None:
                azs = self.azs if spec.az == ALL_AZS else [spec.az]
                self.lab.set_faults({az: spec.fault for az in azs}, uplink=spec.uplink)

    def clear(self) -> None:
        self.lab.clear()


@dataclass
class _ScenarioRun:
    """The state of one scenario run (controllers, recorder, events)."""

    stack: LoopStack
    scenario: Scenario
    prefix: str
    controllers: dict[str, ManagedProcess] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)  # controllers the run SIGKILLed itself
    events: list[FaultEvent] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)
    fault_text: str = ""

    def note(self, text: str) -> None:
        self.log_lines.append(f"{time.strftime('%H:%M:%S')} {text}")

    def check_children(self) -> None:
        """A child that died on its own ends the run with its last log lines: figures
        from a loop with a dead part would be meaningless."""
        for agent in self.stack.agents.values():
            agent.check_alive()
        for name, proc in self.controllers.items():
            if name not in self.killed:
                proc.check_alive()


def stop_strays(work_dir: Path) -> None:
    """Stop any child of ours still running from `work_dir`'s configs. A Ctrl-C or SIGTERM
    that lands while a child is being spawned (between fork and our bookkeeping) leaves it
    unrecorded; its command line still names a file under our work dir."""
    import psutil

    from azprobe.dev.lab.netns import kill_pids

    marker = str(work_dir)
    strays = []
    for child in psutil.Process().children(recursive=True):
        try:
            if any(marker in arg for arg in child.cmdline()):
                strays.append(child.pid)
        except psutil.Error:
            continue  # gone already
    if strays:
        log.warning("demo cleanup: stopping %d unrecorded child process(es): %s", len(strays), strays)
        kill_pids(strays)


def _start_controllers(run: _ScenarioRun, exit_stack: ExitStack, safety: Mapping[str, float] | None,
                       prometheus_url: str | None = None,
                       evaluation_window_s: float = DEFAULT_EVALUATION_WINDOW_S) -> None:
    stack, scenario = run.stack, run.scenario
    for i in range(1, scenario.controllers + 1):
        plan = ControllerPlan(name=f"ctl-{i}")  # loopback port 0: nothing here needs its address
        path = stack.work_dir / f"{run.prefix.strip('/').replace('/', '-')}-{plan.name}.toml"
        path.write_text(controller_config(
            plan, consul_url=stack.consul_url, prefix=run.prefix, agent_urls=list(stack.agent_urls.values()),
            azs=stack.azs, lock_delay_s=LOCK_DELAY_S, session_ttl_s=SESSION_TTL_S,
            heartbeat_s=scenario.heartbeat_s or 30.0, safety=safety, prometheus_url=prometheus_url,
            evaluation_window_s=evaluation_window_s))
        proc = ManagedProcess(plan.name, azprobe_argv("controller", "--config", str(path)),
                              path.with_suffix(".log"))
        exit_stack.callback(proc.stop)  # before start(): an interrupt right after it is covered
        run.controllers[plan.name] = proc
        proc.start()


def _view_state(run: _ScenarioRun, recorder: KvRecorder, poller: FleetPoller, phase: str, phase_t0: float,
                metrics: ScenarioMetrics | None) -> ViewState:
    doc = recorder.latest
    state = ViewState(scenario=run.scenario.name, description=run.scenario.description, phase=phase,
                      phase_elapsed_s=time.monotonic() - phase_t0, fault=run.fault_text,
                      paths=[p for p in summarise(poller.recent) if p.dst in run.stack.azs],
                      log=run.log_lines[-5:])
    if doc is not None:
        state.zones = zone_rows(doc)
        state.generation, state.doc_state, state.leader = doc.generation, doc.state, doc.leader
    if metrics is not None:
        state.kv_writes, state.detect_s, state.recover_s = metrics.kv_writes, metrics.detect_s, metrics.recover_s
    return state


def run_scenario(stack: LoopStack, scenario: Scenario, *, fault_s: float | None = None, prefix: str | None = None,
                 tick: Tick | None = None, baseline_timeout_s: float = 60.0, settle_s: float = 2.0,
                 recover_timeout_s: float = 60.0, safety: Mapping[str, float] | None = None,
                 prometheus_url: str | None = None,
                 evaluation_window_s: float = DEFAULT_EVALUATION_WINDOW_S,
                 baseline_ready: Callable[[WeightsDoc], bool] | None = None) -> ScenarioResult:
    """Run one scenario against a running stack; controllers and faults are gone on return.
    safety: [safety] keys for the controllers (None: the controller's defaults, as
    installed; a test passes shorter dwells). prometheus_url: the controllers
    read the agent through that Prometheus instead of pulling it. baseline_ready: a
    further condition on the healthy baseline document (a second scenario on the same
    prefix waits for the first one's traces to go)."""
    fault_s = fault_s if fault_s is not None else scenario.default_fault_s
    timeline = scenario.timeline(fault_s)
    sick = scenario.sick_azs(stack.azs)
    prefix = prefix or f"azprobe/demo-{uuid.uuid4().hex[:8]}/"
    run = _ScenarioRun(stack, scenario, prefix)
    poller = stack.fleet_poller()
    ticker = _Ticker(tick)

    def current_metrics() -> ScenarioMetrics:
        return compute_metrics(recorder.samples, run.events, sick, leader_events=leaders.events)

    def show(phase: str, t0: float) -> None:
        run.check_children()
        if ticker.due():
            poller.poll()
            ticker.emit(_view_state(run, recorder, poller, phase, t0, current_metrics()))

    with ExitStack() as exit_stack:
        recorder = KvRecorder(stack.consul_url, prefix).start()
        exit_stack.callback(recorder.stop)
        leaders = LeaderRecorder(stack.consul_url, prefix).start()
        exit_stack.callback(leaders.stop)
        _start_controllers(run, exit_stack, safety, prometheus_url, evaluation_window_s)
        exit_stack.callback(stack.clear)  # a failed run never leaves a fault behind
        run.note(f"{len(run.controllers)} controller(s) started, prefix {prefix}")

        # Baseline: weights in KV, every zone ok, held for settle_s.
        t0 = time.monotonic()
        ok_since: float | None = None
        while True:
            doc = recorder.latest
            healthy = (doc is not None and doc.state == "ok" and set(stack.azs) <= set(doc.zones)
                       and all(z.state == "ok" for z in doc.zones.values())
                       and (baseline_ready is None or baseline_ready(doc)))
            now = time.monotonic()
            ok_since = (ok_since or now) if healthy else None
            if ok_since is not None and now - ok_since >= settle_s:
                break
            if now - t0 > baseline_timeout_s:
                raise PrerequisiteError(
                    f"no healthy baseline weights in KV within {baseline_timeout_s:.0f} s "
                    f"(latest: {doc.state if doc else 'nothing written'}); logs in {stack.work_dir}")
            show("baseline", t0)
            time.sleep(0.05)
        run.note("baseline: " + " ".join(f"{az}={z.share}" for az, z in recorder.latest.zones.items()))

        # Fault phase: execute the timeline at its offsets.
        t0 = time.monotonic()
        pending = list(timeline)
        while pending:
            if time.monotonic() - t0 >= pending[0].at_s:
                _execute(run, pending.pop(0), recorder)
                continue
            show("fault", t0)
            time.sleep(0.02)

        # Recovery: until the sick zones are back near baseline in a document whose state
        # is ok (out of panic, nothing degraded), and after a leader kill another
        # controller has written.
        t0 = time.monotonic()
        while time.monotonic() - t0 < recover_timeout_s:
            m = current_metrics()
            doc = recorder.latest
            killed = any(e.action == "kill-leader" for e in run.events)
            if ((m.recover_s is not None or not sick) and doc is not None and doc.state == "ok"
                    and (not killed or m.takeover_s is not None)):
                break
            show("recovery", t0)
            time.sleep(0.05)
        else:
            run.note(f"not recovered within {recover_timeout_s:.0f} s")
        samples = recorder.samples
        metrics = compute_metrics(samples, run.events, sick, leader_events=leaders.events)
        run.note("done")
        if tick is not None:
            tick(_view_state(run, recorder, poller, "done", t0, metrics))
    return ScenarioResult(scenario.name, sick, fault_s, metrics, samples, list(run.events), str(stack.work_dir),
                       leader_events=leaders.events, expect_drain=scenario.expect_drain,
                       expect_panic=scenario.expect_panic)


def _execute(run: _ScenarioRun, step: Step, recorder: KvRecorder) -> None:
    # Faults are stamped when the lab call returns: from then on the fault is in effect
    # (starting a delay line takes a moment, which is the lab's latency, not the loop's).
    started = time.monotonic()
    if step.action == "fault":
        run.stack.apply(step.faults)
        run.fault_text = "; ".join(f.describe() for f in step.faults)
        now = time.monotonic()
        run.events.append(FaultEvent(now, "fault", run.fault_text, apply_s=round(now - started, 3)))
    elif step.action == "clear":
        run.stack.clear()
        run.fault_text = ""
        now = time.monotonic()
        run.events.append(FaultEvent(now, "clear", apply_s=round(now - started, 3)))
    elif step.action == "kill-leader":
        doc = recorder.latest
        name = doc.leader if doc is not None and doc.leader in run.controllers else next(iter(run.controllers))
        run.events.append(FaultEvent(started, "kill-leader", name))
        run.killed.add(name)
        run.controllers[name].kill()
        run.note(f"SIGKILL leader {name}")
        return
    run.note(f"{step.action}: {run.fault_text or 'all faults cleared'}"
               f" (applied in {time.monotonic() - started:.1f} s)")


class _Ticker:
    """Calls the view callback at most once per second."""

    def __init__(self, tick: Tick | None, period_s: float = 1.0) -> None:
        self.tick = tick
        self.period_s = period_s
        self.next_at = 0.0

    def due(self) -> bool:
        return self.tick is not None and time.monotonic() >= self.next_at

    def emit(self, state: ViewState) -> None:
        self.next_at = time.monotonic() + self.period_s
        assert self.tick is not None
        self.tick(state)


def run_demo(scenario: Scenario, *, fault_s: float | None = None, keep: bool = False, tick: Tick | None = None,
             progress: Callable[[str], None] = lambda msg: None, lab_name: str = LAB_NAME,
             nodes_per_az: int = DEFAULT_NODES_PER_AZ) -> ScenarioResult:
    """The whole demo: stack up, one scenario run, stack down (always)."""
    stack = LoopStack(keep=keep, lab_name=lab_name, nodes_per_az=nodes_per_az,
                      servers_per_az=scenario.servers_per_az)
    try:
        stack.start(progress)
        progress(f"scenario {scenario.name}")
        return run_scenario(stack, scenario, fault_s=fault_s, tick=tick)
    finally:
        progress("teardown" + (f" (keeping the lab and {stack.work_dir})" if keep else ""))
        stack.close()
