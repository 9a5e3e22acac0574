"""Property tests (hypothesis, 10,000 cases each): whatever the
inputs -- NaN, inf, negative, zero samples, huge counts, missing AZs, 1..8 zones, 0..3
vantage points that agree or not, operator controls, clock jumps -- every decision is
publishable as a valid weights document: finite integer shares, each >= 1, summing to 100;
weights in [e^-2, 1]; contract states. The rule chain runs the daemon's own decision
function (controller/decide.py: quorum, healthy band, safety rules) and checks every view.

Hypothesis draws a seed and the case is built from it with `random.Random`: drawing
~50 structured values per case costs ~5 ms in hypothesis on this box, which makes
10,000 cases x 4 properties several minutes; a seed costs well under 1 ms, and a
failing seed is printed, so a failure still reproduces exactly. A model case runs both
models (10,000 cases per model); a rule-chain case draws its model (half the cases each),
since every cycle there judges each vantage point and decides every view, as the daemon
does. The whole file costs ~30 s of CPU on this 2-core box.
"""

from __future__ import annotations

import math
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from azprobe.contracts.stats import ZoneStats
from azprobe.contracts.weights import MIN_WEIGHT, OVERALL_STATES, ZONE_STATES, ZoneWeights
from azprobe.controller.models import DefaultModel, SeedV1Model, shares_from_weights
from azprobe.controller.decide import GLOBAL_VIEW, DecisionRules, decide_views
from azprobe.controller.quorum import NodeEvidence, QuorumConfig
from azprobe.controller.safety import Controls, Decision, SafetyConfig, SafetyState

CASES = settings(max_examples=10_000, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))
SEEDS = st.integers(min_value=0, max_value=2**64 - 1)
AZS = [f"az-{c}" for c in "abcdefgh"]
MODELS = (DefaultModel(), SeedV1Model())
NASTY = [None, math.nan, math.inf, -math.inf, -1.0, -0.0, 0.0, 5e-324, 1e-9, 0.5, 1.0, 1.0000001, 800.0, 1e308]
NASTY_COUNTS = [-5, 0, 1, 19, 20, 21, 2**53 + 1, 2**63, 10**30]


def _value(r: random.Random, lo: float, hi: float) -> float | None:
    return r.choice(NASTY) if r.random() < 0.3 else r.uniform(lo, hi)


def random_stats(r: random.Random) -> ZoneStats:
    return ZoneStats(
        success=_value(r, 0.0, 1.0) if r.random() < 0.5 else 1.0 - r.expovariate(200),
        p95_ms=_value(r, 0.0, 600.0),
        util=_value(r, 0.0, 1.0),
        syn_retrans_per_conn=_value(r, 0.0, 0.2) or 0.0,
        rto_per_conn=_value(r, 0.0, 0.2) or 0.0,
        samples=r.choice(NASTY_COUNTS) if r.random() < 0.3 else r.randint(0, 10_000),
    )


def random_zones(r: random.Random, min_size: int = 1) -> dict[str, ZoneStats]:
    return {az: random_stats(r) for az in r.sample(AZS, r.randint(min_size, 8))}


def check_shares(shares: dict[str, int], names) -> None:
    assert set(shares) == set(names)
    assert sum(shares.values()) == 100
    assert all(type(s) is int and s >= 1 for s in shares.values())


@CASES
@given(SEEDS)
def test_models_any_input(seed):
    r = random.Random(seed)
    zones = random_zones(r)
    for model in MODELS:
        verdicts = model.evaluate(zones)
        assert set(verdicts) == set(zones)
        for v in verdicts.values():
            assert 0.0 <= v.health <= 1.0
            assert MIN_WEIGHT - 1e-12 <= v.weight <= 1.0
            assert math.isfinite(v.share_raw) and v.share_raw > 0
            assert all(isinstance(reason, str) for reason in v.reasons)
        check_shares(shares_from_weights({az: v.share_raw for az, v in verdicts.items()}), zones)
    # and the share rounding alone, on arbitrary weights
    weights = {az: r.choice([*NASTY[1:], r.random(), r.expovariate(1e-6)]) for az in r.sample(AZS, r.randint(1, 8))}
    check_shares(shares_from_weights(weights), weights)


