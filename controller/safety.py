"""Safety rules between a model's verdict and the published shares (pure).

Every cycle the model's verdicts pass through these rules, in this order
(``apply_safety``; why each exists: docs/design.md "Safety rules"):

0. zones in play: input or remembered, forgotten after ``forget_after_s`` of absence
1. evidence: fresh, else last-known-good, else neutral; the degraded band and recovery dwell
2. operator freeze (``control/freeze``): hold the last shares
3. operator shift (``control/shift/<az>``): drain that AZ to the floor
4. all stale: no fresh zone -> hold, then equal shares
5. panic: every fresh zone degraded -> equal shares, left only after ``panic_exit_s``
6. max drained zones: at most ``max_drained_zones`` drain, the least healthy first
7. drain dwell: a fresh degradation waits ``drain_dwell_s`` (a spike skips it)
8. anti-flap: hysteresis, a draining zone never gains, drain fast and recover slowly
9. output: integer shares, each >= 1, summing to 100; never empty, zero or NaN

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
from azprobe.contracts.weights import (MAX_INT, MAX_P95_MS, MAX_REASONS, MAX_WEIGHT, MAX_ZONES, MIN_WEIGHT, TOTAL_SHARE,
                                      ZoneWeights)
from azprobe.contracts.weights import MAX_STRING as MAX_REASON_CHARS
from azprobe.controller.models import DEGRADED_BELOW, ZoneHealth, decay_weight, equal_shares, fmt, shares_from_weights


@dataclass(frozen=True)
class SafetyConfig:
    """The [safety] table. Durations in seconds, shares in percentage points."""

    min_samples: int = 20
    stale_after_s: float = 10.0
    equal_after_s: float = 60.0
    max_drained_zones: int = 1
    degraded_below: float | None = None  # None: the model's own threshold (decide.DecisionRules fills it in)
    recovery_band: float = 0.03  # ok again only at degraded_below + recovery_band
    hysteresis_points: float = 3.0
    max_increase_points: float = 5.0
    max_decrease_points: float = 50.0
    # One cycle of confirmation (a dwell of exactly one 1 s cycle would lose a second cycle
    # to timing jitter): the quorum of nodes and min_samples already keep noise out, and
    # every second here is a second users spend on the sick zone (bench/loop.py --config shipped).
    drain_dwell_s: float = 0.5
    forget_after_s: float = 3600.0  # a zone with no data at all for this long leaves the document
    # A degraded zone stays above the recovery band this long before recovering: longer
    # than a flapping switch's quiet spell (bench/soak.py's 5 s), so it is not let back in
    # only to hurt users again at the next flap. Recovery is not the urgent direction.
    recover_dwell_s: float = 10.0
    # A zone degraded again within flap_window_s of recovering is flapping: each flap in a
    # row adds recover_dwell_s to its next recovery dwell, up to max_recover_dwell_s (never
    # below recover_dwell_s itself).
    flap_window_s: float = 60.0
    max_recover_dwell_s: float = 60.0
    panic_exit_s: float = 10.0  # panic ends only after this long out of the panic condition
    timer_slack_s: float = 0.1  # a dwell/exit timer counts as elapsed this much early (cycle jitter)

    @classmethod
    def from_section(cls, section: Section, *, reject_unknown: bool = True) -> "SafetyConfig":
        """Read [safety]; with reject_unknown=False the caller may read more keys (e.g. heartbeat_s)."""
        default = cls()
        cfg = cls(
            min_samples=section.integer("min_samples", default.min_samples, min=1, max=10**9),
            stale_after_s=section.number("stale_after_s", default.stale_after_s, min=0.1, max=86400),
            equal_after_s=section.number("equal_after_s", default.equal_after_s, min=0.1, max=86400),
            max_drained_zones=section.integer("max_drained_zones", default.max_drained_zones, min=0, max=MAX_ZONES),
            degraded_below=(section.number("degraded_below", DEGRADED_BELOW, min=0.0, max=1.0)
                            if section.has("degraded_below") else None),
            recovery_band=section.number("recovery_band", default.recovery_band, min=0.0, max=0.5),
            hysteresis_points=section.number("hysteresis_points", default.hysteresis_points, min=0.0, max=50.0),
            max_increase_points=section.number("max_increase_points", default.max_increase_points, min=0.5, max=100.0),
            max_decrease_points=section.number("max_decrease_points", default.max_decrease_points, min=0.5, max=100.0),
            drain_dwell_s=section.number("drain_dwell_s", default.drain_dwell_s, min=0.0, max=3600),
            forget_after_s=section.number("forget_after_s", default.forget_after_s, min=1.0, max=10**7),
            recover_dwell_s=section.number("recover_dwell_s", default.recover_dwell_s, min=0.0, max=3600),
            flap_window_s=section.number("flap_window_s", default.flap_window_s, min=0.0, max=86400),
            max_recover_dwell_s=section.number("max_recover_dwell_s", default.max_recover_dwell_s, min=0.0, max=3600),
            panic_exit_s=section.number("panic_exit_s", default.panic_exit_s, min=0.0, max=3600),
            timer_slack_s=section.number("timer_slack_s", default.timer_slack_s, min=0.0, max=10.0),
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
        return DEGRADED_BELOW if self.degraded_below is None else self.degraded_below

    @property
    def recover_above(self) -> float:
        return min(self.degraded_threshold + self.recovery_band, 1.0)


@dataclass(frozen=True)
class HostPin:
    """control/host/<addr>: the operator says this host is healthy until `until` (unix s)."""

    addr: str  # canonical text
    until: float
    reason: str = ""


@dataclass(frozen=True)
class Controls:
    """Operator switches read from KV: control/freeze and control/shift/<az> (expiry, unix
    s), which the safety rules take; control/host/<addr> and control/hosts-off, which the
    host judgement takes (controller/hosts.py `host_controls`)."""

    freeze: bool = False
    shifts: Mapping[str, float] = field(default_factory=dict)
    host_pins: Mapping[str, HostPin] = field(default_factory=dict)  # addr -> pin
    hosts_off: bool = False
    hosts_off_reason: str = ""


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
    recovered_at: float | None = None  # when it last went from degraded to ok
    flaps: int = 0  # degradations in a row, each within flap_window_s of the recovery before it


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


def _zone_weights(z: WorkingZone, share: int) -> ZoneWeights:
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


# ---------------------------------------------------------------------- one cycle


@dataclass
class WorkingZone:
    """One zone during a cycle: rule 1's verdict, which the later rules adjust."""

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

    @classmethod
    def from_memory(cls, az: str, memory: ZoneMemory, *, fresh: bool, reasons: list[str]) -> WorkingZone:
        """Rule 1's verdict is the zone's new memory: the working values start as its copy."""
        return cls(name=az, memory=memory, fresh=fresh, raw=memory.share_raw, health=memory.health,
                   weight=memory.weight, stats=memory.stats, degraded=memory.degraded, state=memory.state,
                   reasons=reasons)


