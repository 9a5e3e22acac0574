"""`azprobe controller --config FILE`: windows in, fenced weights out.

Two loops, each on its own grid of interval_s:
- the cycle, on the asyncio event loop (with /metrics and /healthz): pull all agents ->
  merge the evaluation window -> spike detector -> quorum + safety rules
  (controller/decide.py, one SafetyState per view: the global view and each
  weights/from/<src AZ>) -> the views to publish. It runs on every controller, leader or
  not, so a standby that takes over starts warm.
- the Consul tick, in a thread of its own (py-consul blocks): keep the session, try the
  lock, read the operator controls, and - as leader - publish the latest views in one
  fenced transaction. A slow or absent Consul delays only this loop, never the pulls; and
  since it is not scheduled by the event loop, a cycle that runs long (a large answer
  from a source, a garbage collection) never delays the session's renewal or a write.

Logging is one line per state change: became leader / stepped down, Consul lost /
regained, a zone changing state (with its first reason). Never per cycle, never the token.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import signal
import threading
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import click
import uvloop

from azprobe.daemon import sdnotify
from azprobe.daemon.address_file import format_host_port, write_address_file
from azprobe.clients.transport import raise_file_limit
from azprobe.clients.consul import ConsulError, ConsulSettings, make_client, read_key, translate_error
from azprobe.contracts import kv, prom
from azprobe.contracts.window import printable
from azprobe.controller.collect import AgentTarget, Collector, PullResult
from azprobe.controller.config import (ControllerConfig, bound_advertise, catalog_token_warning, load_config,
                                       load_model_from)
from azprobe.controller.controls import OperatorControls, parse_controls
from azprobe.controller.detector import DetectorResult, ZoneSpikeDetectors
from azprobe.controller.leader import LeaderElection, LeaderProbe
from azprobe.controller.merge import MergedView, failures_by_zone, merge_windows
from azprobe.controller.metrics import ControllerMetrics, bound_port, start_server
from azprobe.controller.decide import GLOBAL_VIEW, DecisionRules, decide_views
from azprobe.controller.prom_source import PrometheusCollector
from azprobe.controller.publish import Fenced, Publisher, WeightsView
from azprobe.controller.quorum import NodeEvidence, ViewJudgement
from azprobe.controller.safety import Decision, SafetyState
from azprobe.controller.topology import Topology

T = TypeVar("T")
log = logging.getLogger("azprobe.controller")

CONSUL_TIMEOUT_S = 2.0  # one Consul call never holds the Consul loop longer than this
DISCOVERY_EVERY_S = 5.0
WRITE_BACKOFF_MAX_S = 10.0  # a failing KV write is retried at least this often


@dataclass
class CycleOutcome:
    pull: PullResult
    merged: MergedView
    views: dict[str, WeightsView]
    spikes: dict[str, DetectorResult]
    duration_s: float
    judgements: dict[str, ViewJudgement]


class Controller:
    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        c = config.controller
        self.collector: Collector | PrometheusCollector
        topology = Topology(config.topology)
        if config.prometheus is not None:  # agents.source = "prometheus" (docs/prometheus.md)
            # A cycle waits for Prometheus's answer most of an interval; a slower one is
            # ingested by a later cycle, so the cycle keeps its pace.
            self.collector = PrometheusCollector(config.prometheus, evaluation_window_s=c.evaluation_window_s,
                                                 stale_after_s=config.safety.stale_after_s,
                                                 slot_s=min(c.interval_s, c.evaluation_window_s / 5),
                                                 topology=topology, cycle_budget_s=c.interval_s * 0.8)
        else:
            self.collector = Collector(evaluation_window_s=c.evaluation_window_s,
                                       pull_timeout_s=config.agents.pull_timeout_s,
                                       stale_after_s=config.safety.stale_after_s,
                                       cycle_budget_s=max(config.agents.pull_timeout_s * 2, c.interval_s * 0.8),
                                       slot_s=min(c.interval_s, c.evaluation_window_s / 5),
                                       token=config.agents.token, max_body_bytes=config.agents.max_body_bytes,
                                       concurrency=config.agents.concurrency, topology=topology,
                                       forget_after_s=config.agents.forget_after_s)
        if catalog_token_warning(config.agents):
            log.warning("%s", catalog_token_warning(config.agents))
        self.collector.set_targets(AgentTarget(url) for url in config.agents.static)
        self.rules = DecisionRules(load_model_from(config.model), config.quorum, config.safety)
        self.safety_states: dict[str, SafetyState] = {}
        self.detectors = ZoneSpikeDetectors()
        self.metrics = ControllerMetrics()
        self.consul_settings: ConsulSettings = replace(config.consul, timeout_s=CONSUL_TIMEOUT_S)
        self.client = make_client(self.consul_settings)
        self.election = LeaderElection(self.client, self.consul_settings, name=c.name, address=c.advertise,
                                       ttl_s=c.session_ttl_s, lock_delay_s=c.lock_delay_s)
        self.leader_probe = LeaderProbe(self.client, own_name=c.name, failures_needed=c.leader_probe_failures,
                                        timeout_s=min(0.5, c.interval_s))
        self.publisher = Publisher(self.client, self.consul_settings, leader_name=c.name,
                                   model_name=config.model.name, heartbeat_s=config.heartbeat_s,
                                   expiry_s=Publisher.expiry_for(heartbeat_s=config.heartbeat_s,
                                                                 session_ttl_s=c.session_ttl_s,
                                                                 lock_delay_s=c.lock_delay_s,
                                                                 interval_s=c.interval_s))
        self.metrics.add_totals({prom.COLLECT_PREFIX: lambda: self.collector.counters,
                                 prom.KV_PREFIX: lambda: self.publisher.counters,
                                 prom.TOPOLOGY_PREFIX: lambda: self.collector.topology.counters})
        self.operator = OperatorControls()
        self.latest_views: dict[str, WeightsView] | None = None
        self.consul_up: bool | None = None  # None: not known yet
        self.term_started = False
        self.zone_states: dict[str, str] = {}
        self.overall_state: str | None = None
        self._pending_targets: list[AgentTarget] | None = None
        self._last_discovery = -1e9
        self._last_full_gc = time.monotonic()
        self._logged_problems: tuple[str, ...] = ()
        self._spiking: dict[str, bool] = {}
        self._warned_invalid = False
        self._write_failures = 0  # consecutive failed weight writes (not 409s)
        self._write_retry_at = float("-inf")  # publisher clock
        self.wall = time.time  # the decision clock (safety ages, detector buckets, control expiries)

    # --- the cycle --------------------------------------------------------------------
    def evidence(self, merged: MergedView) -> list[NodeEvidence]:
        """Each vantage point's own evidence over the evaluation window (the store's per-node sums)."""
        util = merged.util
        return [NodeEvidence(node, az, {dst: agg.zone_stats(util.get(dst)) for dst, agg in dsts.items()})
                for node, (az, dsts) in self.collector.store.node_input().items()]

    def decide(self, merged: MergedView, spikes: Mapping[str, DetectorResult],
               now: float) -> tuple[dict[str, WeightsView], dict[str, ViewJudgement]]:
        """The global view and each source's view (controller/decide.py), and their quorum judgements."""
        seen = {GLOBAL_VIEW: merged.zones, **merged.by_source}
        decided = decide_views(self.evidence(merged), seen, rules=self.rules, states=self.safety_states, now=now,
                               controls=self.operator.controls, spikes={az: r.spike for az, r in spikes.items()})
        views: dict[str, WeightsView] = {}
        for name, view in decided.items():
            decision = view.decision
            if decision is None:  # a bug upstream: never publish it, say so once
                self.publisher.counters.invalid_docs += 1
                if not self._warned_invalid:
                    log.error("view %r is not a valid weights document, not publishing it: %s", name or "global",
                              view.error)
                    self._warned_invalid = True
                continue
            self.safety_states[name] = decision.safety_state
            if not decision.publishable:
                continue
            if name == GLOBAL_VIEW:
                self._log_state_changes(decision)
            views[name] = WeightsView(state=decision.state, source_az=name or None, zones=decision.zones)
        judgements = {name: view.judgement for name, view in decided.items() if view.judgement is not None}
        return views, judgements

    def _log_state_changes(self, decision: Decision) -> None:
        if decision.state != self.overall_state:
            why = decision.reasons[0] if decision.reasons else ""
            log.info("overall state %s -> %s%s", self.overall_state or "none", decision.state,
                     f": {why}" if why else "")
            self.overall_state = decision.state
        for az, zone in decision.zones.items():
            before = self.zone_states.get(az)
            if zone.state != before:
                log.info("zone %s: %s -> %s (share %d): %s", az, before or "new", zone.state, zone.share,
                         "; ".join(zone.reasons[-2:]))
                self.zone_states[az] = zone.state

    async def cycle(self) -> CycleOutcome:
        started = time.monotonic()
        if self._pending_targets is not None:
            targets, self._pending_targets = self._pending_targets, None
            self.collector.set_targets(targets)
        pull = await self.collector.pull_all()
        new_windows = self.collector.take_new()
        windows = self.collector.store.merge_input()
        # The store already holds just the evaluation window (by skew-corrected arrival
        # time, pre-combined per slot and AZ), so merge's own wall-clock filter is widened
        # to take it all.
        newest = max((w.end for w in windows), default=0.0)
        merged = merge_windows(windows, now=newest, evaluation_window_s=1e12)
        now = self.wall()
        spikes = self.detectors.update(now, failures_by_zone(new_windows), zones=list(merged.zones))
        views, judgements = self.decide(merged, spikes, now)
        if views.get(GLOBAL_VIEW) is not None:
            self.latest_views = views
            self.metrics.observe_zones(views[GLOBAL_VIEW].zones)
        self._full_gc_if_due()  # inside the cycle's duration: its pause is the cycle's
        duration = time.monotonic() - started
        self._observe(pull, spikes, duration)
        return CycleOutcome(pull, merged, views, spikes, duration, judgements)

    def _full_gc_if_due(self) -> None:
        """A full garbage collection at the end of a cycle (see pace_gc) every
        FULL_GC_EVERY_S, or sooner once GC_GROWTH_LIMIT more objects are alive than after
        the last one (a fleet of dead agents leaves ~10 objects of cyclic garbage per
        failed pull): a pause at a time that delays no pull, and memory stays bounded."""
        now = time.monotonic()
        if now - self._last_full_gc >= FULL_GC_EVERY_S or gc.get_count()[0] > GC_GROWTH_LIMIT:
            gc.collect()
            self._last_full_gc = now

    def _observe(self, pull: PullResult, spikes: Mapping[str, DetectorResult], duration: float) -> None:
        m = self.metrics
        m.cycle.observe(duration)
        m.pull.observe(pull.duration_s)
        for state, n in pull.states.items():
            m.agents.labels(state).set(n)
        m.observe_spikes(spikes)
        for az, result in spikes.items():  # detector events: one line when a spike starts or ends
            if result.spike != self._spiking.get(az, False):
                log.info("zone %s: %s", az, result.reason if result.spike else f"spike over ({result.reason})")
                self._spiking[az] = result.spike
        m.leader.set(1.0 if self.election.is_leader else 0.0)

    # --- Consul -----------------------------------------------------------------------
    def _set_consul_up(self, up: bool, error: Exception | None = None) -> None:
        if up != self.consul_up:
            if up:
                log.info("consul %s at %s", "regained" if self.consul_up is False else "reachable",
                            self.consul_settings.address)
            else:
                log.info("consul lost: %s", printable(str(error), 300))  # may quote a response body
            self.consul_up = up
        self.metrics.consul_up.set(1.0 if up else 0.0)

    def consul_tick(self) -> None:
        """One round with Consul (blocking; runs in a worker thread)."""
        try:
            self._discover()
            transition = self.election.tick()
            if transition is not None and transition.became_leader:
                self.term_started = False
            if not self.election.is_leader:
                self.leader_probe.observe(self.election.holder())
            self._read_controls()
            if self.election.is_leader:
                if not self.term_started:
                    self._write_failures, self._write_retry_at = 0, float("-inf")
                    generation = self.publisher.start_term()
                    self.term_started = True
                    log.info("leader term %s starts above generation %d", self.publisher.term, generation)
                self._publish()
            self._set_consul_up(True)
        except Fenced as exc:
            self._set_consul_up(True)
            self.election.step_down(f"write rejected by the fenced transaction (409: {exc.conflict})")
            self.term_started = False
        except ConsulError as exc:
            self._set_consul_up(False, exc)
            self.election.step_down("consul unavailable")
            self.term_started = False
        self.metrics.leader.set(1.0 if self.election.is_leader else 0.0)

    def _publish(self) -> None:
        """Write the latest views, as leader. A failed write (Consul answering 500, a
        timeout) is not a lost lock: the session still holds it and the fenced txn keeps
        a deposed leader out anyway, so we keep the lock and retry with exponential
        backoff (interval x 2^n, at most WRITE_BACKOFF_MAX_S) instead of stepping down
        and re-acquiring every tick. Raises Fenced on a 409 (the caller steps down)."""
        views = self.latest_views
        if views is None or self.election.session_id is None:
            return
        now = self.publisher.clock()
        if now < self._write_retry_at:
            return
        try:
            doc = self.publisher.publish(self.election.session_id, views)
        except Fenced:
            raise
        except ConsulError as exc:
            self._write_failures += 1
            delay = min(self.config.controller.interval_s * 2 ** min(self._write_failures, 16), WRITE_BACKOFF_MAX_S)
            self._write_retry_at = now + delay
            self.publisher.counters.write_errors += 1
            if self._write_failures == 1:
                log.warning("writing the weights failed, keeping the lock and retrying with backoff: %s",
                            printable(str(exc), 300))
            return
        if self._write_failures:
            log.info("writing the weights works again after %d failed attempts", self._write_failures)
        self._write_failures, self._write_retry_at = 0, float("-inf")
        if doc is not None:
            self.metrics.generation.set(doc.generation)
            self.metrics.last_write.set(doc.generated_at)

    def _read_controls(self) -> None:
        prefix = self.consul_settings.key(kv.CONTROL)
        state = read_key(self.client, prefix, recurse=True)
        self.operator = parse_controls(state.entries or {}, prefix, self.wall(), self.collector.topology.azs)
        if self.operator.problems != self._logged_problems:
            for problem in self.operator.problems:
                log.info("operator control %s", problem)
            self._logged_problems = self.operator.problems

    def _discover(self) -> None:
        if self.config.agents.discover != "consul" or time.monotonic() - self._last_discovery < DISCOVERY_EVERY_S:
            return
        try:
            _, entries = self.client.catalog.service(self.config.agents.service)
        except Exception as exc:  # py-consul raises requests' and its own types
            raise translate_error(exc, self.consul_settings.address, "reading the agent catalog") from None
        self._last_discovery = time.monotonic()
        targets = [AgentTarget(url=agent_url(e), az=(e.get("NodeMeta") or {}).get("az"), node=e.get("Node"))
                   for e in entries or [] if e.get("ServicePort")]
        targets += [AgentTarget(url) for url in self.config.agents.static]
        known = set(self.collector.cursors)
        if {t.url for t in targets} != known:
            log.info("agents: %d from the catalog (%d before)", len(targets), len(known))
        self._pending_targets = targets

    # --- run --------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        states = self.collector.agent_states()
        return {"name": self.config.controller.name, "leader": self.election.is_leader,
                "consul_up": bool(self.consul_up), "generation": self.publisher.generation,
                "agents": {s.value: n for s, n in states.items()}}

    def reload(self, path: str) -> None:
        """SIGHUP: re-read the config; agents, model and safety rules apply at once.
        Anything else (listen, Consul, names, timings) needs a restart, and is logged."""
        try:
            new = load_config(path)
        except Exception as exc:  # a bad edit must not take the running controller down
            log.error("reload failed, keeping the running config: %s", exc)
            return
        self.rules = DecisionRules(load_model_from(new.model), new.quorum, new.safety)
        if new.agents.discover != "consul":
            self._pending_targets = [AgentTarget(url) for url in new.agents.static]
        self._last_discovery = -1e9
        self._last_full_gc = time.monotonic()
        if (new.controller, new.consul, new.agents.discover, new.heartbeat_s, new.topology, new.agents.source,
                new.prometheus) != (
                self.config.controller, self.config.consul, self.config.agents.discover, self.config.heartbeat_s,
                self.config.topology, self.config.agents.source, self.config.prometheus):
            log.warning("reload: changes to [controller], [consul], [topology], [prometheus], agents.discover, "
                        "agents.source or heartbeat_s need a restart")
        if catalog_token_warning(new.agents) and not catalog_token_warning(self.config.agents):
            log.warning("reload: %s", catalog_token_warning(new.agents))
        self.config = replace(self.config, agents=new.agents, model=new.model, safety=new.safety, quorum=new.quorum)
        if isinstance(self.collector, Collector):
            self.collector.token = new.agents.token
        log.info("reloaded %s: %d static agents, model %s", path, len(new.agents.static), new.model.name)

    async def run(self, stop: asyncio.Event, address_file: str | None = None) -> None:
        c = self.config.controller
        runner = await start_server(self.metrics, c.listen[0], c.listen[1], self.health)
        port = bound_port(runner)
        self.election.address = bound_advertise(c.advertise, port)  # listen port 0: the real one
        log.info("controller %s serving /metrics on %s, %d static agents", c.name,
                 format_host_port(c.listen[0], port), len(self.config.agents.static))
        if address_file:
            write_address_file(address_file, c.listen[0], port)
        # systemd Type=notify: READY once serving; WATCHDOG=1 only after a completed cycle.
        notifier = sdnotify.LoopNotifier(lambda: " ".join(f"{k}={v}" for k, v in self.health().items()),
                                         loop_interval_s=c.interval_s)
        notifier.started()

        async def cycle_then_ping() -> None:
            await self.cycle()
            notifier.tick()

        consul_stop = threading.Event()
        consul_loop = threading.Thread(target=self._consul_every, args=(consul_stop,), name="consul", daemon=True)
        consul_loop.start()
        try:
            await self._every(stop, cycle_then_ping)
        finally:
            consul_stop.set()
            await asyncio.to_thread(consul_loop.join)
            notifier.stopping()
            await asyncio.to_thread(self.election.release)
            await self.collector.close()
            await runner.cleanup()

    async def _every(self, stop: asyncio.Event, step: Any) -> None:
        interval = self.config.controller.interval_s
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                await step()
            except Exception:  # a bug in one round must not kill the daemon
                log.exception("controller round failed")
            next_at = next_tick(next_at, time.monotonic(), interval)
            delay = next_at - time.monotonic()
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
            except asyncio.TimeoutError:
                pass

    def _consul_every(self, stop: threading.Event) -> None:
        """The Consul loop (its own thread): consul_tick on the same grid as the cycle."""
        interval = self.config.controller.interval_s
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                self.consul_tick()
            except Exception:  # a bug in one round must not kill the daemon
                log.exception("consul round failed")
            next_at = next_tick(next_at, time.monotonic(), interval)
            stop.wait(max(0.0, next_at - time.monotonic()))