safety_configs = [SafetyConfig(min_samples=m, max_drained_zones=k, drain_dwell_s=d, hysteresis_points=h,
                               recover_dwell_s=r, panic_exit_s=p)
                  for m in (1, 20) for k in (0, 1, 3) for d in (0.0, 2.0) for h in (0.0, 3.0)
                  for r in (0.0, 3.0) for p in (0.0, 10.0)]
quorum_configs = [QuorumConfig(), QuorumConfig(min_nodes=1, fraction=0.5, min_source_azs=1, min_node_samples=1),
                  QuorumConfig(healthy_band=0.0), QuorumConfig(min_node_samples=50, healthy_band=1.0)]


def random_fleet(r: random.Random) -> tuple[list[NodeEvidence], dict[str, dict[str, ZoneStats]]]:
    """1..3 vantage points in 1..3 source AZs (or none: every agent silent), most of them
    reporting the fleet's common figures (so quorums form), the others their own; and the
    zones each view knows of, as the merge names them (every destination and every AZ with
    agents, each with one utilisation figure)."""
    if r.random() < 0.15:
        return [], {}
    common = random_zones(r, min_size=0)
    sources = r.sample(AZS, r.choice((1, 1, 2, 3)))
    nodes = [NodeEvidence(f"node-{i}", r.choice(sources), common if r.random() < 0.6 else random_zones(r, min_size=0))
             for i in range(r.randint(1, 3))]
    util = {az: _value(r, 0.0, 1.0) for az in AZS}
    seen: dict[str, dict[str, ZoneStats]] = {GLOBAL_VIEW: {}}
    for n in nodes:
        seen[GLOBAL_VIEW].setdefault(n.az, ZoneStats(util=util[n.az]))
        for dst in n.zones:
            seen[GLOBAL_VIEW].setdefault(dst, ZoneStats(util=util[dst]))
            seen.setdefault(n.az, {})[dst] = ZoneStats(util=util[dst])
    return nodes, seen


def random_cycles(r: random.Random) -> list[dict]:
    cycles = []
    for _ in range(r.randint(1, 3)):
        nodes, seen = random_fleet(r)
        cycles.append({
            "nodes": nodes,
            "seen": seen,
            "dt": r.choice([0.0, 1.0, 1.0, 2.5, 11.0, 61.0, 4000.0, -3.0]),  # incl. a clock step back
            "freeze": r.random() < 0.1,
            "shifts": {az: r.uniform(-100, 100) for az in r.sample(AZS, r.randint(0, 2))},
            "spikes": {az: r.random() < 0.5 for az in r.sample(AZS, r.randint(0, 2))},
        })
    return cycles


def check_decision(decision: Decision, before: dict[str, int], ever_seen: bool, config: SafetyConfig) -> None:
    assert decision.state in OVERALL_STATES
    assert decision.publishable == ever_seen  # never an empty set once a zone was seen
    if not decision.publishable:
        return
    shares = decision.shares
    check_shares(shares, decision.zones)
    for z in decision.zones.values():
        assert z.state in ZONE_STATES
        ZoneWeights(**z.to_json())  # the contract's own validator: no NaN, ranges, types
    if set(before) == set(shares) and not any("caps lifted" in reason for reason in decision.reasons):
        # recovery cap: a zone recovering on its own health gains at most the cap,
        # plus its part of what draining zones gave up (+1 rounding per zone; a zone
        # drained on its last-known-good verdict shows as stale)
        drained = sum(max(before[az] - s, 0) + 1 for az, s in shares.items()
                      if decision.zones[az].state in ("degraded", "shifted", "stale"))
        for az, s in shares.items():
            reasons = decision.zones[az].reasons
            if any("recovering slowly" in reason for reason in reasons):
                assert s - before[az] <= config.max_increase_points + drained + 1, (before, shares)
            # a zone being drained (degraded, in a drain slot) never gains share
            if decision.zones[az].state == "degraded" and decision.state != "panic" \
                    and not any("not drained" in reason for reason in reasons):
                assert s <= before[az], (az, before, shares, reasons)