@dataclass
class Cycle:
    """One cycle's working state, handed through the rules in order (`RULES`).

    A rule that settles the shares (freeze, all stale, anti-flap) sets `shares`; the
    rules after it are skipped and `output` turns the cycle into a `Decision`.
    """

    now: float
    cfg: SafetyConfig
    state: SafetyState  # the previous cycle's
    controls: Controls
    spikes: Mapping[str, bool]
    names: list[str]  # the zones in play (rule 0), sorted
    zones: dict[str, WorkingZone] = field(default_factory=dict)  # rule 1's verdicts, adjusted by the rules after it
    last: dict[str, int] = field(default_factory=dict)  # the previous shares of the zones in play
    reasons: list[str] = field(default_factory=list)  # the document's overall reasons
    shifted: list[str] = field(default_factory=list)  # zones an operator shift drains (rule 3)
    draining: set[str] = field(default_factory=set)  # shifted zones and the degraded zones allowed to drain
    drain_slots: list[WorkingZone] = field(default_factory=list)  # the degraded zones rule 6 lets drain
    panic: bool = False
    panic_clear_since: float | None = None
    shares: dict[str, int] | None = None
    overall: str | None = None  # None: derived from the zone states by `output`
    converging: bool = False

    @property
    def fresh(self) -> list[WorkingZone]:
        return [z for z in self.zones.values() if z.fresh]

    @property
    def have_last(self) -> bool:
        """The previous shares cover exactly these zones (else there is nothing to step from)."""
        return set(self.last) == set(self.names) and sum(self.last.values()) == TOTAL_SHARE

    def settle(self, shares: Mapping[str, int], overall: str | None = None, converging: bool = False) -> None:
        self.shares, self.overall, self.converging = dict(shares), overall, converging


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
    """One cycle of the rules, in order (docs/design.md "Safety rules") -> Decision with
    the next SafetyState.

    `stats`: this cycle's evidence per destination AZ (any AZ may be missing).
    `health`: the model's verdict for (at least) the AZs with evidence.
    `spikes`: per AZ, whether the spike detector flags it now (cuts the drain dwell).
    """
    cycle = start_cycle(stats, health, now=now, state=state, config=config, controls=controls, spikes=spikes)
    if cycle is None:
        return Decision("stale", {}, replace(state, last_decision_at=now), False,
                        ("no AZ seen yet: nothing to publish",))
    for rule in RULES:
        if cycle.shares is None:
            rule(cycle)
    return output(cycle)


