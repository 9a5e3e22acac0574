"""Each safety rule on its own, with fixed model verdicts (the models are tested apart)."""

from __future__ import annotations

import math
import random

import pytest

from azprobe.config import Section
from azprobe.errors import ConfigError
from azprobe.contracts.stats import ZoneStats
from azprobe.contracts.weights import MIN_WEIGHT, ZoneWeights
from azprobe.controller.models import DEGRADED_BELOW, DefaultModel, ZoneHealth, decay_weight
from azprobe.controller.decide import GLOBAL_VIEW, DecisionRules, decide_views
from azprobe.controller.quorum import NodeEvidence
from azprobe.controller.safety import (
    Controls,
    SafetyConfig,
    SafetyState,
    apply_safety,
    project_shares,
)

T0 = 1_764_470_000.0
# Each rule on its own: the timers of the other rules (drain dwell, recovery dwell, panic
# exit) are off here unless a test is about them.
CFG = SafetyConfig(degraded_below=0.90, drain_dwell_s=0.0, recover_dwell_s=0.0, panic_exit_s=0.0)
GOOD = ZoneStats(success=0.999, p95_ms=10.0, util=0.4, samples=1000)


def verdict(health: float, raw: float | None = None) -> ZoneHealth:
    # share_raw as the default model makes it: weight ** 6
    return ZoneHealth(health, decay_weight(health), raw if raw is not None else math.exp(-12 * (1 - health)),
                      (f"test health {health}",))


class SafetyDriver:
    """Drives apply_safety cycle after cycle, carrying the state like the daemon does."""

    def __init__(self, config: SafetyConfig = CFG, now: float = T0) -> None:
        self.config = config
        self.now = now
        self.state = SafetyState()
        self.last = None

    def run(self, healths: dict[str, float | None], *, dt: float = 1.0, stats: dict | None = None,
            controls: Controls = Controls(), spikes: dict | None = None, raws: dict | None = None):
        """`healths[az] = None` means the AZ is in the input but without evidence (0 samples)."""
        self.now += dt
        if stats is None:
            stats = {az: (GOOD if h is not None else ZoneStats(samples=0)) for az, h in healths.items()}
        verdicts = {az: verdict(h, (raws or {}).get(az)) for az, h in healths.items() if h is not None}
        self.last = apply_safety(stats, verdicts, now=self.now, state=self.state, config=self.config,
                                 controls=controls, spikes=spikes)
        self.state = self.last.safety_state
        check_invariants(self.last)
        return self.last


def check_invariants(decision) -> None:
    shares = decision.shares
    if decision.zones:
        assert sum(shares.values()) == 100
        assert all(isinstance(s, int) and s >= 1 for s in shares.values())
    for z in decision.zones.values():
        ZoneWeights(**z.to_json())  # the weights contract's own validator


HEALTHY3 = {"az-a": 1.0, "az-b": 1.0, "az-c": 1.0}


def test_first_decision_follows_the_model():
    d = SafetyDriver().run({"az-a": 1.0, "az-b": 0.86})
    assert d.shares == {"az-a": 84, "az-b": 16}
    assert d.zones["az-b"].state == "degraded" and d.zones["az-a"].state == "ok"
    assert d.state == "degraded"
    assert d.changed


# ---------------------------------------------------------------- missing / stale data


def test_missing_zone_holds_last_known_good_then_stale_then_equal():
    c = SafetyDriver(SafetyConfig(degraded_below=0.9, stale_after_s=10, equal_after_s=60, drain_dwell_s=0))
    c.run({"az-a": 1.0, "az-b": 1.0, "az-c": 0.80})
    held = c.run({"az-a": 1.0, "az-b": 1.0}, dt=1)  # az-c vanished from the input
    assert held.zones["az-c"].share <= 10  # still drained: its last verdict holds
    assert held.zones["az-c"].state == "degraded"
    assert "holding last-known-good" in held.zones["az-c"].reasons[0]
    stale = c.run({"az-a": 1.0, "az-b": 1.0}, dt=10)  # 11 s since evidence
    assert stale.zones["az-c"].state == "stale"
    assert stale.zones["az-c"].share == held.zones["az-c"].share
    assert stale.state == "ok"  # one zone without data is shown per zone, not as overall trouble
    equal = c.run({"az-a": 1.0, "az-b": 1.0}, dt=50)  # 61 s: treated as healthy
    assert equal.zones["az-c"].state == "stale"
    assert "treated as healthy" in equal.zones["az-c"].reasons[0]
    # recovering from the drain is still slow (+5 points per cycle)
    assert equal.zones["az-c"].share - stale.zones["az-c"].share <= 5


