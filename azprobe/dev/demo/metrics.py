"""Figures of a scenario run, computed from what Consul KV showed over time. Pure: no I/O.

Consul KV is a step function of time: the document in force at time t is the last
generation written at or before t. Every figure is read off that step function and the
run's fault events, so the same code scores a live demo, an e2e test and a benchmark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DETECT_BELOW_SHARE = 15  # fault start -> sick AZ's share below this = detected
RECOVER_WITHIN_POINTS = 5  # fault cleared -> share within this of baseline (for good) = recovered


@dataclass(frozen=True)
class KvSample:
    """One generation of `<prefix>weights` as a watcher saw it, at monotonic-ish time t."""

    t: float
    generation: int
    shares: Mapping[str, int]
    state: str = "ok"
    leader: str | None = None
    zone_states: Mapping[str, str] = field(default_factory=dict)
    weights: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_doc(cls, t: float, doc: Any) -> "KvSample":
        """From a parsed azprobe.contracts.weights document (duck-typed: generation, state, leader,
        zones[az].share/.weight/.state)."""
        zones = doc.zones
        return cls(
            t=t,
            generation=doc.generation,
            shares={az: z.share for az, z in zones.items()},
            state=doc.state,
            leader=doc.leader,
            zone_states={az: z.state for az, z in zones.items()},
            weights={az: z.weight for az, z in zones.items()},
        )


@dataclass(frozen=True)
class FaultEvent:
    """A scenario step as executed: action is "fault", "clear" or "kill-leader"."""

    t: float
    action: str
    detail: str = ""
    apply_s: float = 0.0  # how long the lab took to put the step in effect (t is when it was)


@dataclass
class ScenarioMetrics:
    detect_s: float | None
    recover_s: float | None
    shares_before: dict[str, int]
    shares_during: dict[str, int]
    shares_after: dict[str, int]
    kv_writes: int
    direction_reversals: int
    min_share_seen: int | None
    max_generation_gap: float
    # Beyond the headline figures: what the run saw, for tests and the summary.
    min_share_during: dict[str, int] = field(default_factory=dict)
    # After the drain and before the final clear, the highest share a sick AZ got back:
    # how far a flapping fault pulls traffic back into a zone that is still unreliable.
    max_share_after_drain: int | None = None
    states_seen: list[str] = field(default_factory=list)
    leaders_seen: list[str] = field(default_factory=list)
    takeover_s: float | None = None  # leader killed -> first generation by another leader
    # A SIGKILLed leader's session lives until its TTL expires; a standby may take the
    # lock only then (plus lock-delay). So the failover splits in two figures:
    lock_released_s: float | None = None  # leader killed -> `leader` key no longer held by it
    write_after_release_s: float | None = None  # release -> first generation by another leader

    def to_json(self) -> dict[str, Any]:
        return {
            "detect_s": self.detect_s,
            "recover_s": self.recover_s,
            "shares_before": self.shares_before,
            "shares_during": self.shares_during,
            "shares_after": self.shares_after,
            "kv_writes": self.kv_writes,
            "direction_reversals": self.direction_reversals,
            "min_share_seen": self.min_share_seen,
            "max_generation_gap": self.max_generation_gap,
            "min_share_during": self.min_share_during,
            "max_share_after_drain": self.max_share_after_drain,
            "states_seen": self.states_seen,
            "leaders_seen": self.leaders_seen,
            "takeover_s": self.takeover_s,
            "lock_released_s": self.lock_released_s,
            "write_after_release_s": self.write_after_release_s,
        }


def distinct_generations(samples: Sequence[KvSample]) -> list[KvSample]:
    """Samples in time order, one per generation (a watcher may see one twice, e.g. after
    a reconnect), dropping any generation that goes backwards."""
    out: list[KvSample] = []
    for s in sorted(samples, key=lambda s: s.t):
        if out and s.generation <= out[-1].generation:
            continue
        out.append(s)
    return out


def doc_at(samples: Sequence[KvSample], t: float) -> KvSample | None:
    """The generation in force at time t (the last one seen at or before t)."""
    current = None
    for s in samples:
        if s.t > t:
            break
        current = s
    return current


def first_time(samples: Sequence[KvSample], since: float, pred) -> float | None:
    """Seconds from `since` until the step function first satisfies pred (0 if it
    already does at `since`); None if it never does."""
    at_start = doc_at(samples, since)
    if at_start is not None and pred(at_start):
        return 0.0
    for s in samples:
        if s.t > since and pred(s):
            return round(s.t - since, 3)
    return None


def settle_time(samples: Sequence[KvSample], since: float, pred) -> float | None:
    """Seconds from `since` until the step function satisfies pred for good: from the
    last time it entered pred through the end of the recording (0 if it held all along
    since `since`); None if it does not hold at the end. A share that touches the band
    and leaves it again has not recovered."""
    if not samples or not pred(samples[-1]):
        return None
    entered = since
    for s in samples:
        if s.t > since and not pred(s):
            entered = None  # left the band: wait for the next entry
        elif s.t > since and entered is None:
            entered = s.t
    at_start = doc_at(samples, since)
    if entered == since and at_start is not None and not pred(at_start):
        # Out of the band at `since` and never left it afterwards: the first sample after.
        entered = next(s.t for s in samples if s.t > since)
    return round(entered - since, 3)


def direction_reversals(values: Sequence[int]) -> int:
    """How often a series changes direction (up then down, or down then up); flat
    stretches do not count as a direction."""
    reversals, last_sign = 0, 0
    for prev, cur in zip(values, values[1:]):
        sign = (cur > prev) - (cur < prev)
        if sign == 0:
            continue
        if last_sign and sign != last_sign:
            reversals += 1
        last_sign = sign
    return reversals


def max_gap(times: Sequence[float]) -> float:
    return round(max((b - a for a, b in zip(times, times[1:])), default=0.0), 3)


def compute_metrics(
    samples: Sequence[KvSample],
    events: Sequence[FaultEvent],
    sick_azs: Sequence[str],
    *,
    leader_events: Sequence[tuple[float, str | None]] = (),
    detect_below: int = DETECT_BELOW_SHARE,
    recover_within: int = RECOVER_WITHIN_POINTS,
) -> ScenarioMetrics:
    """Score a scenario run. The fault phase runs from the first "fault" event to the last
    "clear" event; a sick AZ is one the scenario hurt. leader_events are (t, holder of
    the `leader` lock or None) changes, for the failover figures."""
    gens = distinct_generations(samples)
    fault_starts = [e.t for e in events if e.action == "fault"]
    clears = [e.t for e in events if e.action == "clear"]
    fault_start = min(fault_starts) if fault_starts else None
    fault_end = max(clears) if clears else None

    before = doc_at(gens, fault_start) if fault_start is not None else None
    # The KV document in force just before the final clear: the drained steady state.
    during = doc_at(gens, fault_end - 1e-9) if fault_end is not None else None
    after = gens[-1] if gens else None
    baseline = dict(before.shares) if before else {}

    detect_s = None
    if fault_start is not None and sick_azs:
        detect_s = first_time(gens, fault_start,
                              lambda s: any(s.shares.get(az, 100) < detect_below for az in sick_azs))

    recover_s = None
    if fault_end is not None and baseline and sick_azs:
        recover_s = settle_time(gens, fault_end, lambda s: all(
            az in s.shares and abs(s.shares[az] - baseline.get(az, s.shares[az])) <= recover_within
            for az in sick_azs))

    min_during: dict[str, int] = {}
    if fault_start is not None and fault_end is not None:
        in_fault = [s for s in gens if fault_start <= s.t <= fault_end]
        if before is not None:
            in_fault.insert(0, before)  # in force when the fault began
        for s in in_fault:
            for az, share in s.shares.items():
                min_during[az] = min(share, min_during.get(az, share))

    max_after_drain = None
    if detect_s is not None and fault_start is not None and fault_end is not None:
        drained_at = fault_start + detect_s
        regained = [s.shares[az] for s in gens if drained_at <= s.t < fault_end for az in sick_azs if az in s.shares]
        max_after_drain = max(regained, default=None)

    takeover_s = lock_released_s = write_after_release_s = None
    kills = [e for e in events if e.action == "kill-leader"]
    if kills:
        kill_t = kills[0].t
        killed_leader = kills[0].detail or None
        if killed_leader is None:
            killed_doc = doc_at(gens, kill_t)
            killed_leader = killed_doc.leader if killed_doc else None
        later = [s for s in gens if s.t > kill_t and s.leader and s.leader != killed_leader]
        if later:
            takeover_s = round(later[0].t - kill_t, 3)
        released = [t for t, holder in leader_events if t >= kill_t and holder != killed_leader]
        if released:
            lock_released_s = round(released[0] - kill_t, 3)
            if later:
                write_after_release_s = round(later[0].t - released[0], 3)

    states: list[str] = []
    leaders: list[str] = []
    for s in gens:
        if s.state not in states:
            states.append(s.state)
        if s.leader and s.leader not in leaders:
            leaders.append(s.leader)

    all_shares = [share for s in gens for share in s.shares.values()]
    return ScenarioMetrics(
        detect_s=detect_s,
        recover_s=recover_s,
        shares_before=baseline,
        shares_during=dict(during.shares) if during else {},
        shares_after=dict(after.shares) if after else {},
        kv_writes=len(gens),
        direction_reversals=sum(direction_reversals([s.shares[az] for s in gens if az in s.shares])
                                for az in sick_azs),
        min_share_seen=min(all_shares) if all_shares else None,
        max_generation_gap=max_gap([s.t for s in gens]),
        min_share_during=min_during,
        max_share_after_drain=max_after_drain,
        states_seen=states,
        leaders_seen=leaders,
        takeover_s=takeover_s,
        lock_released_s=lock_released_s,
        write_after_release_s=write_after_release_s,
    )


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) for the benchmark's small samples."""
    xs = sorted(values)
    if not xs:
        return None
    rank = max(1, min(len(xs), -(-len(xs) * q // 100)))
    return xs[int(rank) - 1]