def start_cycle(stats: Mapping[str, ZoneStats], health: Mapping[str, ZoneHealth], *, now: float,
                state: SafetyState, config: SafetyConfig, controls: Controls = Controls(),
                spikes: Mapping[str, bool] | None = None) -> Cycle | None:
    """Rules 0 and 1: the zones in play and each one's verdict. None when no AZ was ever seen."""
    names = zones_in_play(stats, state, now, config)
    if not names:
        return None
    cycle = Cycle(now=now, cfg=config, state=state, controls=controls, spikes=spikes or {}, names=names,
                  last={az: state.shares[az] for az in names if az in state.shares},
                  panic=state.panic, panic_clear_since=state.panic_clear_since)
    cycle.zones = {az: assess_evidence(az, stats.get(az), health.get(az), state.zones.get(az), now, config)
                   for az in names}
    return cycle


# ---------------------------------------------------------------------- the rules


def zones_in_play(stats: Mapping[str, ZoneStats], state: SafetyState, now: float, cfg: SafetyConfig) -> list[str]:
    """Rule 0: every AZ in the input or remembered; one absent for forget_after_s while
    others report is dropped (never all of them). At most MAX_ZONES, the weights
    document's limit (the first in sorted order: a stable subset)."""
    remembered = set(state.zones) | set(state.shares)
    if stats:  # forget only while other zones report: never drop to an empty set
        remembered = {az for az in remembered if not _forgotten(state.zones.get(az), now, cfg)}
    names = sorted(set(stats) | remembered)
    return names[:MAX_ZONES]


def assess_evidence(az: str, stats: ZoneStats | None, verdict: ZoneHealth | None, mem: ZoneMemory | None,
                    now: float, cfg: SafetyConfig) -> WorkingZone:
    """Rule 1: fresh evidence, last-known-good, or neutral (missing data never drains);
    plus the degraded band and the recovery dwell."""
    mem = mem or ZoneMemory(first_seen=now)
    health = _finite(verdict.health) if verdict is not None else None
    raw = _finite(verdict.share_raw) if verdict is not None else None
    if (stats is not None and verdict is not None and health is not None and raw is not None and raw > 0
            and stats.is_evidence(cfg.min_samples)):
        return _fresh_verdict(az, stats, verdict, health, raw, mem, now, cfg)
    return _without_evidence(az, stats, mem, now, cfg)