def run_chain(rules: DecisionRules, cycles: list[dict]) -> None:
    """The daemon's decision function, cycle after cycle, every view checked."""
    states: dict[str, SafetyState] = {}
    now = 1_764_470_000.0
    ever_seen: dict[str, bool] = {}
    for c in cycles:
        now += c["dt"]
        controls = Controls(freeze=c["freeze"], shifts={az: now + d for az, d in c["shifts"].items()})
        views = decide_views(c["nodes"], c["seen"], rules=rules, states=states, now=now, controls=controls,
                             spikes=c["spikes"])
        assert GLOBAL_VIEW in views
        for name, view in views.items():
            assert view.error is None and view.decision is not None, (name, view.error)
            ever_seen[name] = ever_seen.get(name, False) or bool(c["seen"].get(name)) and view.judgement is not None
            check_decision(view.decision, dict(states.get(name, SafetyState()).shares), ever_seen[name],
                           rules.safety)
        states = {name: view.decision.safety_state for name, view in views.items() if view.decision is not None}


@CASES
@given(SEEDS)
def test_rule_chain_any_input(seed):
    r = random.Random(seed)
    rules = DecisionRules(r.choice(MODELS), r.choice(quorum_configs), r.choice(safety_configs))
    run_chain(rules, random_cycles(r))


def random_hosts(r: random.Random, zones) -> dict:
    """A node's host sums toward the zones it judged: 0..7 servers each, shared addresses
    (so host quorums can form), some slow or failing, some with nasty counts."""
    from azprobe.controller.hosts import HostSums

    hosts = {}
    for dst in zones:
        for h in range(r.randint(0, 7)):
            rtt = [0] * 8
            rtt[r.choice((1, 1, 1, 5, 7))] = r.choice((0, 5, 40, 2**32))
            connects = r.choice((0, 1, 20, 2**32))
            hosts[(dst, f"198.18.{AZS.index(dst)}.{h}")] = HostSums(
                connects, r.choice((0, 0, 1, connects)), r.randint(0, 50), r.choice((0, 0, 3, 2**32)), rtt)
    return hosts


HOST_CASES = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))


@HOST_CASES
@given(SEEDS)
def test_host_evidence_only_ever_keeps_zones_in_play(seed):
    """Whatever the host sums, the decisions stay valid documents, and no zone's verdict is
    worse with host evidence than without it: hosts can hold a zone in play, never drain one."""
    r = random.Random(seed)
    rules = DecisionRules(r.choice(MODELS), r.choice(quorum_configs), r.choice(safety_configs))
    nodes, seen = random_fleet(r)
    with_hosts = [NodeEvidence(n.node, n.az, n.zones, random_hosts(r, n.zones) if r.random() < 0.8 else {})
                  for n in nodes]
    now = 1_764_470_000.0
    plain = decide_views(nodes, seen, rules=rules, states={}, now=now)
    hosted = decide_views(with_hosts, seen, rules=rules, states={}, now=now)
    assert set(plain) == set(hosted)
    for name, view in hosted.items():
        assert view.error is None and view.decision is not None, (name, view.error)
        check_decision(view.decision, {}, bool(seen.get(name)) and view.judgement is not None, rules.safety)
        if view.judgement is None:
            continue
        before = plain[name].judgement.verdicts
        for dst, v in view.judgement.verdicts.items():
            assert v.health >= before[dst].health - 1e-12 and v.share_raw >= before[dst].share_raw - 1e-300
        assert set(view.judgement.held) <= {d for d, t in view.judgement.tallies.items() if t.quorum}