def test_all_zones_without_evidence_hold_shares_then_equal():
    """The incident: the data source returns empty stats for every zone."""
    c = SafetyDriver(SafetyConfig(degraded_below=0.9, stale_after_s=10, equal_after_s=60, drain_dwell_s=0))
    before = c.run({"az-a": 1.0, "az-b": 1.0, "az-c": 0.80}).shares
    empty = {"az-a": None, "az-b": None, "az-c": None}
    d = c.run(empty, dt=2)
    assert d.shares == before and d.state == "stale"
    assert d.zones["az-a"].state == "ok"  # a 2 s gap is not yet "stale"
    d = c.run(empty, dt=10)
    assert d.shares == before
    assert {z.state for z in d.zones.values()} == {"stale"}
    assert "holding last-known-good shares" in d.reasons[0]
    d = c.run(empty, dt=50)
    assert d.shares == {"az-a": 34, "az-b": 33, "az-c": 33}
    assert d.state == "stale" and "equal shares" in d.reasons[0]


def test_no_input_at_all_is_the_same_as_empty_stats():
    c = SafetyDriver(SafetyConfig(degraded_below=0.9, stale_after_s=10, equal_after_s=60))
    before = c.run({"az-a": 1.0, "az-b": 0.5}).shares
    assert c.run({}, dt=5).shares == before
    assert c.run({}, dt=60).shares == {"az-a": 50, "az-b": 50}


def test_zones_without_any_evidence_ever_get_equal_shares_not_drained():
    d = SafetyDriver().run({"az-a": None, "az-b": None})
    assert d.shares == {"az-a": 50, "az-b": 50}
    assert d.state == "stale"
    assert d.publishable


def test_nothing_ever_seen_is_not_publishable():
    d = SafetyDriver().run({})
    assert not d.publishable and d.zones == {}


def test_too_few_samples_is_not_evidence():
    c = SafetyDriver()
    c.run({"az-a": 1.0, "az-b": 1.0})
    thin = {"az-a": GOOD, "az-b": ZoneStats(success=0.0, p95_ms=900.0, samples=3)}
    d = c.run({"az-a": 1.0, "az-b": 0.0}, stats=thin)
    assert d.shares == {"az-a": 50, "az-b": 50}
    assert "3 samples < min 20" in d.zones["az-b"].reasons[0]


def test_nan_verdict_is_not_evidence():
    c = SafetyDriver()
    c.run({"az-a": 1.0, "az-b": 1.0})
    d = c.run({"az-a": 1.0, "az-b": float("nan")})
    assert d.shares == {"az-a": 50, "az-b": 50}
    assert all(math.isfinite(z.health) for z in d.zones.values())


def test_forgotten_after_a_long_absence():
    c = SafetyDriver(SafetyConfig(degraded_below=0.9, forget_after_s=100))
    c.run({"az-a": 1.0, "az-b": 1.0, "old": 1.0})
    assert "old" in c.run({"az-a": 1.0, "az-b": 1.0}, dt=50).zones
    d = c.run({"az-a": 1.0, "az-b": 1.0}, dt=60)
    assert set(d.zones) == {"az-a", "az-b"}


# ---------------------------------------------------------------- drain fast, recover slowly