def _fresh_verdict(az: str, stats: ZoneStats, verdict: ZoneHealth, health: float, raw: float, mem: ZoneMemory,
                   now: float, cfg: SafetyConfig) -> WorkingZone:
    """The model's verdict, with the degraded band: degraded below degraded_below, ok
    again only above degraded_below + recovery_band for recover_dwell_s."""
    health = _clip(health, 0.0, 1.0)
    weight = _finite(verdict.weight)
    weight = _clip(weight, MIN_WEIGHT, MAX_WEIGHT) if weight is not None else decay_weight(health)
    clean = _clean_stats(stats)
    reasons = list(verdict.reasons)
    recovering_since, recovered_at, flaps = None, mem.recovered_at, mem.flaps
    if not mem.degraded:
        degraded = health < cfg.degraded_threshold
        reasons.append(f"health {health:.3f} < {cfg.degraded_threshold:.2f}: degraded" if degraded
                       else f"health {health:.3f} >= {cfg.degraded_threshold:.2f}: ok")
        if degraded:
            flapped = recovered_at is not None and now - recovered_at < cfg.flap_window_s
            flaps = flaps + 1 if flapped else 0
    elif health < cfg.recover_above:
        degraded = True
        reasons.append(f"health {health:.3f} < {cfg.recover_above:.2f} (recovery band): degraded")
    else:
        # Until the dwell is over the zone keeps its degraded verdict (weight, share_raw),
        # so a one-cycle blip in the middle of a fault moves no share.
        recovering_since = _since(mem.recovering_since, now)
        dwell = recover_dwell(cfg, flaps)
        dwell_text = f"recover_dwell {dwell:g} s" + (f" ({flaps} flap(s) in a row)" if flaps else "")
        degraded = not _elapsed(recovering_since, now, dwell, cfg)
        if degraded:
            raw, weight = min(raw, mem.share_raw), min(weight, mem.weight)
            reasons.append(f"health {health:.3f} >= {cfg.recover_above:.2f} for {fmt(now - recovering_since)} s"
                           f" < {dwell_text}: still degraded, verdict held")
        else:
            recovering_since, recovered_at = None, now
            reasons.append(f"health {health:.3f} >= {cfg.recover_above:.2f} for {dwell_text}: ok, recovering")
    since = _since(mem.degraded_since if mem.degraded else None, now) if degraded else None
    memory = ZoneMemory(first_seen=mem.first_seen, last_good_at=now, last_seen=now, health=health, weight=weight,
                        share_raw=raw, stats=clean, degraded=degraded, degraded_since=since,
                        state="degraded" if degraded else "ok", recovering_since=recovering_since,
                        recovered_at=recovered_at, flaps=flaps)
    return WorkingZone.from_memory(az, memory, fresh=True, reasons=reasons)


def recover_dwell(cfg: SafetyConfig, flaps: int) -> float:
    """How long a degraded zone must stay above the recovery band: recover_dwell_s, plus
    as much again per flap in a row (as Envoy's outlier ejection time grows with each
    ejection), so a flapping switch's zone stays drained instead of oscillating."""
    return min(cfg.recover_dwell_s * (1 + flaps), max(cfg.max_recover_dwell_s, cfg.recover_dwell_s))


def _without_evidence(az: str, stats: ZoneStats | None, mem: ZoneMemory, now: float, cfg: SafetyConfig) -> WorkingZone:
    """Last-known-good up to equal_after_s (stale after stale_after_s), then neutral."""
    last_seen = now if stats is not None else mem.last_seen
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
            return WorkingZone.from_memory(az, memory, fresh=False, reasons=reasons)
        reasons = [f"{why}: last evidence {fmt(age)} s ago > equal_after_s {cfg.equal_after_s:g} s: treated as healthy"]
    else:
        reasons = [f"{why}: no evidence yet, treated as healthy (never drain on missing data)"]
    memory = replace(mem, degraded=False, degraded_since=None, recovering_since=None, state="stale", share_raw=1.0,
                     last_seen=last_seen)
    return WorkingZone.from_memory(az, memory, fresh=False, reasons=reasons)


def operator_freeze(c: Cycle) -> None:
    """Rule 2: control/freeze holds the last shares (an operator's explicit hold wins)."""
    if not c.controls.freeze:
        return
    c.reasons.append("operator freeze (control/freeze): shares held")
    for z in c.zones.values():
        z.state = "frozen"
        z.reasons.append("frozen by operator: share held")
    held = {az: float(c.last.get(az, 0)) for az in c.names} if c.last else {az: 1.0 for az in c.names}
    c.settle(shares_from_weights(held) if sum(held.values()) > 0 else equal_shares(c.names), "frozen")


