"""Each safety rule on its own, table-driven: a cycle as the rules before it leave it,
then the rule under test (controller/safety.py `RULES`, docs/design.md "Safety rules")."""

from __future__ import annotations

import math

import pytest

from azprobe.contracts.stats import ZoneStats
from azprobe.contracts.weights import MAX_REASONS, MAX_STRING, MAX_ZONES, MIN_WEIGHT
from azprobe.controller.models import ZoneHealth, decay_weight
from azprobe.controller.safety import (
    RULES,
    Controls,
    Cycle,
    SafetyConfig,
    SafetyState,
    ZoneMemory,
    all_stale,
    anti_flap,
    assess_evidence,
    drain_dwell,
    max_drained,
    operator_freeze,
    operator_shift,
    output,
    panic,
    start_cycle,
    zones_in_play,
)

T0 = 1_764_470_000.0
CFG = SafetyConfig(degraded_below=0.90, drain_dwell_s=0.0, recover_dwell_s=0.0, panic_exit_s=0.0)
GOOD = ZoneStats(success=0.999, p95_ms=10.0, util=0.4, samples=1000)
NO_DATA = ZoneStats(samples=0)


def verdict(health: float) -> ZoneHealth:
    return ZoneHealth(health, decay_weight(health), math.exp(-12 * (1 - health)), (f"test health {health}",))


def memory(health: float = 1.0, *, good_ago: float | None = 1.0, degraded: bool = False,
           degraded_ago: float | None = None, recovering_ago: float | None = None) -> ZoneMemory:
    good_at = None if good_ago is None else T0 - good_ago
    return ZoneMemory(first_seen=T0 - max(1000.0, good_ago or 0.0), last_good_at=good_at, last_seen=good_at, health=health,
                      weight=decay_weight(health), share_raw=math.exp(-12 * (1 - health)), stats=GOOD,
                      degraded=degraded, degraded_since=None if degraded_ago is None else T0 - degraded_ago,
                      state="degraded" if degraded else "ok",
                      recovering_since=None if recovering_ago is None else T0 - recovering_ago)


def start(healths: dict[str, float | None], *, shares: dict[str, int] | None = None,
          memories: dict[str, ZoneMemory] | None = None, controls: Controls = Controls(),
          config: SafetyConfig = CFG, spikes: dict[str, bool] | None = None, in_panic: bool = False,
          panic_clear_ago: float | None = None, converging: bool = False) -> Cycle:
    """`healths[az] = None`: the AZ is in the input without evidence."""
    stats = {az: GOOD if h is not None else NO_DATA for az, h in healths.items()}
    verdicts = {az: verdict(h) for az, h in healths.items() if h is not None}
    state = SafetyState(shares=shares or {}, zones=memories or {}, last_decision_at=T0 - 1,
                        converging=converging, panic=in_panic,
                        panic_clear_since=None if panic_clear_ago is None else T0 - panic_clear_ago)
    cycle = start_cycle(stats, verdicts, now=T0, state=state, config=config, controls=controls, spikes=spikes)
    assert cycle is not None
    return cycle


def through(cycle: Cycle, rule) -> Cycle:
    """Run the rules before `rule` (as apply_safety does), then `rule` itself."""
    for r in RULES:
        if cycle.shares is None:
            r(cycle)
        if r is rule:
            return cycle
    raise AssertionError(f"{rule} is not in RULES")


def test_rules_run_in_the_documented_order():
    assert [r.__name__ for r in RULES] == ["operator_freeze", "operator_shift", "all_stale", "panic",
                                           "max_drained", "drain_dwell", "anti_flap"]


# ------------------------------------------------------------------ rule 0: zones in play

