"""Safety rules between a model's verdict and the published shares (pure).

The incident azprobe exists to prevent: a stale snapshot returned empty data, every zone
looked dead, failures went from 0.2 % to 37 %. So the shares a model asks for pass
through these rules, in this order, every cycle (``apply_safety``):

0. **Zones**: every AZ in the input or remembered; one absent for ``forget_after_s``
   (default 1 h) while other AZs do report is dropped (never all of them). Operator
   controls (rules 3, 4) are applied before rule 2: an operator's hold or shift wins.
1. **Evidence**: a zone counts as *fresh* only with ``samples >= min_samples`` and a
   finite model health. A zone without fresh evidence keeps its last-known-good verdict;
   after ``stale_after_s`` its state is ``stale``; after ``equal_after_s`` (or if it never
   had evidence) it is treated as healthy (neutral weight -> equal share). Missing data
   never drains a zone.
2. **All stale**: no fresh zone at all -> hold the last shares exactly, then equal shares
   once the newest evidence is older than ``equal_after_s``. Overall state ``stale``.
3. **Operator freeze** (``control/freeze``): hold the last shares; state ``frozen``.
4. **Operator shift** (``control/shift/<az>`` until an expiry): drain that AZ to the floor
   (1 %) at once; state ``shifted``. Shifts use drain slots (rule 6).
5. **Panic**: at least two fresh zones and every fresh zone degraded -> spread evenly,
   at once; state ``panic`` on every zone (what Envoy's panic threshold does too: when
   everything looks bad, the measurement is the likelier culprit). Panic has hysteresis:
   it is entered at once but left only after the zones have been *out of* the panic
   condition for ``panic_exit_s`` (default 10 s); back in the condition restarts that
   timer. Why: in the all-zones drill (+200 ms, 5 % loss everywhere) one zone's noisy
   loss read healthy for a single cycle, panic ended, and the one allowed drain took
   another zone to 1-3 % -- the very incident this module exists to prevent. While
   panic holds, every zone not shifted by an operator has an equal share.
6. **Max drained zones**: at most ``max_drained_zones`` degraded zones drain at once,
   the least healthy first; the others are held at the best healthy zone's weight.
7. **Dwell**: a zone that just turned degraded keeps its share for ``drain_dwell_s``; a
   spike from the detector (``spikes[az]``) skips the dwell. Every timer here (drain
   dwell, recovery dwell, panic exit) counts as elapsed ``timer_slack_s`` (0.1 s) early:
   cycles are an interval apart only give or take the pull time, and a 1 s dwell at a
   1 s interval that read 0.998 s waited a whole extra cycle.
8. **Anti-flap**: hysteresis -- nothing moves unless some share would move by at least
   ``hysteresis_points`` (a capped move under way still finishes). Zone states use a band
   *and* a dwell: degraded below ``degraded_below`` (by default the model's own
   threshold); ok again only after the health has stayed at or above ``degraded_below +
   recovery_band`` for ``recover_dwell_s`` (default 3 s) -- until then the zone keeps its
   degraded verdict (weight and share), so a one-cycle blip in a sustained fault moves
   nothing (a drill once saw share 1 -> 11 -> 4 from one good reading). A zone being
   drained (degraded in a drain slot, or shifted) never gains share.
   Drain fast, recover slowly: a zone *below its fair share* (100/n) whose target is
   higher gains at most ``max_increase_points`` per cycle on its own recovery; any zone
   loses at most ``max_decrease_points`` per cycle. What draining zones give up goes to
   all the other zones in proportion to their targets (weights) -- a recovering zone gets
   its part on top of its capped step, so two equally healthy zones split a drain evenly
   and a drain never waits for a recovery cap (if only recovering zones are left to
   absorb, the cap yields for that cycle). The capped move is the target scaled into
   those bounds (``project_shares``: scaling keeps the free zones' ratios, so a share a
   capped zone cannot take is spread by weight, never handed back to a draining zone),
   and shares still sum to 100.
9. **Output**: integer shares, each >= 1, summing to exactly 100; never empty, zero or NaN.

The state carried between cycles is the immutable ``SafetyState`` returned inside every
``Decision``; pass it back in next cycle. Every zone carries human ``reasons``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from azprobe.config import Section
from azprobe.contracts.stats import ZoneStats
from azprobe.contracts.weights import MAX_INT, MAX_P95_MS, MAX_REASONS, MAX_WEIGHT, MIN_WEIGHT, TOTAL_SHARE, ZoneWeights
from azprobe.contracts.weights import MAX_STRING as MAX_REASON_CHARS
from azprobe.controller.models import ZoneHealth, decay_weight, equal_shares, fmt, shares_from_weights


@dataclass(frozen=True)
class SafetyConfig:
    """The [safety] table. Durations in seconds, shares in percentage points."""

    min_samples: int = 20
    stale_after_s: float = 10.0
    equal_after_s: float = 60.0
    max_drained_zones: int = 1
    degraded_below: float | None = None  # None: the model's own threshold (Policy fills it in)
    recovery_band: float = 0.03  # ok again only at degraded_below + recovery_band
    hysteresis_points: float = 3.0
    max_increase_points: float = 5.0
    max_decrease_points: float = 50.0
    drain_dwell_s: float = 2.0
    forget_after_s: float = 3600.0  # a zone with no data at all for this long leaves the document
    recover_dwell_s: float = 3.0  # a degraded zone stays above the recovery band this long before recovering
    panic_exit_s: float = 10.0  # panic ends only after this long out of the panic condition
    timer_slack_s: float = 0.1  # a dwell/exit timer counts as elapsed this much early (cycle jitter)

    @classmethod
    def from_section(cls, section: Section, *, reject_unknown: bool = True) -> "SafetyConfig":
        """Read [safety]; with reject_unknown=False the caller may read more keys (e.g. heartbeat_s)."""
        cfg = cls(
            min_samples=section.integer("min_samples", cls.min_samples, min=1, max=10**9),
            stale_after_s=section.number("stale_after_s", cls.stale_after_s, min=0.1, max=86400),
            equal_after_s=section.number("equal_after_s", cls.equal_after_s, min=0.1, max=86400),
            max_drained_zones=section.integer("max_drained_zones", cls.max_drained_zones, min=0, max=100),
            degraded_below=(section.number("degraded_below", 0.9, min=0.0, max=1.0)
                            if section.has("degraded_below") else None),
            recovery_band=section.number("recovery_band", cls.recovery_band, min=0.0, max=0.5),
            hysteresis_points=section.number("hysteresis_points", cls.hysteresis_points, min=0.0, max=50.0),
            max_increase_points=section.number("max_increase_points", cls.max_increase_points, min=0.5, max=100.0),
            max_decrease_points=section.number("max_decrease_points", cls.max_decrease_points, min=0.5, max=100.0),
            drain_dwell_s=section.number("drain_dwell_s", cls.drain_dwell_s, min=0.0, max=3600),
            forget_after_s=section.number("forget_after_s", cls.forget_after_s, min=1.0, max=10**7),
            recover_dwell_s=section.number("recover_dwell_s", cls.recover_dwell_s, min=0.0, max=3600),
            panic_exit_s=section.number("panic_exit_s", cls.panic_exit_s, min=0.0, max=3600),
            timer_slack_s=section.number("timer_slack_s", cls.timer_slack_s, min=0.0, max=10.0),
        )
        from azprobe.errors import ConfigError

        if cfg.equal_after_s < cfg.stale_after_s:
            raise ConfigError(section.field("equal_after_s"), f"{cfg.equal_after_s} is below stale_after_s "
                              f"{cfg.stale_after_s}", "equal shares come after holding last-known-good")
        if reject_unknown:
            section.reject_unknown()
        return cfg

    @property
    def degraded_threshold(self) -> float:
        return 0.90 if self.degraded_below is None else self.degraded_below

    @property
    def recover_above(self) -> float:
        return min(self.degraded_threshold + self.recovery_band, 1.0)


@dataclass(frozen=True)
class Controls:
    """Operator switches read from KV: control/freeze and control/shift/<az> (expiry, unix s)."""

    freeze: bool = False
    shifts: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ZoneMemory:
    """What safety remembers about one zone between cycles."""

    first_seen: float
    last_good_at: float | None = None
    last_seen: float | None = None  # last cycle the zone was in the input at all
    health: float = 1.0
    weight: float = 1.0
    share_raw: float = 1.0
    stats: ZoneStats = ZoneStats()
    degraded: bool = False
    degraded_since: float | None = None
    state: str = "ok"
    recovering_since: float | None = None  # degraded, but above the recovery band since then


@dataclass(frozen=True)
class SafetyState:
    """Carried from one cycle to the next. Treat as immutable; `apply_safety` returns a new one."""

    shares: Mapping[str, int] = field(default_factory=dict)
    zones: Mapping[str, ZoneMemory] = field(default_factory=dict)
    last_decision_at: float | None = None
    converging: bool = False  # the last shares were capped short of their target: keep moving
    panic: bool = False  # panic mode is on (entered, and not yet out of the condition for panic_exit_s)
    panic_clear_since: float | None = None  # in panic, but out of the panic condition since then


@dataclass(frozen=True)
class Decision:
    state: str  # overall: ok | degraded | panic | frozen | stale
    zones: Mapping[str, ZoneWeights]  # the weights document's zones, built here
    safety_state: SafetyState
    changed: bool  # shares differ from the previous decision's
    reasons: tuple[str, ...] = ()

    @property
    def publishable(self) -> bool:
        """False only when no AZ was ever seen: never publish an empty set."""
        return bool(self.zones)

    @property
    def shares(self) -> dict[str, int]:
        return {az: z.share for az, z in self.zones.items()}


# ---------------------------------------------------------------------- helpers


def _finite(value: Any) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _clip(value: float, lo: float, hi: float) -> float:
    return lo if value < lo else hi if value > hi else value


def _since(start: float | None, now: float) -> float:
    """A timer's start, restarted now if unset or in the future (the wall clock stepped back)."""
    return now if start is None or start > now else start