def test_drain_fast_recover_slowly():
    c = SafetyDriver()
    assert c.run(HEALTHY3).shares == {"az-a": 34, "az-b": 33, "az-c": 33}
    sick = c.run({**HEALTHY3, "az-c": 0.5})
    assert sick.zones["az-c"].share == 1  # one cycle: the whole way (33 < 50-point cap)
    assert sick.zones["az-c"].state == "degraded"
    shares = [sick.zones["az-c"].share]
    recovering = c.run(HEALTHY3)
    assert any("recovering slowly" in r for r in recovering.zones["az-c"].reasons)
    shares.append(recovering.zones["az-c"].share)
    for _ in range(9):
        shares.append(c.run(HEALTHY3).zones["az-c"].share)
    steps = [b - a for a, b in zip(shares, shares[1:])]
    assert all(0 <= s <= 5 for s in steps), shares
    assert shares[:4] == [1, 6, 11, 16]
    assert shares[-1] == 33  # back to equal within ~7 cycles


def test_decrease_cap_per_cycle():
    c = SafetyDriver(SafetyConfig(degraded_below=0.9, drain_dwell_s=0, max_decrease_points=10))
    c.run({"az-a": 1.0, "az-b": 1.0})
    d = c.run({"az-a": 1.0, "az-b": 0.3})
    assert d.zones["az-b"].share == 40
    assert any("at most -10" in r for r in d.zones["az-b"].reasons)
    assert c.run({"az-a": 1.0, "az-b": 0.3}).zones["az-b"].share == 30


def test_hysteresis_band_holds_small_moves():
    c = SafetyDriver()
    c.run({"az-a": 1.0, "az-b": 1.0})
    d = c.run({"az-a": 1.0, "az-b": 0.95}, raws={"az-b": 0.9})  # target 52.6 / 47.4: < 3 points
    assert d.shares == {"az-a": 50, "az-b": 50} and not d.changed
    assert "hysteresis" in d.reasons[0]
    d = c.run({"az-a": 1.0, "az-b": 0.95}, raws={"az-b": 0.8})  # 55.6 / 44.4: moves
    assert d.shares == {"az-a": 56, "az-b": 44} and d.changed


def test_degraded_state_has_a_recovery_band():
    c = SafetyDriver(SafetyConfig(degraded_below=0.90, recovery_band=0.03, drain_dwell_s=0, recover_dwell_s=0))
    assert c.run({"az-a": 1.0, "az-b": 0.89}).zones["az-b"].state == "degraded"
    assert c.run({"az-a": 1.0, "az-b": 0.91}).zones["az-b"].state == "degraded"  # inside the band
    assert c.run({"az-a": 1.0, "az-b": 0.935}).zones["az-b"].state == "ok"
    assert c.run({"az-a": 1.0, "az-b": 0.91}).zones["az-b"].state == "ok"  # not degraded until < 0.90


# ---------------------------------------------------------------- dwell and spikes


def test_dwell_delays_a_drain_and_a_spike_cuts_it():
    cfg = SafetyConfig(degraded_below=0.9, drain_dwell_s=2.0)
    c = SafetyDriver(cfg)
    c.run(HEALTHY3)
    d = c.run({**HEALTHY3, "az-c": 0.5})
    assert d.zones["az-c"].share == 33 and d.zones["az-c"].state == "degraded"
    assert any("drain pending" in r for r in d.zones["az-c"].reasons)
    assert c.run({**HEALTHY3, "az-c": 0.5}).zones["az-c"].share == 33  # 1 s < 2 s
    assert c.run({**HEALTHY3, "az-c": 0.5}).zones["az-c"].share == 1  # 2 s: drained

    c = SafetyDriver(cfg)
    c.run(HEALTHY3)
    d = c.run({**HEALTHY3, "az-c": 0.5}, spikes={"az-c": True})
    assert d.zones["az-c"].share == 1
    assert any("spike" in r for r in d.zones["az-c"].reasons)


# ---------------------------------------------------------------- panic


def test_panic_when_every_zone_degrades_together():
    c = SafetyDriver()
    c.run({"az-a": 1.0, "az-b": 1.0, "az-c": 0.5})
    d = c.run({"az-a": 0.6, "az-b": 0.7, "az-c": 0.5})
    assert d.state == "panic"
    assert d.shares == {"az-a": 34, "az-b": 33, "az-c": 33}  # at once, not +5 per cycle
    assert {z.state for z in d.zones.values()} == {"panic"}
    back = c.run({"az-a": 1.0, "az-b": 1.0, "az-c": 0.5})
    assert back.state == "degraded" and back.zones["az-c"].share == 1