@pytest.mark.parametrize(("inputs", "remembered_ago", "expected"), [
    (["az-a", "az-b"], {}, ["az-a", "az-b"]),
    (["az-a"], {"az-b": 10.0}, ["az-a", "az-b"]),  # absent for a while: still in play
    (["az-a"], {"az-b": 3601.0}, ["az-a"]),  # absent > forget_after_s while az-a reports: dropped
    ([], {"az-b": 1e6}, ["az-b"]),  # nothing reports: never forget every zone
    ([f"z{i:03}" for i in range(120)], {}, [f"z{i:03}" for i in range(MAX_ZONES)]),  # the document's limit
])
def test_rule0_zones_in_play(inputs, remembered_ago, expected):
    memories = {az: memory(good_ago=ago) for az, ago in remembered_ago.items()}
    state = SafetyState(zones=memories)
    assert zones_in_play({az: GOOD for az in inputs}, state, T0, CFG) == expected


# ------------------------------------------------------------------- rule 1: evidence

SLOW_RECOVERY = SafetyConfig(degraded_below=0.90, recover_dwell_s=3.0)


@pytest.mark.parametrize(("stats", "health", "mem", "config", "fresh", "state", "degraded"), [
    (GOOD, 1.0, None, CFG, True, "ok", False),
    (GOOD, 0.80, None, CFG, True, "degraded", True),
    (ZoneStats(success=0.5, samples=3), 0.1, None, CFG, False, "stale", False),  # too few samples: neutral
    (ZoneStats(util=0.4, samples=500), 0.1, None, CFG, False, "stale", False),  # no usable signal
    (NO_DATA, None, memory(0.5, good_ago=5.0, degraded=True), CFG, False, "degraded", True),  # last-known-good
    (NO_DATA, None, memory(0.5, good_ago=30.0, degraded=True), CFG, False, "stale", True),  # held, but stale
    (NO_DATA, None, memory(0.5, good_ago=100.0, degraded=True), CFG, False, "stale", False),  # > equal_after_s
    (GOOD, 0.91, memory(0.5, degraded=True), SLOW_RECOVERY, True, "degraded", True),  # inside the recovery band
    (GOOD, 0.95, memory(0.5, degraded=True), SLOW_RECOVERY, True, "degraded", True),  # above it, dwell not over
    (GOOD, 0.95, memory(0.95, degraded=True, recovering_ago=3.0), SLOW_RECOVERY, True, "ok", False),
    (GOOD, float("nan"), None, CFG, False, "stale", False),  # a broken verdict is no evidence
])
def test_rule1_evidence(stats, health, mem, config, fresh, state, degraded):
    zone = assess_evidence("az-a", stats, None if health is None else verdict(health), mem, T0, config)
    assert (zone.fresh, zone.state, zone.degraded) == (fresh, state, degraded)
    if not fresh and not degraded:
        assert zone.raw == 1.0  # neutral: missing data never drains
    if degraded and not fresh:
        assert zone.raw == mem.share_raw  # the last-known-good verdict


def test_a_flapping_zone_waits_longer_each_time_it_comes_back_sick():
    """Degraded again within flap_window_s of recovering: the next recovery dwell grows by
    recover_dwell_s per flap in a row, up to max_recover_dwell_s; a zone that stayed ok for
    the whole window starts again from recover_dwell_s."""
    config = SafetyConfig(degraded_below=0.90, recover_dwell_s=3.0, flap_window_s=60.0, max_recover_dwell_s=7.0)
    sick, well = verdict(0.5), verdict(0.95)
    mem = ZoneMemory(first_seen=T0 - 1000.0)
    t, dwells = T0, []
    for _ in range(4):  # degrade, then stay well until the zone is ok again
        mem = assess_evidence("az-a", GOOD, sick, mem, t, config).memory
        assert mem.degraded
        went_well = t + 1.0
        t = went_well
        while True:
            mem = assess_evidence("az-a", GOOD, well, mem, t, config).memory
            if not mem.degraded:
                break
            t += 0.5
        dwells.append(t - went_well)
        t += 5.0  # back to sick 5 s later: a flap
    assert dwells == [3.0, 6.0, 7.0, 7.0]
    mem = assess_evidence("az-a", GOOD, sick, mem, t + 61.0, config).memory  # ok for longer than the window
    assert mem.flaps == 0