def _elapsed(start: float, now: float, period: float, cfg: SafetyConfig) -> bool:
    """Whether `period` has passed since `start`, give or take the cycle jitter.

    The daemon decides once per interval, but each cycle's clock reading lands a few ms
    (up to a slow pull) later or earlier than the last: without the slack a 1 s dwell at a
    1 s interval sometimes read 0.998 s and waited a whole extra cycle.
    """
    return now - start >= period - cfg.timer_slack_s


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _zone_weights(z: "_Zone", share: int) -> ZoneWeights:
    """One zone of the weights document, rounded to what a reader needs."""
    s = z.stats
    return ZoneWeights(
        # rounded, but never below the contract's floor e^-2 (round() could cross it)
        weight=_clip(round(_clip(z.weight, MIN_WEIGHT, MAX_WEIGHT), 9), MIN_WEIGHT, MAX_WEIGHT),
        share=share, health=round(_clip(z.health, 0.0, 1.0), 6), success=_round(s.success, 6),
        p95_ms=_round(s.p95_ms, 3), util=_round(s.util, 4), samples=s.samples, state=z.state,
        reasons=tuple(r[:MAX_REASON_CHARS] for r in z.reasons[-MAX_REASONS:]))


def _clean_stats(s: ZoneStats) -> ZoneStats:
    """Stats safe to publish: NaN/inf -> None, rates clipped, samples a non-negative int."""
    success = _finite(s.success)
    p95 = _finite(s.p95_ms)
    util = _finite(s.util)
    samples = s.samples if isinstance(s.samples, int) and not isinstance(s.samples, bool) else 0
    return ZoneStats(
        success=None if success is None else _clip(success, 0.0, 1.0),
        p95_ms=None if p95 is None else _clip(p95, 0.0, MAX_P95_MS),
        util=None if util is None else _clip(util, 0.0, 1.0),
        syn_retrans_per_conn=max(_finite(s.syn_retrans_per_conn) or 0.0, 0.0),
        rto_per_conn=max(_finite(s.rto_per_conn) or 0.0, 0.0),
        samples=min(max(samples, 0), MAX_INT),  # beyond 2^53 a JSON reader loses precision
    )