def test_no_panic_with_a_single_fresh_zone():
    d = SafetyDriver().run({"az-a": 0.2, "az-b": None})
    assert d.state != "panic"


# ---------------------------------------------------------------- max drained zones


def test_at_most_max_drained_zones_drain():
    c = SafetyDriver()
    c.run({"az-a": 1.0, "az-b": 1.0, "az-c": 1.0, "az-d": 1.0})
    d = c.run({"az-a": 1.0, "az-b": 1.0, "az-c": 0.5, "az-d": 0.7})
    assert d.zones["az-c"].share == 1  # the least healthy drains
    assert d.zones["az-d"].share >= 32  # held at the healthy zones' level
    assert d.zones["az-d"].state == "degraded"
    assert any("max_drained_zones 1 in use (az-c)" in r for r in d.zones["az-d"].reasons)


def test_max_drained_zones_two():
    c = SafetyDriver(SafetyConfig(degraded_below=0.9, drain_dwell_s=0, max_drained_zones=2))
    c.run({"az-a": 1.0, "az-b": 1.0, "az-c": 1.0, "az-d": 1.0})
    d = c.run({"az-a": 1.0, "az-b": 1.0, "az-c": 0.5, "az-d": 0.7})
    assert d.zones["az-c"].share == 1 and d.zones["az-d"].share <= 10


# ---------------------------------------------------------------- operator controls


def test_freeze_holds_shares_whatever_the_model_says():
    c = SafetyDriver()
    before = c.run(HEALTHY3).shares
    d = c.run({**HEALTHY3, "az-a": 0.1}, controls=Controls(freeze=True))
    assert d.shares == before and d.state == "frozen"
    assert {z.state for z in d.zones.values()} == {"frozen"}
    assert d.zones["az-a"].health == pytest.approx(0.1)  # the evidence is still shown
    # freeze also wins over "no data at all"
    assert c.run({}, dt=120, controls=Controls(freeze=True)).shares == before
    after = c.run({**HEALTHY3, "az-a": 0.1})
    assert after.zones["az-a"].share == 1


def test_shift_drains_to_the_floor_until_expiry():
    c = SafetyDriver()
    c.run(HEALTHY3)
    shift = Controls(shifts={"az-b": c.now + 10})
    d = c.run(HEALTHY3, controls=shift)
    assert d.zones["az-b"].share == 1 and d.zones["az-b"].state == "shifted"
    assert d.state == "degraded"
    assert any("operator shift" in r for r in d.zones["az-b"].reasons)
    d = c.run(HEALTHY3, controls=shift, dt=20)  # expired
    assert d.zones["az-b"].state == "ok"
    assert d.zones["az-b"].share == 6  # recovers slowly like any drain


def test_shift_uses_the_drain_slot():
    c = SafetyDriver()
    c.run(HEALTHY3)
    d = c.run({**HEALTHY3, "az-c": 0.5}, controls=Controls(shifts={"az-a": c.now + 100}))
    assert d.zones["az-a"].share == 1
    assert d.zones["az-c"].share >= 45  # not drained: the operator's shift took the only slot


def test_shifting_every_zone_is_ignored():
    c = SafetyDriver()
    d = c.run({"az-a": 1.0, "az-b": 1.0}, controls=Controls(shifts={"az-a": T0 + 100, "az-b": T0 + 100}))
    assert d.shares == {"az-a": 50, "az-b": 50}
    assert "every zone is shifted" in d.reasons[0]


def test_shift_of_an_unknown_az_is_ignored():
    d = SafetyDriver().run({"az-a": 1.0, "az-b": 1.0}, controls=Controls(shifts={"az-x": T0 + 100}))
    assert d.shares == {"az-a": 50, "az-b": 50}


# ---------------------------------------------------------------- plumbing