def operator_shift(c: Cycle) -> None:
    """Rule 3: control/shift/<az> drains that AZ to the floor at once, even without data;
    expired shifts are ignored, and so are shifts of every zone (nowhere to go)."""
    shifted = sorted(az for az, until in c.controls.shifts.items()
                     if az in c.zones and _finite(until) is not None and until > c.now)
    if shifted and len(shifted) == len(c.names):
        c.reasons.append("every zone is shifted: ignoring shifts (nowhere to send traffic)")
        shifted = []
    for az in shifted:
        z = c.zones[az]
        z.floor, z.state = True, "shifted"
        z.reasons.append(f"operator shift (control/shift/{az}) until {fmt(c.controls.shifts[az], 0)}: drained to the floor")
    c.shifted = shifted
    c.draining = set(shifted)


def all_stale(c: Cycle) -> None:
    """Rule 4: no fresh zone at all -> hold the last shares, then equal shares once the
    newest evidence is older than equal_after_s (unless an operator shift moves things)."""
    if c.fresh or c.shifted:
        return
    cfg = c.cfg
    goods = [z.memory.last_good_at for z in c.zones.values() if z.memory.last_good_at is not None]
    age = c.now - max(goods) if goods else math.inf
    for z in c.zones.values():
        if age > cfg.stale_after_s or not goods:
            z.state = "stale"
    if c.have_last and age <= cfg.equal_after_s:
        c.reasons.append(f"no fresh evidence from any zone for {fmt(age)} s: holding last-known-good shares")
        for z in c.zones.values():
            z.reasons.append("share held: no zone has fresh evidence")
        c.settle(c.last, "stale")
        return
    c.reasons.append("no fresh evidence from any zone" +
                     (f" for {fmt(age)} s > equal_after_s {cfg.equal_after_s:g} s" if goods else "") +
                     ": equal shares")
    for z in c.zones.values():
        z.reasons.append("equal share: no zone has fresh evidence")
    c.settle(equal_shares(c.names), "stale")


def panic(c: Cycle) -> None:
    """Rule 5: two or more fresh zones, all degraded -> equal shares at once. Entered at
    once, left only after panic_exit_s out of the condition (one zone reading healthy for
    a cycle must not start a drain)."""
    cfg, now = c.cfg, c.now
    live = [z for z in c.fresh if not z.floor]
    all_degraded = len(live) >= 2 and all(z.degraded for z in live)
    c.panic, c.panic_clear_since = all_degraded, None
    if all_degraded:
        c.reasons.append(f"all {len(live)} zones with fresh evidence are degraded: panic, spreading evenly")
    elif c.state.panic:
        clear_since = _since(c.state.panic_clear_since, now)
        out_for = now - clear_since
        if _elapsed(clear_since, now, cfg.panic_exit_s, cfg):
            c.reasons.append(f"panic over: out of the panic condition for {fmt(out_for)} s"
                             f" >= panic_exit_s {cfg.panic_exit_s:g} s")
        else:
            c.panic, c.panic_clear_since = True, clear_since
            c.reasons.append(f"panic held: out of the panic condition for {fmt(out_for)} s"
                             f" < panic_exit_s {cfg.panic_exit_s:g} s, still spreading evenly")
    if c.panic:
        for z in c.zones.values():
            if not z.floor:
                z.state = "panic"
                z.raw = 1.0
                z.reasons.append("panic: every zone degraded together, equal share")


def max_drained(c: Cycle) -> None:
    """Rule 6: at most max_drained_zones degraded zones drain, the least healthy first
    (operator shifts use slots first); the others are held at the best healthy weight."""
    if c.panic:
        return
    cfg = c.cfg
    candidates = sorted((z for z in c.zones.values() if z.degraded and not z.floor), key=lambda z: (z.health, z.name))
    slots = max(cfg.max_drained_zones - len(c.shifted), 0)
    if len(candidates) > slots:
        healthy = [z.raw for z in c.zones.values() if not z.degraded and not z.floor]
        held_raw = max(healthy) if healthy else 1.0
        drained = [z.name for z in candidates[:slots]]
        for z in candidates[slots:]:
            z.raw = max(z.raw, held_raw)
            z.reasons.append(f"not drained: max_drained_zones {cfg.max_drained_zones} in use"
                             f" ({', '.join(drained + c.shifted) or 'none allowed'})")
    c.drain_slots = candidates[:slots]
    c.draining.update(z.name for z in c.drain_slots)


