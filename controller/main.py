"""`azprobe controller --config FILE`: windows in, fenced weights out.

The shell: config, wiring, the two loops, signals. Two loops, each starting a round every
interval_s (next_start):
- the cycle (controller/decider.py), on the asyncio event loop with /metrics and
  /healthz: pull, merge, detect, decide;
- the Consul round (controller/consul_duties.py), in a thread of its own: session and
  lock, operator controls, discovery, and - as leader - the fenced write.
They share nothing but the Handover (controller/handover.py), which carries immutable
snapshots each way. A reload (SIGHUP, controller/reload.py) runs on the event loop.

Logging is one line per state change: became leader / stepped down, Consul lost /
regained, a zone changing state (with its first reason). Never per cycle, never the token.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any, TypeVar

import click
import uvloop

from azprobe.clients.transport import raise_file_limit
from azprobe.contracts import prom
from azprobe.controller.agent_identity import AgentGuard
from azprobe.controller.collect import Collector
from azprobe.controller.config import (ControllerConfig, bound_advertise, catalog_token_warning, load_config,
                                       load_model_from)
from azprobe.controller.consul_duties import ConsulDuties
from azprobe.controller.decide import DecisionRules
from azprobe.controller.decider import CycleOutcome, Decider
from azprobe.controller.gcpace import pace_gc
from azprobe.controller.handover import Handover
from azprobe.controller.metrics import ControllerMetrics, bound_port, start_server
from azprobe.controller.prom_source import PrometheusCollector
from azprobe.controller.reload import apply_reload, checked_running_config
from azprobe.controller.topology import Topology
from azprobe.controller.window_source import AgentTarget, WindowSource, pull_budget
from azprobe.daemon import sdnotify
from azprobe.security import reloadable
from azprobe.daemon.address_file import format_host_port, write_address_file
from azprobe.errors import PrerequisiteError

T = TypeVar("T")
log = logging.getLogger("azprobe.controller")


def window_source(config: ControllerConfig) -> WindowSource:
    """The direct pull, or Prometheus (agents.source = "prometheus", docs/prometheus.md)."""
    c, topology = config.controller, Topology(config.topology)
    if config.prometheus is not None:
        # A cycle waits for Prometheus's answer most of an interval; a slower one is
        # ingested by a later cycle, so the cycle keeps its pace.
        return PrometheusCollector(config.prometheus, evaluation_window_s=c.evaluation_window_s,
                                   stale_after_s=config.safety.stale_after_s, topology=topology,
                                   cycle_budget_s=c.interval_s * 0.8)
    a = config.agents
    return Collector(evaluation_window_s=c.evaluation_window_s, pull_timeout_s=a.pull_timeout_s,
                     stale_after_s=config.safety.stale_after_s,
                     cycle_budget_s=pull_budget(a.pull_timeout_s, c.interval_s), token=a.token,
                     max_body_bytes=a.max_body_bytes, concurrency=a.concurrency, topology=topology,
                     forget_after_s=a.forget_after_s, guard=AgentGuard(a.tls, a.identity))


class Controller:
    """The wiring: one deciding side, one Consul side, one Handover between them."""

    def __init__(self, config: ControllerConfig, wall: Callable[[], float] = time.time) -> None:
        self.config = config
        if catalog_token_warning(config.agents):
            log.warning("%s", catalog_token_warning(config.agents))
        self.collector = window_source(config)
        self.collector.set_targets(AgentTarget(url) for url in config.agents.static)
        self.metrics = ControllerMetrics()
        self.handover = Handover(config)
        self.decider = Decider(self.collector, DecisionRules(load_model_from(config.model), config.quorum,
                                                             config.safety), self.handover, self.metrics, wall)
        self.consul = ConsulDuties(config, self.handover, self.metrics, self.collector.topology.azs, wall)
        publisher, decider = self.consul.publisher, self.decider
        self.metrics.add_totals({
            prom.COLLECT_PREFIX: lambda: self.collector.counters,
            # Views refused as invalid are counted where they are refused: the cycle or the write.
            prom.KV_PREFIX: lambda: replace(publisher.counters, invalid_docs=publisher.counters.invalid_docs
                                            + decider.counters.invalid_docs),
            prom.TOPOLOGY_PREFIX: lambda: self.collector.topology.counters})
        guard = getattr(self.collector, "guard", None)  # the direct pull's; Prometheus has none
        if guard is not None and guard.enabled:
            self.metrics.add_reason_totals({prom.AGENT_IDENTITY_REFUSED: lambda: guard.refused,
                                            prom.AGENT_TLS_FAILURES: lambda: guard.handshake_failures})

    async def cycle(self) -> CycleOutcome:
        return await self.decider.cycle()

    def consul_tick(self) -> None:
        """One round with Consul (blocking; the run loop calls it in its own thread)."""
        self.consul.tick()

    def health(self) -> dict[str, Any]:
        states = self.collector.agent_states()
        return {"name": self.config.controller.name, "leader": self.consul.election.is_leader,
                "consul_up": bool(self.consul.consul_up), "generation": self.consul.publisher.generation,
                "agents": {s.value: n for s, n in states.items()}}

    def reload(self, path: str) -> None:
        """SIGHUP: re-read the config; apply what can change live, name what needs a restart."""
        try:
            new = load_config(path)
            running = checked_running_config(self.config, new)  # what start refuses, a reload does not install
        except Exception as exc:  # a bad edit must not take the running controller down
            log.error("reload failed, keeping the running config: %s", exc)
            return
        reloadable.reload_all()  # rotated certificates and secret files, at once
        self.config = apply_reload(self.config, new, running, decider=self.decider, handover=self.handover)
        log.info("reloaded %s: %d static agents, model %s", path, len(new.agents.static), new.model.name)

    async def run(self, stop: asyncio.Event, address_file: str | None = None) -> None:
        c = self.config.controller
        try:
            runner = await start_server(self.metrics, c.listen[0], c.listen[1], self.health)
        except OSError as exc:  # in use, or not this host's address: the operator's to fix, not a bug
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise PrerequisiteError(f"controller.listen {format_host_port(*c.listen)}: {reason}; stop what "
                                    "listens there, or set controller.listen to a free address") from None
        try:
            port = bound_port(runner)
            self.consul.election.address = bound_advertise(c.advertise, port)  # listen port 0: the real one
            if address_file:
                write_address_file(address_file, c.listen[0], port)
            log.info("controller %s serving /metrics on %s, %d static agents", c.name,
                     format_host_port(c.listen[0], port), len(self.config.agents.static))
        except BaseException:
            await runner.cleanup()
            raise
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
            self.handover.wake()
            await asyncio.to_thread(consul_loop.join)
            notifier.stopping()
            await asyncio.to_thread(self.consul.election.release)
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
            next_at = next_start(next_at, time.monotonic(), interval)
            delay = next_at - time.monotonic()
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
            except asyncio.TimeoutError:
                pass

    def _consul_every(self, stop: threading.Event) -> None:
        """The Consul loop (its own thread): consul_tick every interval (next_start),
        and between rounds each decision as soon as the cycle offers it."""
        interval = self.config.controller.interval_s
        next_at = time.monotonic()
        while not stop.is_set():
            _logged(self.consul_tick, "consul round failed")
            next_at = next_start(next_at, time.monotonic(), interval)
            while not stop.is_set() and (remaining := next_at - time.monotonic()) > 0:
                if self.handover.wait_for_views(remaining) and not stop.is_set():
                    _logged(self.consul.publish_decided, "publishing a decision failed")


def _logged(step: Callable[[], None], what: str) -> None:
    try:
        step()
    except Exception:  # a bug in one round must not kill the daemon
        log.exception(what)


OVERRUN_REST = 0.1  # of interval_s: the gap after a round that overran


def next_start(previous: float, now: float, interval: float) -> float:
    """When the next round starts: `interval` after the previous start, or, after a round
    that overran, OVERRUN_REST of an interval after it ended.

    Not the next tick of a fixed grid: windows arrive at a steady rate, so a round pulls
    what came since the last pull, and a round that waited for the next tick after
    overrunning by a little would pull up to twice the windows, overrun again, and stay
    there (at 5,000 agents: 0.83 s rounds on time, 1.1 s rounds every 2 s once late).
    Nor at once: the rest leaves the loop, the Consul thread and the metrics server a
    gap in every interval however long the rounds run."""
    return max(previous + interval, now + OVERRUN_REST * interval)


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run the controller's loop on uvloop (half the event-loop CPU per agent pull) with
    the collector's garbage-collector schedule (docs/scale.md)."""
    pace_gc()
    return uvloop.run(main)


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