def test_state_is_carried_not_mutated():
    c = SafetyDriver()
    first = c.run(HEALTHY3)
    snapshot = dict(first.safety_state.shares)
    c.run({**HEALTHY3, "az-c": 0.1})
    assert dict(first.safety_state.shares) == snapshot


def test_weight_never_below_the_contract_floor():
    d = SafetyDriver().run({"az-a": 1.0, "az-b": 0.0})
    assert d.zones["az-b"].to_json()["weight"] >= MIN_WEIGHT


def test_project_shares_respects_bounds_and_sum():
    out = project_shares({"a": 90.0, "b": 5.0, "c": 5.0}, {"a": 0, "b": 0, "c": 0}, {"a": 40, "b": 100, "c": 100})
    assert out["a"] == pytest.approx(40) and out["b"] == pytest.approx(30) and out["c"] == pytest.approx(30)
    assert sum(out.values()) == pytest.approx(100)


def test_config_from_section():
    cfg = SafetyConfig.from_section(Section({"min_samples": 50, "equal_after_s": 30, "stale_after_s": 5}, "safety"))
    assert cfg.min_samples == 50 and cfg.degraded_below is None and cfg.degraded_threshold == DEGRADED_BELOW
    with pytest.raises(ConfigError) as err:
        SafetyConfig.from_section(Section({"stale_after_s": 100, "equal_after_s": 60}, "safety"))
    assert err.value.field == "safety.equal_after_s"
    with pytest.raises(ConfigError) as err:
        SafetyConfig.from_section(Section({"max_drained": 2}, "safety"))
    assert err.value.field == "safety.max_drained"


def test_never_forgets_every_zone():
    c = SafetyDriver(SafetyConfig(degraded_below=0.9, forget_after_s=100))
    c.run({"az-a": 1.0, "az-b": 0.5})
    d = c.run({}, dt=5000)
    assert d.publishable and d.shares == {"az-a": 50, "az-b": 50} and d.state == "stale"


def test_shift_is_honoured_even_without_fresh_data():
    c = SafetyDriver()
    c.run(HEALTHY3)
    d = c.run({}, dt=5, controls=Controls(shifts={"az-a": T0 + 1000}))
    assert d.zones["az-a"].share == 1 and d.zones["az-a"].state == "shifted"
    assert d.zones["az-b"].share + d.zones["az-c"].share == 99


# ---------------------------------------------------------------- drill regressions (e2e)


def _all_zones_fault(rng: random.Random) -> dict[str, ZoneStats]:
    """One cycle of the all-zones drill: every zone +200 ms and (noisy) 5 % loss."""
    return {az: ZoneStats(1 - rng.uniform(0.02, 0.08), 204 + rng.uniform(0, 10), rng.uniform(0.3, 0.4),
                          rng.uniform(0.0, 0.08), rng.uniform(0.0, 0.05), 3000) for az in ("az-a", "az-b", "az-c")}


class FleetDriver:
    """The daemon's decision (controller/decide.py) cycle after cycle for a fleet of one
    node per AZ that all report the same figures; the global view's decision."""

    def __init__(self, rules: DecisionRules) -> None:
        self.rules = rules
        self.states: dict[str, SafetyState] = {}

    def run(self, zones: dict[str, ZoneStats], now: float):
        nodes = [NodeEvidence(f"node-{az}", az, zones) for az in zones]
        views = decide_views(nodes, {GLOBAL_VIEW: zones}, rules=self.rules, states=self.states, now=now)
        self.states = {name: v.decision.safety_state for name, v in views.items()}
        return views[GLOBAL_VIEW].decision