def drain_dwell(c: Cycle) -> None:
    """Rule 7: a zone that just turned degraded keeps its share for drain_dwell_s; a spike
    from the detector skips the dwell."""
    for z in c.drain_slots:
        since = z.memory.degraded_since
        if since is not None and c.spikes.get(z.name):
            z.reasons.append("failure spike detected: drain dwell skipped")
        elif since is not None and not _elapsed(since, c.now, c.cfg.drain_dwell_s, c.cfg):
            z.hold_share = True
            z.reasons.append(f"drain pending: degraded for {fmt(c.now - since)} s < dwell {c.cfg.drain_dwell_s:g} s")


def anti_flap(c: Cycle) -> None:
    """Rule 8: from the last shares towards the target: nothing moves inside the
    hysteresis band, a draining zone never gains, drain fast and recover slowly."""
    target = _targets(c)
    if not c.have_last:
        c.reasons.append("first decision for this zone set: no step caps")
        c.settle(shares_from_weights(target))
        return
    if c.panic:
        c.settle(shares_from_weights(target))
        return
    target = _pin_draining(c, target)
    moves = [abs(target[az] - c.last[az]) for az in c.names if not c.zones[az].hold_share]
    # hysteresis holds new small moves, not the last steps of a capped move under way
    if (not moves or max(moves) < c.cfg.hysteresis_points) and not c.state.converging \
            and not shifted_changed(c.shifted, c.last):
        c.reasons.append(f"every move < hysteresis {c.cfg.hysteresis_points:g} points: shares held")
        c.settle(c.last)
        return
    lo, hi = _drain_bounds(c, target)
    hi = _recovery_caps(c, target, hi)
    shares = shares_from_weights(project_shares(target, lo, hi))
    c.settle(shares, converging=shares != shares_from_weights(target))


RULES = (operator_freeze, operator_shift, all_stale, panic, max_drained, drain_dwell, anti_flap)
"""Rules 2-8, in order; `start_cycle` runs rules 0-1 and `output` rule 9."""


def output(c: Cycle) -> Decision:
    """Rule 9: the weights document's zones (integer shares >= 1 summing to 100, built
    as the contract's ZoneWeights) and the state for the next cycle."""
    assert c.shares is not None, "anti_flap settles the shares of every cycle that gets to it"
    shares = c.shares
    overall = c.overall or ("panic" if c.panic else _overall(c.zones))
    out = {az: _zone_weights(c.zones[az], int(shares[az])) for az in c.names}
    memories = {}
    for az in c.names:
        z = c.zones[az]
        # the display state survives short gaps; panic/frozen/shifted are re-derived each cycle
        keep = z.state in ("ok", "degraded", "stale")
        memories[az] = z.memory if not keep or z.memory.state == z.state else replace(z.memory, state=z.state)
    new_state = SafetyState(shares=dict(shares), zones=memories, last_decision_at=c.now, converging=c.converging,
                            panic=c.panic, panic_clear_since=c.panic_clear_since)
    changed = dict(shares) != dict(c.state.shares)
    return Decision(overall, out, new_state, changed, tuple(c.reasons))


# ----------------------------------------------------------------- rule 8's steps


def _targets(c: Cycle) -> dict[str, float]:
    """Shares proportional to the (adjusted) raw weights; shifted zones get nothing."""
    raws = {az: (0.0 if z.floor else max(z.raw, 1e-300)) for az, z in c.zones.items()}
    total = math.fsum(raws.values())
    if total > 0:
        return {az: TOTAL_SHARE * r / total for az, r in raws.items()}
    return {az: TOTAL_SHARE / len(c.names) for az in c.names}


def _pin_draining(c: Cycle, target: dict[str, float]) -> dict[str, float]:
    """A zone still being drained never gains share, even when its (partial) health would
    give it more: its target is pinned at its share and the others rescaled. Pinned before
    the hysteresis check, so that the capped move does not look forever unfinished (which
    would let every small move of the others through)."""
    pinned = {az: float(c.last[az]) for az in c.draining if not c.zones[az].floor and target[az] > c.last[az]}
    others = math.fsum(target[az] for az in c.names if az not in pinned)
    if not pinned or others <= 0:
        return target
    rest = (TOTAL_SHARE - math.fsum(pinned.values())) / others
    for az in pinned:
        c.zones[az].reasons.append("still degraded: share not raised until it recovers")
    return {az: pinned[az] if az in pinned else target[az] * rest for az in c.names}