def project_shares(target: Mapping[str, float], lo: Mapping[str, float], hi: Mapping[str, float]) -> dict[str, float]:
    """The point clip(k * target, lo, hi) summing to 100 (bisection on log k).

    Scaling, not shifting: the zones free to move keep the ratios of their targets, so
    what a capped zone cannot take goes to the others in proportion to their weights (an
    additive shift gave every zone the same points -- a draining zone with a target of
    ~0 got as many as a healthy one). Needs sum(lo) <= 100 <= sum(hi), which holds when
    lo <= last <= hi and the last shares sum to 100; targets >= 0.
    """
    names = list(target)

    def total(log_k: float) -> float:
        k = math.exp(log_k)
        return math.fsum(_clip(target[a] * k, lo[a], hi[a]) for a in names)

    a, b = -745.0, 709.0  # k from the smallest positive float to near the largest
    for _ in range(90):  # 1454 / 2^90: far below the rounding to whole points
        mid = (a + b) / 2
        if total(mid) < TOTAL_SHARE:
            a = mid
        else:
            b = mid
    k = math.exp(b)
    return {n: _clip(target[n] * k, lo[n], hi[n]) for n in names}


# ---------------------------------------------------------------------- the rules


@dataclass
class _Zone:
    """Working view of one zone during a cycle."""

    name: str
    memory: ZoneMemory
    fresh: bool
    raw: float
    health: float
    weight: float
    stats: ZoneStats
    degraded: bool
    state: str
    reasons: list[str]
    hold_share: bool = False  # dwell: do not decrease this cycle
    floor: bool = False  # operator shift: drain to the floor at once