def test_all_zones_drill_is_panic_throughout_not_a_drain():
    """The `all-zones` drill through the whole decision (default model, quorum, rules). It
    used to leave panic as soon as one zone's noisy loss read low for a cycle (latency no
    longer counted: the baseline had followed every zone up), and then drain another zone."""
    rng = random.Random(42)
    fleet = FleetDriver(DecisionRules(DefaultModel()))
    now = T0
    healthy = {az: ZoneStats(0.9995, 10.0 + i, 0.35, 0.001, 0.0, 3000) for i, az in enumerate(("az-a", "az-b", "az-c"))}
    for _ in range(3):
        now += 1.0
        d = fleet.run(healthy, now)
    assert d.state == "ok"
    for cycle in range(15):
        now += 1.0
        zones = _all_zones_fault(rng)
        if cycle == 5:  # the noisy cycle: az-b reads no loss at all and the lowest P95
            zones["az-b"] = ZoneStats(1.0, 203.0, 0.35, 0.0, 0.0, 3000)
        d = fleet.run(zones, now)
        check_invariants(d)
        assert d.state == "panic", (cycle, d.reasons, {az: z.reasons for az, z in d.zones.items()})
        assert {z.state for z in d.zones.values()} == {"panic"}
        assert all(33 <= s <= 34 for s in d.shares.values()), (cycle, d.shares)
    # the fault clears: panic holds (even spread) while the zones prove themselves, then ok,
    # and at no point is a zone drained
    states = []
    for _ in range(30):  # panic_exit_s, then recover_dwell_s
        now += 1.0
        d = fleet.run(healthy, now)
        states.append(d.state)
        assert all(33 <= s <= 34 for s in d.shares.values()), d.shares
    assert states[0] == "panic" and states[-1] == "ok"


def test_panic_holds_until_out_of_the_condition_for_panic_exit_s():
    """A single good cycle from one zone must not end panic (recovery dwell off here, to
    test the panic hysteresis on its own)."""
    c = SafetyDriver(SafetyConfig(degraded_below=0.9, drain_dwell_s=0, recover_dwell_s=0, panic_exit_s=10))
    c.run(HEALTHY3)
    sick = {"az-a": 0.6, "az-b": 0.7, "az-c": 0.5}
    assert c.run(sick).state == "panic"
    blip = c.run({**sick, "az-a": 1.0})  # one zone reads healthy for one cycle
    assert blip.state == "panic" and {z.state for z in blip.zones.values()} == {"panic"}
    assert blip.shares == {"az-a": 34, "az-b": 33, "az-c": 33}
    assert any("panic held" in r for r in blip.reasons)
    c.run(sick)  # back in the condition: the exit timer starts over
    out_since = c.now + 1.0
    while c.now + 1.0 < out_since + 10.0 - 0.5:  # az-a and az-b healthy, az-c still sick
        d = c.run({"az-a": 1.0, "az-b": 1.0, "az-c": 0.5})
        assert d.state == "panic", c.now - out_since
        assert min(d.shares.values()) >= 33  # nobody below the equal share while panic holds
    d = c.run({"az-a": 1.0, "az-b": 1.0, "az-c": 0.5})  # 10 s out of the condition: over
    assert d.state == "degraded" and d.zones["az-c"].share == 1
    assert any("panic over" in r for r in d.reasons)


def test_panic_exit_zero_leaves_panic_at_once():
    c = SafetyDriver()  # panic_exit_s = 0
    c.run(HEALTHY3)
    c.run({"az-a": 0.6, "az-b": 0.7, "az-c": 0.5})
    assert c.run({"az-a": 1.0, "az-b": 1.0, "az-c": 0.5}).state == "degraded"


def test_recovery_waits_for_recover_dwell_and_a_blip_moves_nothing():
    """A zone under a sustained fault read healthy for one cycle and was set back to ok
    (share 1 -> 11 -> 4). It must stay above the recovery band for recover_dwell_s first."""
    c = SafetyDriver(SafetyConfig(degraded_below=0.9, recovery_band=0.03, drain_dwell_s=0, recover_dwell_s=3.0))
    c.run(HEALTHY3)
    assert c.run({**HEALTHY3, "az-c": 0.5}).zones["az-c"].share == 1
    blip = c.run(HEALTHY3)  # one healthy cycle in the middle of the fault
    assert blip.zones["az-c"].share == 1 and blip.zones["az-c"].state == "degraded"
    assert any("recover_dwell 3 s" in r for r in blip.zones["az-c"].reasons)
    assert c.run({**HEALTHY3, "az-c": 0.5}).zones["az-c"].share == 1
    assert c.run({**HEALTHY3, "az-c": 0.92}).zones["az-c"].share == 1  # inside the band: no timer
    shares = [c.run(HEALTHY3).zones["az-c"].share for _ in range(6)]  # the fault really is over
    assert shares == [1, 1, 1, 6, 11, 16]  # 3 s above the band, then the capped step
    assert c.last.zones["az-c"].state == "ok"