# -------------------------------------------------------------- rule 2: operator freeze

@pytest.mark.parametrize(("freeze", "healths", "last", "expected"), [
    (False, {"az-a": 1.0, "az-b": 0.5}, {"az-a": 70, "az-b": 30}, None),
    (True, {"az-a": 1.0, "az-b": 0.5}, {"az-a": 70, "az-b": 30}, {"az-a": 70, "az-b": 30}),
    (True, {"az-a": None, "az-b": None}, {"az-a": 70, "az-b": 30}, {"az-a": 70, "az-b": 30}),  # even without data
    (True, {"az-a": 1.0, "az-b": 1.0}, {}, {"az-a": 50, "az-b": 50}),  # nothing to hold: equal
    (True, {"az-a": 1.0, "az-b": 1.0}, {"az-a": 100}, {"az-a": 99, "az-b": 1}),  # a new zone gets the floor
])
def test_rule2_operator_freeze(freeze, healths, last, expected):
    c = through(start(healths, shares=last, controls=Controls(freeze=freeze)), operator_freeze)
    assert c.shares == expected
    if freeze:
        assert c.overall == "frozen" and {z.state for z in c.zones.values()} == {"frozen"}


# --------------------------------------------------------------- rule 3: operator shift

@pytest.mark.parametrize(("shifts", "expected"), [
    ({"az-b": T0 + 60}, ["az-b"]),
    ({"az-b": T0 - 1}, []),  # expired
    ({"az-b": float("nan")}, []),  # no valid expiry
    ({"az-x": T0 + 60}, []),  # not a zone in play
    ({"az-a": T0 + 60, "az-b": T0 + 60, "az-c": T0 + 60}, []),  # every zone: nowhere to send traffic
    ({"az-a": T0 + 60, "az-c": T0 + 60}, ["az-a", "az-c"]),
])
def test_rule3_operator_shift(shifts, expected):
    c = through(start({"az-a": 1.0, "az-b": 1.0, "az-c": 1.0}, controls=Controls(shifts=shifts)), operator_shift)
    assert c.shifted == expected
    assert c.draining == set(expected)
    assert sorted(az for az, z in c.zones.items() if z.floor and z.state == "shifted") == expected


# ------------------------------------------------------------------ rule 4: all stale

@pytest.mark.parametrize(("healths", "good_ago", "last", "shifts", "expected"), [
    ({"az-a": 1.0, "az-b": None}, 1.0, {"az-a": 60, "az-b": 40}, {}, None),  # one fresh zone: rule not taken
    ({"az-a": None, "az-b": None}, 5.0, {"az-a": 60, "az-b": 40}, {}, {"az-a": 60, "az-b": 40}),  # hold
    ({"az-a": None, "az-b": None}, 30.0, {"az-a": 60, "az-b": 40}, {}, {"az-a": 60, "az-b": 40}),  # hold, stale
    ({"az-a": None, "az-b": None}, 100.0, {"az-a": 60, "az-b": 40}, {}, {"az-a": 50, "az-b": 50}),  # equal
    ({"az-a": None, "az-b": None}, None, {}, {}, {"az-a": 50, "az-b": 50}),  # never any evidence
    ({"az-a": None, "az-b": None}, 5.0, {"az-a": 60, "az-b": 40}, {"az-b": T0 + 60}, None),  # a shift moves
])
def test_rule4_all_stale(healths, good_ago, last, shifts, expected):
    memories = {az: memory(good_ago=good_ago) for az in healths} if good_ago is not None else {}
    c = through(start(healths, shares=last, memories=memories, controls=Controls(shifts=shifts)), all_stale)
    assert c.shares == expected
    if expected is not None:
        assert c.overall == "stale"


# ------------------------------------------------------------------------ rule 5: panic

