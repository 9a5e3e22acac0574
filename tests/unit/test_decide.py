"""controller/decide.py: the one decision function (quorum, healthy band, safety rules),
and the what-if's per-zone form deciding as a fleet that reports those figures."""

from __future__ import annotations

import random

import pytest

from azprobe.contracts.stats import ZoneStats
from azprobe.contracts.weights import MAX_ZONES, WeightsDoc
from azprobe.controller.decide import GLOBAL_VIEW, DecisionRules, decide_views
from azprobe.controller.model_cli import what_if
from azprobe.controller.models import DEGRADED_BELOW, DefaultModel, SeedV1Model
from azprobe.controller.quorum import NodeEvidence, QuorumConfig
from azprobe.controller.safety import SafetyConfig, SafetyState, apply_safety

T0 = 1_764_470_000.0
AZS = ("az-a", "az-b", "az-c")
OK = ZoneStats(success=1.0, p95_ms=10.0, util=0.3, samples=200)
SLOW = ZoneStats(success=1.0, p95_ms=40.0, util=0.3, samples=200)  # health ~0.97: healthy, below the best
DOWN = ZoneStats(success=0.5, p95_ms=10.0, util=0.3, samples=200)


def _fleet(zones: dict[str, ZoneStats], per_az: int = 3, azs=AZS) -> list[NodeEvidence]:
    return [NodeEvidence(f"node-{az}-{i}", az, zones) for az in azs for i in range(per_az)]


def _global(nodes, zones, rules, states=None, now=T0):
    views = decide_views(nodes, {GLOBAL_VIEW: zones}, rules=rules, states=states or {}, now=now)
    return views, views[GLOBAL_VIEW].decision


def test_the_healthy_band_levels_healthy_zones_in_the_decision():
    zones = {"az-a": OK, "az-b": SLOW, "az-c": DOWN}
    _, banded = _global(_fleet(zones), zones, DecisionRules(DefaultModel()))
    _, raw = _global(_fleet(zones), zones, DecisionRules(DefaultModel(), QuorumConfig(healthy_band=0.0)))
    assert abs(banded.shares["az-a"] - banded.shares["az-b"]) <= 1 and banded.shares["az-c"] == 1
    assert raw.shares["az-a"] - raw.shares["az-b"] >= 10  # weight^6 on a 0.03 health gap
    assert any("healthy_band" in r for r in banded.zones["az-b"].reasons)


def test_one_liar_does_not_decide():
    zones = {"az-a": OK, "az-b": OK, "az-c": OK}
    nodes = _fleet(zones)
    nodes[0] = NodeEvidence(nodes[0].node, nodes[0].az, {**zones, "az-b": DOWN})
    _, decision = _global(nodes, zones, DecisionRules(DefaultModel()))
    assert sorted(decision.shares.values()) == [33, 33, 34] and decision.state == "ok"


def test_every_source_gets_its_view_and_a_silent_source_keeps_it():
    zones = {"az-a": OK, "az-b": DOWN, "az-c": OK}
    rules = DecisionRules(DefaultModel())
    seen = {GLOBAL_VIEW: zones, **{az: zones for az in AZS}}
    views = decide_views(_fleet(zones), seen, rules=rules, states={}, now=T0)
    assert set(views) == {GLOBAL_VIEW, *AZS}
    states = {name: v.decision.safety_state for name, v in views.items()}
    first = views["az-c"].decision.shares
    # az-c's agents fall silent: its view is still decided (held on last-known-good)
    silent = decide_views(_fleet(zones, azs=("az-a", "az-b")), seen, rules=rules, states=states, now=T0 + 1)
    assert silent["az-c"].judgement is None and silent["az-c"].decision.shares == first
    assert silent["az-c"].decision.publishable


def test_a_zone_seen_without_votes_is_known_without_evidence():
    zones = {"az-a": OK, "az-b": OK, "az-c": ZoneStats(success=0.0, p95_ms=2000.0, samples=5)}
    _, decision = _global(_fleet(zones), zones, DecisionRules(DefaultModel()))
    assert decision.zones["az-c"].state == "stale" and decision.zones["az-c"].share == 33  # never drained


def test_degraded_below_is_the_models_unless_safety_sets_it():
    assert DecisionRules(DefaultModel()).safety.degraded_threshold == DEGRADED_BELOW
    assert DecisionRules(SeedV1Model()).safety.degraded_threshold == SeedV1Model().degraded_below
    assert DecisionRules(SeedV1Model(), safety=SafetyConfig(degraded_below=0.5)).safety.degraded_threshold == 0.5


def _random_zones(r: random.Random) -> dict[str, ZoneStats]:
    """Plausible figures around the thresholds: healthy, slow, lossy, and either enough
    samples for both [quorum] min_node_samples and [safety] min_samples, or too few for a vote."""
    out = {}
    for az in r.sample([f"az-{c}" for c in "abcdefgh"], r.randint(1, 8)):
        out[az] = ZoneStats(success=r.choice([1.0, 0.9995, 0.999, 0.995, 0.99, 0.9, 0.5, None]),
                            p95_ms=r.choice([None, r.uniform(1, 20), r.uniform(20, 80), r.uniform(80, 2000)]),
                            util=r.choice([None, r.uniform(0, 1)]),
                            syn_retrans_per_conn=r.choice([0.0, 0.0, r.uniform(0, 0.05)]),
                            rto_per_conn=r.choice([0.0, 0.0, r.uniform(0, 0.05)]),
                            samples=r.choice([0, 5, 20, 200, 5000]))
    return out


@pytest.mark.parametrize("model", [DefaultModel(), SeedV1Model()], ids=lambda m: m.name)
def test_the_per_zone_what_if_decides_as_a_fleet_reporting_those_figures(model):
    """docs/contracts.md "Model input": a quorum of one voter is that voter, so the what-if
    on the per-zone form gives the shares of any fleet whose nodes all report the figures."""
    r = random.Random(20)
    quorums = [QuorumConfig(), QuorumConfig(healthy_band=0.0), QuorumConfig(min_nodes=1, fraction=0.9)]
    for case in range(300):
        zones = _random_zones(r)
        rules = DecisionRules(model, r.choice(quorums), SafetyConfig())
        nodes = _fleet(zones, per_az=r.randint(1, 10), azs=r.sample(AZS, r.randint(1, 3)))
        _, fleet = _global(nodes, zones, rules, now=0.0)
        single = what_if(rules, zones)
        assert single.shares == fleet.shares, (case, zones)
        assert {az: z.state for az, z in single.zones.items()} == {az: z.state for az, z in fleet.zones.items()}


def test_the_zones_in_play_fit_one_weights_document():
    stats = {f"z{i:03}": ZoneStats(success=1.0, p95_ms=10.0, samples=100) for i in range(MAX_ZONES + 6)}
    decision = apply_safety(stats, {}, now=T0, state=SafetyState(), config=SafetyConfig())
    assert len(decision.zones) == MAX_ZONES
    WeightsDoc(generation=1, generated_at=T0, expires_at=T0 + 90, leader="ctl", model="default",
               state=decision.state, zones=decision.zones)