def next_tick(previous: float, now: float, interval: float) -> float:
    """The next start on the fixed grid previous + k*interval that is not in the past.
    A round that overran skips the ticks it missed instead of starting at once: the
    rounds stay on a grid of window time, so an overrun never leaves the next round a
    bigger backlog than one missed tick's windows, and never runs rounds back to back."""
    nxt = previous + interval
    if nxt < now:
        nxt += math.ceil((now - nxt) / interval) * interval
    return nxt


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run the controller's loop on uvloop (half the event-loop CPU per agent pull) with
    the collector's garbage-collector schedule (docs/scale.md)."""
    pace_gc()
    return uvloop.run(main)


FULL_GC_EVERY_S = 600.0
# Net tracked objects allocated since the last collection (gc.get_count()[0]: CPython
# counts allocations minus deallocations): 2.5x the store of 5,000 agents.
GC_GROWTH_LIMIT = 1_000_000


def pace_gc() -> None:
    """The window store holds ~15 Python objects per agent window for the whole evaluation
    window (~400,000 at 5,000 agents) and replaces a fifth of them every second. CPython's
    collector then scanned them over and over: full collections about once a second (40 %
    of the cycle's CPU), and even with rare full ones, young collections of the live
    windows cost ~9 µs per window. None of them form reference cycles (refcounting frees
    them), so the automatic collector is off; the startup objects are frozen out of every
    scan; and `Controller._full_gc_if_due` collects what cycles there are (asyncio, HTTP
    libraries) every FULL_GC_EVERY_S or after GC_GROWTH_LIMIT net new objects, a pause of
    ~0.4 s at 5,000 agents on a busy 2-core box (docs/scale.md)."""
    gc.freeze()
    gc.disable()


def agent_url(entry: Mapping[str, Any]) -> str:
    """Base URL of an agent from a catalog entry (ServiceAddress, else the node's Address)."""
    host = entry.get("ServiceAddress") or entry.get("Address") or "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{int(entry['ServicePort'])}"


async def _main(config: ControllerConfig, address_file: str | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    controller = Controller(config)
    # ExecReload sends SIGHUP, whose default action would end the daemon (cleanly, so
    # Restart=on-failure would not even restart it): reload what can change live instead.
    loop.add_signal_handler(signal.SIGHUP, controller.reload, config.path)
    await controller.run(stop, address_file)


@click.command("controller")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="Controller config (TOML), see systemd/controller.toml.")
@click.option("--address-file", default=None, type=click.Path(dir_okay=False),
              help="Once serving, write the bound host:port here (for controller.listen port 0).")
def controller_command(config_path: str, address_file: str | None) -> None:
    """Run the controller: pull agents' windows, decide weights, write them to Consul KV."""
    config = load_config(config_path)
    raise_file_limit()  # before the collector sizes its connection pool from the limit
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # State changes are logged at INFO (one line each): show them without -v.
    for name in ("azprobe.controller", "controller"):
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
    run_event_loop(_main(config, address_file))
