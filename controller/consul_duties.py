"""The Consul side of the controller, in a thread of its own (py-consul blocks), every
interval_s: keep the session, try the lock, discover agents from the catalog, read the
operator controls, and - as leader - publish the newest decided views in one fenced
transaction. Between rounds, newly decided views are published as soon as they are
offered (`publish_decided`). A slow or absent Consul delays only this loop, never the
pulls; and since it is not scheduled by the event loop, a cycle that runs long (a large
answer from a source, a garbage collection) never delays the session's renewal or a write.

It meets the deciding side only through the Handover (controller/handover.py): it offers
operator controls and discovered agent lists, and takes the decided views.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Any

from azprobe.clients.consul import ConsulError, ConsulSettings, make_client, read_key, translate_error
from azprobe.contracts import kv
from azprobe.contracts.window import printable
from azprobe.controller.config import ControllerConfig
from azprobe.controller.controls import parse_controls
from azprobe.controller.handover import Handover
from azprobe.controller.leader import LeaderElection, LeaderProbe
from azprobe.controller.metrics import ControllerMetrics
from azprobe.controller.publish import Fenced, Publisher
from azprobe.controller.window_source import AgentTarget

log = logging.getLogger("azprobe.controller")

CONSUL_TIMEOUT_S = 2.0  # one Consul call never holds the Consul loop longer than this
DISCOVERY_EVERY_S = 5.0
WRITE_BACKOFF_MAX_S = 10.0  # a failing KV write is retried at least this often
CONTROLS_LOG_EVERY_S = 60.0  # a control/ read failing every round is logged this often
CATALOG_LOG_EVERY_S = 60.0  # likewise a catalog read failing every discovery


class ConsulDuties:
    def __init__(self, config: ControllerConfig, handover: Handover, metrics: ControllerMetrics,
                 azs: Collection[str], wall: Callable[[], float] = time.time) -> None:
        c = config.controller
        self.interval_s = c.interval_s
        self.handover = handover
        self.metrics = metrics
        self.azs = tuple(azs)  # the topology's AZs: the only ones a control may name
        self.wall = wall  # the decision clock: control expiries are unix seconds
        self.settings: ConsulSettings = replace(config.consul, timeout_s=CONSUL_TIMEOUT_S)
        self.client = make_client(self.settings)
        self.election = LeaderElection(self.client, self.settings, name=c.name, address=c.advertise,
                                       ttl_s=c.session_ttl_s, lock_delay_s=c.lock_delay_s)
        self.leader_probe = LeaderProbe(self.client, own_name=c.name, failures_needed=c.leader_probe_failures,
                                        timeout_s=min(0.5, c.interval_s))
        self.publisher = Publisher(self.client, self.settings, leader_name=c.name,
                                   model_name=config.model.name, heartbeat_s=config.heartbeat_s,
                                   expiry_s=Publisher.expiry_for(heartbeat_s=config.heartbeat_s,
                                                                 session_ttl_s=c.session_ttl_s,
                                                                 lock_delay_s=c.lock_delay_s,
                                                                 interval_s=c.interval_s))
        self.consul_up: bool | None = None  # None: not known yet
        self.term_started = False
        self._known_agents = frozenset(config.agents.static)  # the agent list last offered
        self._last_discovery = -1e9
        self._logged_problems: tuple[str, ...] = ()
        self._logged_pins: tuple[str, ...] = ()
        self._logged_off = False
        self._write_failures = 0  # consecutive failed weight writes (not 409s)
        self._write_retry_at = float("-inf")  # publisher clock
        self._control_failures_run = 0  # consecutive ones
        self._control_logged_at = float("-inf")  # monotonic
        self._catalog_failures_run = 0  # consecutive ones
        self._catalog_logged_at = float("-inf")  # monotonic

    def tick(self) -> None:
        """One round with Consul (blocking)."""
        self._guarded(self._round)

    def publish_decided(self) -> None:
        """Write views the deciding side just offered, between two rounds: as leader, once
        the term has started (a round starts it), else nothing."""
        if self.election.is_leader and self.term_started:
            self._guarded(self._publish)

    def _round(self) -> None:
        config = self._take_config()
        # The session and the lock first: nothing read after them (the catalog, control/,
        # anyone's writing) can keep the session from being renewed.
        transition = self.election.tick()
        if transition is not None and transition.became_leader:
            self.term_started = False
        if not self.election.is_leader:
            self.leader_probe.observe(self.election.holder())
        self._discover(config)
        self._read_controls()
        if self.election.is_leader:
            if not self.term_started:
                self._write_failures, self._write_retry_at = 0, float("-inf")
                generation = self.publisher.start_term()
                self.term_started = True
                log.info("leader term %s starts above generation %d", self.publisher.term, generation)
            self._publish()

    def _guarded(self, step: Callable[[], None]) -> None:
        """Run one step with Consul; a 409 or an unreachable Consul steps down."""
        try:
            step()
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

    def _set_consul_up(self, up: bool, error: Exception | None = None) -> None:
        if up != self.consul_up:
            if up:
                log.info("consul %s at %s", "regained" if self.consul_up is False else "reachable",
                         self.settings.address)
            else:
                log.info("consul lost: %s", printable(str(error), 300))  # may quote a response body
            self.consul_up = up
        self.metrics.consul_up.set(1.0 if up else 0.0)

    def _publish(self) -> None:
        """Write the newest views, as leader. A failed write (Consul answering 500, a
        timeout) is not a lost lock: the session still holds it and the fenced txn keeps
        a deposed leader out anyway, so we keep the lock and retry with exponential
        backoff (interval x 2^n, at most WRITE_BACKOFF_MAX_S) instead of stepping down
        and re-acquiring every tick. Raises Fenced on a 409 (the caller steps down)."""
        views = self.handover.views()
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
            delay = min(self.interval_s * 2 ** min(self._write_failures, 16), WRITE_BACKOFF_MAX_S)
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
        """Read control/ and offer what is in force. A failed read is not a lost lock:
        what is under control/ is anyone's writing (40,000 keys, or a few large ones, pass
        the 4 MiB answer bound), so it keeps the last good controls and the round goes on
        to start the term and publish. Only the session and the lock step down."""
        prefix = self.settings.key(kv.CONTROL)
        try:
            state = read_key(self.client, prefix, recurse=True)
        except ConsulError as exc:
            self._control_read_failed(prefix, exc)
            return
        if self._control_failures_run:
            log.info("operator controls: reading %s works again after %d failed reads", prefix,
                     self._control_failures_run)
            self._control_failures_run, self._control_logged_at = 0, float("-inf")
        operator = parse_controls(state.entries or {}, prefix, self.wall(), self.azs)
        self.handover.offer_controls(operator)
        controls = operator.controls
        # parse_controls keeps only the pins in force at that reading
        self.metrics.observe_controls(len(controls.host_pins), controls.hosts_off, operator.ignored)
        pins = tuple(sorted(controls.host_pins))
        if pins != self._logged_pins or controls.hosts_off != self._logged_off:
            log.info("operator host switches: %s; %s",
                     f"pinned healthy: {', '.join(pins)}" if pins else "no host pinned",
                     "host naming off (control/hosts-off)" if controls.hosts_off else "host naming on")
            self._logged_pins, self._logged_off = pins, controls.hosts_off
        if operator.problems != self._logged_problems:
            for problem in operator.problems:
                log.info("operator control %s", problem)
            if operator.ignored > len(operator.problems):
                log.info("operator control: %d more keys ignored", operator.ignored - len(operator.problems))
            self._logged_problems = operator.problems

    def _control_read_failed(self, prefix: str, exc: ConsulError) -> None:
        self.publisher.counters.control_read_errors += 1
        self._control_failures_run += 1
        now = time.monotonic()
        if now - self._control_logged_at >= CONTROLS_LOG_EVERY_S:
            self._control_logged_at = now
            log.warning("operator controls: reading %s failed (%d reads in a row), the last good controls stay "
                        "in force: %s; if it is too large, delete the keys under it that are not controls",
                        prefix, self._control_failures_run, printable(str(exc), 300))

    def _take_config(self) -> ControllerConfig:
        config, reloaded = self.handover.config()
        if reloaded:
            self.publisher.model_name = config.model.name
            self._last_discovery = -1e9  # read the catalog now
        return config

    def _discover(self, config: ControllerConfig) -> None:
        """Offer the agents the catalog lists (with the static ones). A failed read is not
        a lost lock: whoever may register the agents' service can pass the 4 MiB answer
        bound, so it keeps the last agent list and is retried at the discovery pace."""
        agents = config.agents
        if agents.discover != "consul" or time.monotonic() - self._last_discovery < DISCOVERY_EVERY_S:
            return
        self._last_discovery = time.monotonic()
        try:
            _, entries = self.client.catalog.service(agents.service)
        except Exception as exc:  # py-consul raises requests' and its own types
            self._catalog_read_failed(agents.service, translate_error(exc, self.settings.address,
                                                                      "reading the agent catalog"))
            return
        if self._catalog_failures_run:
            log.info("agents: reading the catalog service %r works again after %d failed reads", agents.service,
                     self._catalog_failures_run)
            self._catalog_failures_run, self._catalog_logged_at = 0, float("-inf")
        scheme = "https" if agents.tls is not None else "http"
        targets = [AgentTarget(url=agent_url(e, scheme), az=(e.get("NodeMeta") or {}).get("az"), node=e.get("Node"))
                   for e in entries or [] if e.get("ServicePort")]
        targets += [AgentTarget(url) for url in agents.static]
        urls = frozenset(t.url for t in targets)
        if urls != self._known_agents:
            log.info("agents: %d from the catalog (%d before)", len(urls), len(self._known_agents))
            self._known_agents = urls
        self.handover.offer_targets(targets)

    def _catalog_read_failed(self, service: str, exc: ConsulError) -> None:
        self.metrics.catalog_read_errors.inc()
        self._catalog_failures_run += 1
        now = time.monotonic()
        if now - self._catalog_logged_at >= CATALOG_LOG_EVERY_S:
            self._catalog_logged_at = now
            log.warning("agents: reading the catalog service %r failed (%d reads in a row), the last %d agents "
                        "stay in the pull: %s; if its answer is too large, deregister the instances of %r that are "
                        "not azprobe agents and allow service:write on it to the agents' tokens only", service,
                        self._catalog_failures_run, len(self._known_agents), printable(str(exc), 300), service)


def agent_url(entry: Mapping[str, Any], scheme: str = "http") -> str:
    """Base URL of an agent from a catalog entry (ServiceAddress, else the node's Address);
    https with [agents.tls], where the certificate, not the catalog, says which node answers."""
    host = entry.get("ServiceAddress") or entry.get("Address") or "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{int(entry['ServicePort'])}"