@pytest.mark.parametrize(("healths", "shifts", "in_panic", "clear_ago", "exit_s", "expected"), [
    ({"az-a": 0.5, "az-b": 0.6}, {}, False, None, 10.0, True),  # every fresh zone degraded
    ({"az-a": 0.5, "az-b": 1.0}, {}, False, None, 10.0, False),
    ({"az-a": 0.5, "az-b": None}, {}, False, None, 10.0, False),  # one fresh zone is not "every zone"
    ({"az-a": 1.0, "az-b": 0.5, "az-c": 0.6}, {"az-a": T0 + 60}, False, None, 10.0, True),  # shifted zones aside
    ({"az-a": 1.0, "az-b": 1.0}, {}, True, None, 10.0, True),  # just out of the condition: held
    ({"az-a": 1.0, "az-b": 1.0}, {}, True, 5.0, 10.0, True),
    ({"az-a": 1.0, "az-b": 1.0}, {}, True, 10.0, 10.0, False),  # out of it for panic_exit_s: over
])
def test_rule5_panic(healths, shifts, in_panic, clear_ago, exit_s, expected):
    config = SafetyConfig(degraded_below=0.90, drain_dwell_s=0.0, recover_dwell_s=0.0, panic_exit_s=exit_s)
    c = through(start(healths, controls=Controls(shifts=shifts), config=config, in_panic=in_panic,
                      panic_clear_ago=clear_ago), panic)
    assert c.panic is expected
    panicking = {az for az, z in c.zones.items() if z.state == "panic"}
    assert panicking == ({az for az in healths if az not in shifts} if expected else set())
    if expected and not all(c.zones[az].degraded for az in panicking):
        assert c.panic_clear_since is not None  # the exit timer runs


# ------------------------------------------------------------- rule 6: max drained zones

@pytest.mark.parametrize(("healths", "max_zones", "shifts", "slots", "held"), [
    ({"az-a": 1.0, "az-b": 0.5, "az-c": 0.6}, 1, {}, ["az-b"], ["az-c"]),  # the least healthy drains
    ({"az-a": 1.0, "az-b": 0.5, "az-c": 0.6}, 2, {}, ["az-b", "az-c"], []),
    ({"az-a": 1.0, "az-b": 0.5, "az-c": 0.6}, 0, {}, [], ["az-b", "az-c"]),
    ({"az-a": 1.0, "az-b": 0.5, "az-c": 1.0}, 1, {"az-c": T0 + 60}, [], ["az-b"]),  # a shift takes the slot
    ({"az-a": 1.0, "az-b": 1.0, "az-c": 1.0}, 1, {}, [], []),
])
def test_rule6_max_drained_zones(healths, max_zones, shifts, slots, held):
    config = SafetyConfig(degraded_below=0.90, drain_dwell_s=0.0, recover_dwell_s=0.0, panic_exit_s=0.0,
                          max_drained_zones=max_zones)
    c = through(start(healths, controls=Controls(shifts=shifts), config=config), max_drained)
    assert [z.name for z in c.drain_slots] == slots
    assert c.draining == set(slots) | set(shifts)
    for az in held:  # held at the best healthy zone's weight
        assert c.zones[az].raw == c.zones["az-a"].raw
        assert any("not drained" in r for r in c.zones[az].reasons)


# ------------------------------------------------------------------ rule 7: drain dwell

@pytest.mark.parametrize(("degraded_ago", "spike", "dwell_s", "held"), [
    (None, False, 2.0, True),  # degraded just now: wait
    (1.0, False, 2.0, True),
    (2.0, False, 2.0, False),  # dwelt long enough
    (1.95, False, 2.0, False),  # within timer_slack_s of the dwell: cycle jitter
    (None, True, 2.0, False),  # a failure spike skips the dwell
    (None, False, 0.0, False),
])
def test_rule7_drain_dwell(degraded_ago, spike, dwell_s, held):
    config = SafetyConfig(degraded_below=0.90, drain_dwell_s=dwell_s, recover_dwell_s=0.0, panic_exit_s=0.0)
    memories = {"az-b": memory(0.5, degraded=degraded_ago is not None, degraded_ago=degraded_ago)}
    c = through(start({"az-a": 1.0, "az-b": 0.5}, memories=memories, config=config, spikes={"az-b": spike}),
                drain_dwell)
    assert c.zones["az-b"].hold_share is held
    assert not c.zones["az-a"].hold_share


