"""The deciding side of the controller, on the event loop, every interval_s: pull all
agents -> the zones seen -> spike detector -> quorum + safety rules
(controller/decide.py, one SafetyState per view: the global view and each
weights/from/<src AZ>) -> the views to publish. It runs on every controller, leader or
not, so a standby that takes over starts warm.

It meets the Consul side only through the Handover (controller/handover.py): it takes the
operator controls and any new agent list at the start of a cycle, and offers the decided
views at its end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from azprobe.contracts.stats import ZoneStats
from azprobe.controller.decide import GLOBAL_VIEW, DecisionRules, decide_views
from azprobe.controller.detector import DetectorResult, ZoneSpikeDetectors
from azprobe.controller.gcpace import FullCollections
from azprobe.controller.handover import Handover
from azprobe.controller.merge import ZonesSeen, failures_by_zone
from azprobe.controller.metrics import ControllerMetrics
from azprobe.controller.publish import WeightsView
from azprobe.controller.hosts import sick_entries
from azprobe.controller.quorum import NodeEvidence, ViewJudgement
from azprobe.controller.safety import Controls, Decision, SafetyState
from azprobe.controller.window_source import PullResult, WindowSource

log = logging.getLogger("azprobe.controller")


@dataclass
class CycleOutcome:
    pull: PullResult
    seen: ZonesSeen
    views: dict[str, WeightsView]
    spikes: dict[str, DetectorResult]
    duration_s: float
    judgements: dict[str, ViewJudgement]


@dataclass
class DeciderCounters:
    """Monotonic totals since start (exported with the KV counters)."""

    invalid_docs: int = 0  # views the decision could not turn into a valid document: never published


class Decider:
    def __init__(self, collector: WindowSource, rules: DecisionRules, handover: Handover,
                 metrics: ControllerMetrics, wall: Callable[[], float] = time.time) -> None:
        self.collector = collector
        self.rules = rules
        self.handover = handover
        self.metrics = metrics
        self.wall = wall  # the decision clock (safety ages, detector buckets, control expiries)
        self.safety_states: dict[str, SafetyState] = {}
        self.detectors = ZoneSpikeDetectors()
        self.counters = DeciderCounters()
        self.gc = FullCollections()
        self.zone_states: dict[str, str] = {}
        self.overall_state: str | None = None
        self._spiking: dict[str, bool] = {}
        self._warned_invalid = False

    async def cycle(self) -> CycleOutcome:
        started = time.monotonic()
        inputs = self.handover.take_inputs()
        if inputs.targets is not None:
            self.collector.set_targets(inputs.targets)
        pull = await self.collector.pull_all()
        now = self.wall()
        seen, spikes = self.survey(now)
        views, judgements = self.decide(seen, spikes, now, inputs.controls.controls)
        if views.get(GLOBAL_VIEW) is not None:
            self.handover.offer_views(views)
            self.metrics.observe_zones(views[GLOBAL_VIEW].zones, views[GLOBAL_VIEW].sick)
        self.gc.collect_if_due()  # inside the cycle's duration: its pause is the cycle's
        duration = time.monotonic() - started
        self._observe(pull, spikes, duration)
        return CycleOutcome(pull, seen, views, spikes, duration, judgements)

    def survey(self, now: float) -> tuple[ZonesSeen, dict[str, DetectorResult]]:
        """The zones the store's evaluation window knows of, and the spike detector fed the
        windows that arrived since the last call."""
        seen = self.collector.store.zones_seen()
        spikes = self.detectors.update(now, failures_by_zone(self.collector.take_new()), zones=list(seen.zones))
        return seen, spikes

    def evidence(self, seen: ZonesSeen) -> list[NodeEvidence]:
        """Each vantage point's own evidence over the evaluation window (the store's per-node sums)."""
        util = seen.util
        hosts = self.collector.store.node_hosts()
        return [NodeEvidence(node, az, {dst: agg.zone_stats(util.get(dst)) for dst, agg in dsts.items()},
                             hosts.get(node, {}))
                for node, (az, dsts) in self.collector.store.node_input().items()]

    def decide(self, seen: ZonesSeen, spikes: Mapping[str, DetectorResult], now: float,
               controls: Controls) -> tuple[dict[str, WeightsView], dict[str, ViewJudgement]]:
        """The global view and each source's view (controller/decide.py), and their quorum judgements."""
        zones = {az: ZoneStats(util=u) for az, u in seen.util.items()}
        views_seen = {GLOBAL_VIEW: zones,
                      **{src: {dst: zones[dst] for dst in dsts} for src, dsts in seen.by_source.items()}}
        decided = decide_views(self.evidence(seen), views_seen, rules=self.rules, states=self.safety_states, now=now,
                               controls=controls, spikes={az: r.spike for az, r in spikes.items()})
        views: dict[str, WeightsView] = {}
        for name, view in decided.items():
            decision = view.decision
            if decision is None:  # a bug upstream: never publish it, say so once
                self.counters.invalid_docs += 1
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
            views[name] = WeightsView(state=decision.state, source_az=name or None,
                                      zones=MappingProxyType(dict(decision.zones)),
                                      sick=sick_entries(view.judgement, decision.zones))
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