def _assess(az: str, stats: ZoneStats | None, verdict: ZoneHealth | None, mem: ZoneMemory | None,
            now: float, cfg: SafetyConfig) -> _Zone:
    """Rule 1: fresh evidence, last-known-good, or neutral; plus the degraded band."""
    mem = mem or ZoneMemory(first_seen=now)
    last_seen = now if stats is not None else mem.last_seen
    health = _finite(verdict.health) if verdict is not None else None
    raw = _finite(verdict.share_raw) if verdict is not None else None
    fresh = (stats is not None and health is not None and raw is not None and raw > 0
             and stats.is_evidence(cfg.min_samples))
    if fresh:
        assert verdict is not None and stats is not None and health is not None and raw is not None
        health = _clip(health, 0.0, 1.0)
        weight = _finite(verdict.weight)
        weight = _clip(weight, MIN_WEIGHT, MAX_WEIGHT) if weight is not None else decay_weight(health)
        clean = _clean_stats(stats)
        reasons = list(verdict.reasons)
        recovering_since = None
        if not mem.degraded:
            degraded = health < cfg.degraded_threshold
            reasons.append(f"health {health:.3f} < {cfg.degraded_threshold:.2f}: degraded" if degraded
                           else f"health {health:.3f} >= {cfg.degraded_threshold:.2f}: ok")
        elif health < cfg.recover_above:
            degraded = True
            reasons.append(f"health {health:.3f} < {cfg.recover_above:.2f} (recovery band): degraded")
        else:
            # Recovery hysteresis: above the band for recover_dwell_s first. Until then the
            # zone keeps its degraded verdict (weight, share_raw), so a one-cycle blip in the
            # middle of a fault moves no share.
            recovering_since = _since(mem.recovering_since, now)
            degraded = not _elapsed(recovering_since, now, cfg.recover_dwell_s, cfg)
            if degraded:
                raw, weight = min(raw, mem.share_raw), min(weight, mem.weight)
                reasons.append(f"health {health:.3f} >= {cfg.recover_above:.2f} for {fmt(now - recovering_since)} s"
                               f" < recover_dwell {cfg.recover_dwell_s:g} s: still degraded, verdict held")
            else:
                recovering_since = None
                reasons.append(f"health {health:.3f} >= {cfg.recover_above:.2f} for recover_dwell"
                               f" {cfg.recover_dwell_s:g} s: ok, recovering")
        since = _since(mem.degraded_since if mem.degraded else None, now) if degraded else None
        memory = ZoneMemory(first_seen=mem.first_seen, last_good_at=now, last_seen=now, health=health, weight=weight,
                            share_raw=raw, stats=clean, degraded=degraded, degraded_since=since,
                            state="degraded" if degraded else "ok", recovering_since=recovering_since)
        return _Zone(az, memory, True, raw, health, weight, clean, degraded, memory.state, reasons)

    samples = stats.samples if stats is not None and isinstance(stats.samples, int) else 0
    why = "no data" if stats is None else f"{samples} samples < min {cfg.min_samples}" \
        if samples < cfg.min_samples else "no usable signal"
    if mem.last_good_at is not None:
        age = now - mem.last_good_at
        if age <= cfg.equal_after_s:
            state = "stale" if age > cfg.stale_after_s else mem.state
            reasons = [f"{why}: holding last-known-good from {fmt(age)} s ago (health {mem.health:.3f})"]
            if state == "stale":
                reasons.append(f"evidence older than stale_after_s {cfg.stale_after_s:g} s: stale")
            memory = replace(mem, state=state, last_seen=last_seen)
            return _Zone(az, memory, False, mem.share_raw, mem.health, mem.weight, mem.stats,
                         mem.degraded, state, reasons)
        reasons = [f"{why}: last evidence {fmt(age)} s ago > equal_after_s {cfg.equal_after_s:g} s: treated as healthy"]
    else:
        reasons = [f"{why}: no evidence yet, treated as healthy (never drain on missing data)"]
    memory = replace(mem, degraded=False, degraded_since=None, recovering_since=None, state="stale", share_raw=1.0,
                     last_seen=last_seen)
    return _Zone(az, memory, False, 1.0, mem.health, mem.weight, mem.stats, False, "stale", reasons)