def test_drain_dwell_tolerates_cycle_jitter():
    """A 1 s dwell at a 1 s interval took two cycles: the second cycle came 0.998 s after
    the first (pull time jitter) and 0.998 < 1.0 held the drain for another cycle."""
    c = SafetyDriver(SafetyConfig(degraded_below=0.9, drain_dwell_s=1.0))
    c.run(HEALTHY3)
    assert c.run({**HEALTHY3, "az-c": 0.5}, dt=1.003).zones["az-c"].share == 33  # dwell starts
    assert c.run({**HEALTHY3, "az-c": 0.5}, dt=0.998).zones["az-c"].share == 1
    c = SafetyDriver(SafetyConfig(degraded_below=0.9, drain_dwell_s=1.0))  # the slack stays small
    c.run(HEALTHY3)
    c.run({**HEALTHY3, "az-c": 0.5})
    assert c.run({**HEALTHY3, "az-c": 0.5}, dt=0.85).zones["az-c"].share == 33


def test_drained_share_goes_to_the_others_in_proportion_to_their_weights():
    """Seen in a drill: az-a 34 / az-c 65 while az-b drained. az-a sat just below the fair
    share (slightly less healthy), counted as 'recovering', was capped at +5, and the rest
    was spread additively -- over az-c *and* the draining az-b."""
    c = SafetyDriver()
    steady = {"az-a": 0.975, "az-b": 1.0, "az-c": 1.0}
    for _ in range(3):
        before = c.run(steady).shares
    assert before["az-a"] < 30
    d = c.run({**steady, "az-b": 0.5})
    ratio = math.exp(-12 * 0.025)  # share_raw(az-a) / share_raw(az-c)
    assert d.shares["az-b"] == 1
    assert abs(d.shares["az-a"] - 99 * ratio / (1 + ratio)) <= 1, d.shares
    # equally healthy zones split a drain evenly
    c = SafetyDriver()
    c.run(HEALTHY3)
    assert c.run({**HEALTHY3, "az-b": 0.5}).shares == {"az-a": 50, "az-b": 1, "az-c": 49}


def test_a_recovering_zone_takes_its_part_of_a_drain_on_top_of_its_step():
    c = SafetyDriver()
    c.run(HEALTHY3)
    c.run({**HEALTHY3, "az-a": 0.5})  # az-a drained
    for _ in range(3):
        c.run(HEALTHY3)  # ... and recovering: 6, 11, 16
    before = c.last.shares
    assert before["az-a"] == 16
    d = c.run({**HEALTHY3, "az-b": 0.5})
    assert d.shares["az-b"] == 1  # the drain is not slowed by az-a's recovery cap
    # az-a: +5 of its own recovery + half of what az-b gave up (equal weights with az-c)
    assert abs(d.shares["az-a"] - (before["az-a"] + 5 + (before["az-b"] - 1) / 2)) <= 1, (before, d.shares)
    assert abs(c.run({**HEALTHY3, "az-b": 0.5}).shares["az-a"] - 49.5) <= 1  # next cycle: even


def test_timer_config_from_section():
    cfg = SafetyConfig.from_section(Section({"recover_dwell_s": 5, "panic_exit_s": 20, "timer_slack_s": 0.2},
                                            "safety"))
    assert (cfg.recover_dwell_s, cfg.panic_exit_s, cfg.timer_slack_s) == (5.0, 20.0, 0.2)
    default = SafetyConfig()
    assert (default.recover_dwell_s, default.panic_exit_s, default.timer_slack_s) == (10.0, 10.0, 0.1)
    for key in ("recover_dwell_s", "panic_exit_s", "timer_slack_s"):
        with pytest.raises(ConfigError) as err:
            SafetyConfig.from_section(Section({key: -1}, "safety"))
        assert err.value.field == f"safety.{key}"