# ------------------------------------------------------------------- rule 8: anti-flap

CAPPED = SafetyConfig(degraded_below=0.90, drain_dwell_s=0.0, recover_dwell_s=0.0, panic_exit_s=0.0,
                      max_decrease_points=10.0, max_increase_points=5.0)


@pytest.mark.parametrize(("healths", "last", "config", "expected", "converging"), [
    ({"az-a": 1.0, "az-b": 0.86}, {}, CFG, {"az-a": 84, "az-b": 16}, False),  # first decision: the model's
    ({"az-a": 1.0, "az-b": 0.995}, {"az-a": 50, "az-b": 50}, CFG, {"az-a": 50, "az-b": 50}, False),  # hysteresis
    ({"az-a": 1.0, "az-b": 0.5}, {"az-a": 50, "az-b": 50}, CAPPED, {"az-a": 60, "az-b": 40}, True),  # drain step
    ({"az-a": 1.0, "az-b": 1.0}, {"az-a": 90, "az-b": 10}, CAPPED, {"az-a": 85, "az-b": 15}, True),  # slow recovery
    ({"az-a": 1.0, "az-b": 0.85}, {"az-a": 95, "az-b": 5}, CFG, {"az-a": 95, "az-b": 5}, False),  # no gain
    ({"az-a": 0.5, "az-b": 0.6}, {"az-a": 80, "az-b": 20}, CAPPED, {"az-a": 50, "az-b": 50}, False),  # panic
])
def test_rule8_anti_flap(healths, last, config, expected, converging):
    c = through(start(healths, shares=last, config=config), anti_flap)
    assert c.shares == expected
    assert c.converging is converging


# ---------------------------------------------------------------------- rule 9: output

@pytest.mark.parametrize(("states", "overall"), [
    ({"az-a": "ok", "az-b": "ok"}, "ok"),
    ({"az-a": "ok", "az-b": "degraded"}, "degraded"),
    ({"az-a": "ok", "az-b": "shifted"}, "degraded"),
    ({"az-a": "ok", "az-b": "stale"}, "ok"),  # a zone merely without data shows per zone
    ({"az-a": "stale", "az-b": "stale"}, "stale"),
])
def test_rule9_overall_state(states, overall):
    c = start({"az-a": 1.0, "az-b": 1.0})
    for az, s in states.items():
        c.zones[az].state = s
    c.settle({"az-a": 50, "az-b": 50})
    assert output(c).state == overall


@pytest.mark.parametrize(("reasons", "weight", "health"), [
    (["x" * 10_000], 1.0, 1.0),
    ([f"r{i}" for i in range(500)], 1.0, 1.0),
    ([], MIN_WEIGHT - 1e-12, -0.5),  # clipped into the contract's ranges
    ([], 1.5, 2.0),
])
def test_rule9_output_is_a_valid_document(reasons, weight, health):
    c = start({"az-a": 1.0, "az-b": 1.0})
    z = c.zones["az-b"]
    z.reasons, z.weight, z.health = reasons, weight, health
    c.settle({"az-a": 99, "az-b": 1})
    d = output(c)
    out = d.zones["az-b"]  # ZoneWeights validates itself on construction
    assert len(out.reasons) <= MAX_REASONS and all(len(r) <= MAX_STRING for r in out.reasons)
    assert MIN_WEIGHT <= out.weight <= 1.0 and 0.0 <= out.health <= 1.0
    assert d.shares == {"az-a": 99, "az-b": 1} and d.safety_state.shares == d.shares