def apply_safety(
    stats: Mapping[str, ZoneStats],
    health: Mapping[str, ZoneHealth],
    *,
    now: float,
    state: SafetyState,
    config: SafetyConfig,
    controls: Controls = Controls(),
    spikes: Mapping[str, bool] | None = None,
) -> Decision:
    """One cycle of the rules (module docstring) -> Decision with the next SafetyState.

    `stats`: this cycle's evidence per destination AZ (any AZ may be missing).
    `health`: the model's verdict for (at least) the AZs with evidence.
    `spikes`: per AZ, whether the spike detector flags it now (cuts the drain dwell).
    """
    spikes = spikes or {}
    cfg = config
    remembered = set(state.zones) | set(state.shares)
    if stats:  # forget only while other zones report: never drop to an empty set
        remembered = {az for az in remembered if not _forgotten(state.zones.get(az), now, cfg)}
    names = sorted(set(stats) | remembered)
    if not names:
        return Decision("stale", {}, replace(state, last_decision_at=now), False,
                        ("no AZ seen yet: nothing to publish",))
    if len(names) > TOTAL_SHARE:
        names = names[:TOTAL_SHARE]  # cannot give >100 zones >= 1 % each; keep a stable subset
    zones = {az: _assess(az, stats.get(az), health.get(az), state.zones.get(az), now, cfg) for az in names}
    last = {az: state.shares[az] for az in names if az in state.shares}
    have_last = set(last) == set(names) and sum(last.values()) == TOTAL_SHARE
    overall_reasons: list[str] = []
    fresh = [z for z in zones.values() if z.fresh]

    def finish(shares: Mapping[str, int], overall: str, converging: bool = False,
               panic: tuple[bool, float | None] = (state.panic, state.panic_clear_since)) -> Decision:
        out = {az: _zone_weights(zones[az], int(shares[az])) for az in names}
        memories = {}
        for az in names:
            z = zones[az]
            # the display state survives short gaps; panic/frozen/shifted are re-derived each cycle
            keep = z.state in ("ok", "degraded", "stale")
            memories[az] = z.memory if not keep or z.memory.state == z.state else replace(z.memory, state=z.state)
        new_state = SafetyState(shares=dict(shares), zones=memories, last_decision_at=now, converging=converging,
                                panic=panic[0], panic_clear_since=panic[1])
        changed = dict(shares) != dict(state.shares)
        return Decision(overall, out, new_state, changed, tuple(overall_reasons))

    # Rule 3 (checked first: an operator's explicit hold wins): operator freeze.
    if controls.freeze:
        overall_reasons.append("operator freeze (control/freeze): shares held")
        for z in zones.values():
            z.state = "frozen"
            z.reasons.append("frozen by operator: share held")
        held = {az: float(last.get(az, 0)) for az in names} if last else {az: 1.0 for az in names}
        return finish(shares_from_weights(held) if sum(held.values()) > 0 else equal_shares(names), "frozen")

    # Rule 4 (before rule 2: honoured even without data): operator shifts; expired ones are ignored.
    shifted = sorted(az for az, until in controls.shifts.items()
                     if az in zones and _finite(until) is not None and until > now)
    if shifted and len(shifted) == len(names):
        overall_reasons.append("every zone is shifted: ignoring shifts (nowhere to send traffic)")
        shifted = []
    for az in shifted:
        z = zones[az]
        z.floor, z.state = True, "shifted"
        z.reasons.append(f"operator shift (control/shift/{az}) until {fmt(controls.shifts[az], 0)}: drained to the floor")

    # Rule 2: nothing fresh anywhere -> hold, then equal (unless an operator shift moves things).
    if not fresh and not shifted:
        goods = [z.memory.last_good_at for z in zones.values() if z.memory.last_good_at is not None]
        age = now - max(goods) if goods else math.inf
        for z in zones.values():
            if age > cfg.stale_after_s or not goods:
                z.state = "stale"
        if have_last and age <= cfg.equal_after_s:
            overall_reasons.append(f"no fresh evidence from any zone for {fmt(age)} s: holding last-known-good shares")
            for z in zones.values():
                z.reasons.append("share held: no zone has fresh evidence")
            shares = dict(last)
        else:
            overall_reasons.append("no fresh evidence from any zone" +
                                   (f" for {fmt(age)} s > equal_after_s {cfg.equal_after_s:g} s" if goods else "") +
                                   ": equal shares")
            for z in zones.values():
                z.reasons.append("equal share: no zone has fresh evidence")
            shares = equal_shares(names)
        return finish(shares, "stale")

    # Rule 5: panic, with hysteresis: entered at once, left only after panic_exit_s out of
    # the condition (one zone reading healthy for a cycle must not start a drain).
    live = [z for z in fresh if not z.floor]
    all_degraded = len(live) >= 2 and all(z.degraded for z in live)
    panic, panic_clear_since = all_degraded, None
    if all_degraded:
        overall_reasons.append(f"all {len(live)} zones with fresh evidence are degraded: panic, spreading evenly")
    elif state.panic:
        panic_clear_since = _since(state.panic_clear_since, now)
        out_for = now - panic_clear_since
        if _elapsed(panic_clear_since, now, cfg.panic_exit_s, cfg):
            overall_reasons.append(f"panic over: out of the panic condition for {fmt(out_for)} s"
                                   f" >= panic_exit_s {cfg.panic_exit_s:g} s")
            panic_clear_since = None
        else:
            panic = True
            overall_reasons.append(f"panic held: out of the panic condition for {fmt(out_for)} s"
                                   f" < panic_exit_s {cfg.panic_exit_s:g} s, still spreading evenly")
    if panic:
        for z in zones.values():
            if not z.floor:
                z.state = "panic"
                z.raw = 1.0
                z.reasons.append("panic: every zone degraded together, equal share")
    # Zones being drained: operator shifts, and the degraded zones rules 6-7 let drain. Their
    # share never rises (recovery starts only once they count as recovered), and what they
    # give up goes to the others.
    draining: set[str] = {az for az, z in zones.items() if z.floor}
    if not panic:
        # Rule 6: at most max_drained_zones drained; operator shifts use slots first.
        candidates = sorted((z for z in zones.values() if z.degraded and not z.floor), key=lambda z: (z.health, z.name))
        slots = max(cfg.max_drained_zones - len(shifted), 0)
        if len(candidates) > slots:
            healthy = [z.raw for z in zones.values() if not z.degraded and not z.floor]
            held_raw = max(healthy) if healthy else 1.0
            drained = [z.name for z in candidates[:slots]]
            for z in candidates[slots:]:
                z.raw = max(z.raw, held_raw)
                z.reasons.append(f"not drained: max_drained_zones {cfg.max_drained_zones} in use"
                                 f" ({', '.join(drained + shifted) or 'none allowed'})")
        # Rule 7: dwell before a fresh degradation drains (a spike skips it).
        for z in candidates[:slots]:
            since = z.memory.degraded_since
            if since is not None and spikes.get(z.name):
                z.reasons.append("failure spike detected: drain dwell skipped")
            elif since is not None and not _elapsed(since, now, cfg.drain_dwell_s, cfg):
                z.hold_share = True
                z.reasons.append(f"drain pending: degraded for {fmt(now - since)} s < dwell {cfg.drain_dwell_s:g} s")
            draining.add(z.name)

    # Targets from the (adjusted) raw weights; shifted zones get nothing.
    raws = {az: (0.0 if z.floor else max(z.raw, 1e-300)) for az, z in zones.items()}
    total = math.fsum(raws.values())
    target = {az: TOTAL_SHARE * r / total for az, r in raws.items()} if total > 0 else \
        {az: TOTAL_SHARE / len(names) for az in names}

    converging = False
    if not have_last:
        overall_reasons.append("first decision for this zone set: no step caps")
        shares = shares_from_weights(target)
    elif panic:
        shares = shares_from_weights(target)
    else:
        # A zone still being drained never gains share, even when its (partial) health
        # would give it more: its target is pinned at its share and the others rescaled.
        # Pinned here, before the hysteresis check, so that the capped move does not look
        # forever unfinished (which would let every small move of the others through).
        pinned = {az: float(last[az]) for az in draining if not zones[az].floor and target[az] > last[az]}
        others = math.fsum(target[az] for az in names if az not in pinned)
        if pinned and others > 0:
            rest = (TOTAL_SHARE - math.fsum(pinned.values())) / others
            target = {az: pinned[az] if az in pinned else target[az] * rest for az in names}
            for az in pinned:
                zones[az].reasons.append("still degraded: share not raised until it recovers")
        moves = [abs(target[az] - last[az]) for az in names if not zones[az].hold_share]
        # hysteresis holds new small moves, not the last steps of a capped move under way
        if (not moves or max(moves) < cfg.hysteresis_points) and not state.converging \
                and not shifted_changed(shifted, last):
            overall_reasons.append(f"every move < hysteresis {cfg.hysteresis_points:g} points: shares held")
            shares = dict(last)
        else:
            fair = TOTAL_SHARE / len(names)
            lo: dict[str, float] = {}
            hi: dict[str, float] = {}
            for az, z in zones.items():
                prev = float(last[az])
                lo[az] = 0.0 if z.floor else prev if z.hold_share else max(prev - cfg.max_decrease_points, 0.0)
                hi[az] = 0.0 if z.floor else float(TOTAL_SHARE)  # a floor of 0: rounding lifts it to 1 %
                if az in draining:
                    # never more than its target (what it gives up goes to the others, never
                    # back to it) and never more than it had
                    hi[az] = min(max(target[az], lo[az]), prev, hi[az])
                if not z.floor and not z.hold_share and target[az] < lo[az]:
                    z.reasons.append(f"draining: at most -{cfg.max_decrease_points:g} points per cycle"
                                     f" (target {target[az]:.1f})")
            # The points the draining zones give up this cycle, shared by everyone else in
            # proportion to their targets (weights) -- a recovering zone included: its cap
            # limits its *own* recovery, not its part in absorbing a drain.
            freed = math.fsum(max(float(last[az]) - hi[az], 0.0) for az in draining)
            absorbing = math.fsum(target[az] for az in names if az not in draining)
            for az, z in zones.items():
                prev = float(last[az])
                recovering = target[az] > prev and prev < fair - cfg.hysteresis_points and az not in draining
                if not recovering:
                    continue
                part = freed * target[az] / absorbing if absorbing > 0 and not z.degraded else 0.0
                hi[az] = prev + cfg.max_increase_points + part
                if target[az] > hi[az]:
                    z.reasons.append(f"recovering slowly: +{cfg.max_increase_points:g} points per cycle"
                                     + (f" (+{part:.1f} of the drained share)" if part >= 0.05 else "")
                                     + f" (target {target[az]:.1f})")
            if math.fsum(hi.values()) < TOTAL_SHARE:
                # Everyone left is recovering (e.g. an operator shift of the only big zone):
                # the traffic has to go somewhere, so the recovery cap yields this cycle.
                overall_reasons.append("recovery caps lifted: no zone at fair share can absorb the move")
                hi = {az: hi[az] if zones[az].floor or az in draining else float(TOTAL_SHARE) for az in names}
                if math.fsum(hi.values()) < TOTAL_SHARE:  # only draining zones left besides shifts
                    hi = {az: 0.0 if zones[az].floor else float(TOTAL_SHARE) for az in names}
            shares = shares_from_weights(project_shares(target, lo, hi))
            converging = shares != shares_from_weights(target)
    overall = "panic" if panic else _overall(zones)
    return finish(shares, overall, converging, (panic, panic_clear_since))


def _forgotten(mem: ZoneMemory | None, now: float, cfg: SafetyConfig) -> bool:
    """A zone absent from the input for forget_after_s (e.g. a decommissioned AZ)."""
    if mem is None:
        return False
    seen = max(t for t in (mem.first_seen, mem.last_good_at, mem.last_seen) if t is not None)
    return now - seen > cfg.forget_after_s


def shifted_changed(shifted: list[str], last: Mapping[str, int]) -> bool:
    """A shifted zone not yet at the floor must move even inside the hysteresis band."""
    return any(last.get(az, 1) > 1 for az in shifted)


def _overall(zones: Mapping[str, _Zone]) -> str:
    states = {z.state for z in zones.values()}
    if states == {"stale"}:
        return "stale"
    # a zone merely without data (e.g. no traffic towards it) is shown per zone, not overall
    if states & {"degraded", "shifted"}:
        return "degraded"
    return "ok"