def _drain_bounds(c: Cycle, target: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """Per zone, the lowest and highest share this cycle: any zone loses at most
    max_decrease_points (none while its dwell holds; a shifted zone drops to the floor),
    and a draining zone never more than its target nor more than it had."""
    cfg = c.cfg
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for az, z in c.zones.items():
        prev = float(c.last[az])
        lo[az] = 0.0 if z.floor else prev if z.hold_share else max(prev - cfg.max_decrease_points, 0.0)
        hi[az] = 0.0 if z.floor else float(TOTAL_SHARE)  # a floor of 0: rounding lifts it to 1 %
        if az in c.draining:
            # what it gives up goes to the others, never back to it
            hi[az] = min(max(target[az], lo[az]), prev, hi[az])
        if not z.floor and not z.hold_share and target[az] < lo[az]:
            z.reasons.append(f"draining: at most -{cfg.max_decrease_points:g} points per cycle"
                             f" (target {target[az]:.1f})")
    return lo, hi


def _recovery_caps(c: Cycle, target: Mapping[str, float], hi: dict[str, float]) -> dict[str, float]:
    """A zone below its fair share (100/n) gains at most max_increase_points per cycle on
    its own recovery, plus its part (by weight) of what the draining zones give up: its
    cap limits its own recovery, not its part in absorbing a drain. If only recovering
    zones are left to absorb, the caps yield for this cycle."""
    cfg = c.cfg
    fair = TOTAL_SHARE / len(c.names)
    freed = math.fsum(max(float(c.last[az]) - hi[az], 0.0) for az in c.draining)
    absorbing = math.fsum(target[az] for az in c.names if az not in c.draining)
    hi = dict(hi)
    for az, z in c.zones.items():
        prev = float(c.last[az])
        recovering = target[az] > prev and prev < fair - cfg.hysteresis_points and az not in c.draining
        if not recovering:
            continue
        part = freed * target[az] / absorbing if absorbing > 0 and not z.degraded else 0.0
        hi[az] = prev + cfg.max_increase_points + part
        if target[az] > hi[az]:
            z.reasons.append(f"recovering slowly: +{cfg.max_increase_points:g} points per cycle"
                             + (f" (+{part:.1f} of the drained share)" if part >= 0.05 else "")
                             + f" (target {target[az]:.1f})")
    if math.fsum(hi.values()) < TOTAL_SHARE:
        # Everyone left is recovering (e.g. an operator shift of the only big zone): the
        # traffic has to go somewhere, so the recovery cap yields this cycle.
        c.reasons.append("recovery caps lifted: no zone at fair share can absorb the move")
        hi = {az: hi[az] if c.zones[az].floor or az in c.draining else float(TOTAL_SHARE) for az in c.names}
        if math.fsum(hi.values()) < TOTAL_SHARE:  # only draining zones left besides shifts
            hi = {az: 0.0 if c.zones[az].floor else float(TOTAL_SHARE) for az in c.names}
    return hi


def _forgotten(mem: ZoneMemory | None, now: float, cfg: SafetyConfig) -> bool:
    """A zone absent from the input for forget_after_s (e.g. a decommissioned AZ)."""
    if mem is None:
        return False
    seen = max(t for t in (mem.first_seen, mem.last_good_at, mem.last_seen) if t is not None)
    return now - seen > cfg.forget_after_s


def shifted_changed(shifted: list[str], last: Mapping[str, int]) -> bool:
    """A shifted zone not yet at the floor must move even inside the hysteresis band."""
    return any(last.get(az, 1) > 1 for az in shifted)


def _overall(zones: Mapping[str, WorkingZone]) -> str:
    states = {z.state for z in zones.values()}
    if states == {"stale"}:
        return "stale"
    # a zone merely without data (e.g. no traffic towards it) is shown per zone, not overall
    if states & {"degraded", "shifted"}:
        return "degraded"
    return "ok"
