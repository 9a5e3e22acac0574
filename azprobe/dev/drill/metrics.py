"""What users felt in a drill, from the load client's per-request records and Envoy's
per-zone counters. Pure: no I/O, so the drill, the e2e test and bench/drill.py score the
same way.

Times are CLOCK_MONOTONIC seconds (system-wide, so the load client inside a namespace and
the drill share one clock). Windows are half-open [start, end) on the request's send time.

Definitions (docs/dataplane.md):
- detection: the first moment after the fault starts from which the sick zone's share of
  requests stays at or below DETECT_SHARE in every BIN_S bin until the fault ends, for
  at least MIN_HOLD_S; None if that never happens (static weights).
- "after detection": from fault start + detection (or + grace_s when the mode never
  detects) to the fault's end.
- recovery: the first moment after the fault is cleared from which the sick zone's share
  stays at or above RECOVER_FRACTION of its baseline share in every bin until the end.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

BIN_S = 0.5
DETECT_SHARE = 0.01
MIN_HOLD_S = 2.0  # a "stays" run shorter than this before the window ends proves nothing
RECOVER_FRACTION = 0.5
OK_STATUS = 200


@dataclass(frozen=True)
class RequestRecord:
    t: float  # send time, monotonic s
    latency_ms: float
    status: int  # HTTP status; 0 client timeout, -1 connection error
    az: str  # the serving AZ (x-az), "-" when unknown

    @property
    def ok(self) -> bool:
        return self.status == OK_STATUS


@dataclass(frozen=True)
class AdminSample:
    t: float
    rq_total: dict[str, int]  # zone -> Envoy's upstream requests, summed over its hosts
    host_rq: dict[str, int] = field(default_factory=dict)  # "ip:port" -> rq_total
    host_flags: dict[str, str] = field(default_factory=dict)  # "ip:port" -> /clusters health_flags


def parse_records(text: str) -> list[RequestRecord]:
    """The load client's CSV lines; a torn last line (killed mid-write) is skipped."""
    out = []
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) != 4:
            continue
        try:
            out.append(RequestRecord(float(parts[0]), float(parts[1]), int(parts[2]), parts[3]))
        except ValueError:
            continue
    return sorted(out, key=lambda r: r.t)


def parse_admin(text: str) -> list[AdminSample]:
    out = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
            hosts = doc.get("hosts", {})
            out.append(AdminSample(float(doc["t"]), {az: int(z["rq_total"]) for az, z in doc["zones"].items()},
                                   {h: int(v["rq_total"]) for h, v in hosts.items()},
                                   {h: str(v["health_flags"]) for h, v in hosts.items()}))
        except (ValueError, KeyError, TypeError):
            continue
    return sorted(out, key=lambda s: s.t)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of an ascending sequence."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def in_window(requests: Iterable[RequestRecord], start: float, end: float) -> list[RequestRecord]:
    return [r for r in requests if start <= r.t < end]


def share_of(requests: Sequence[RequestRecord], az: Iterable[str]) -> float | None:
    """The fraction of requests served by the AZs `az` (None without requests)."""
    zones = set(az)
    return sum(1 for r in requests if r.az in zones) / len(requests) if requests else None


def envoy_share(admin: Sequence[AdminSample], sick: Iterable[str], start: float, end: float) -> float | None:
    """The sick zones' share of Envoy's upstream requests between the samples nearest
    inside [start, end] (Envoy counts when the request goes upstream, so this is the
    proxy's own view, independent of the client's)."""
    inside = [s for s in admin if start <= s.t <= end]
    if len(inside) < 2:
        return None
    first, last = inside[0], inside[-1]
    delta = {az: last.rq_total.get(az, 0) - first.rq_total.get(az, 0) for az in last.rq_total}
    total = sum(delta.values())
    return sum(delta.get(az, 0) for az in sick) / total if total > 0 else None


@dataclass
class WindowFigures:
    start_s: float  # offsets from the fault's start
    end_s: float
    requests: int
    success_pct: float | None
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    sick_share_client: float | None
    sick_share_envoy: float | None

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def window_figures(requests: Sequence[RequestRecord], admin: Sequence[AdminSample], sick: Sequence[str],
                   start: float, end: float, origin: float) -> WindowFigures:
    chosen = in_window(requests, start, end)
    latencies = sorted(r.latency_ms for r in chosen)
    ok = sum(1 for r in chosen if r.ok)
    return WindowFigures(
        start_s=start - origin, end_s=end - origin, requests=len(chosen),
        success_pct=100.0 * ok / len(chosen) if chosen else None,
        p50_ms=percentile(latencies, 50), p95_ms=percentile(latencies, 95),
        p99_ms=percentile(latencies, 99), p999_ms=percentile(latencies, 99.9),
        sick_share_client=share_of(chosen, sick), sick_share_envoy=envoy_share(admin, sick, start, end))


@dataclass(frozen=True)
class Bin:
    t: float  # bin start, offset from the fault's start
    requests: int
    errors: int
    p99_ms: float | None
    shares: dict[str, float]  # AZ -> fraction of the bin's requests


def time_bins(requests: Sequence[RequestRecord], start: float, end: float, origin: float, width: float = BIN_S,
              azs: Sequence[str] = ()) -> list[Bin]:
    """Consecutive bins of `width` s covering [start, end). A tail shorter than `width`
    joins the last bin: a sliver of a few requests would otherwise be judged as a bin of
    its own, and two requests that both miss a zone read as that zone's share falling to 0."""
    out = []
    span = (end - start) / width
    count = 0 if span <= 0 else max(1, int(math.floor(span + 1e-9)))
    by_bin: list[list[RequestRecord]] = [[] for _ in range(count)]
    for r in requests:
        if start <= r.t < end:
            by_bin[min(int((r.t - start) / width), count - 1)].append(r)
    for i, chosen in enumerate(by_bin):
        zones = set(azs) | {r.az for r in chosen}
        out.append(Bin(t=start + i * width - origin, requests=len(chosen),
                       errors=sum(1 for r in chosen if not r.ok),
                       p99_ms=percentile(sorted(r.latency_ms for r in chosen), 99),
                       shares={az: (share_of(chosen, [az]) or 0.0) for az in sorted(zones)}))
    return out


def _stays_from(bins: Sequence[Bin], holds: Any, width: float = BIN_S) -> int | None:
    """Index of the first bin from which `holds(bin)` is true for every bin with
    requests until the end (empty bins neither break nor start a run), provided that run
    lasts at least MIN_HOLD_S."""
    first = None
    for i, b in enumerate(bins):
        if b.requests == 0:
            continue
        if holds(b):
            first = i if first is None else first
        else:
            first = None
    if first is None or (len(bins) - first) * width < MIN_HOLD_S:
        return None
    return first


def detection_s(requests: Sequence[RequestRecord], sick: Sequence[str], fault_start: float, fault_end: float) -> float | None:
    bins = time_bins(requests, fault_start, fault_end, fault_start)
    i = _stays_from(bins, lambda b: sum(b.shares.get(az, 0.0) for az in sick) <= DETECT_SHARE)
    return None if i is None else bins[i].t


def recovery_s(requests: Sequence[RequestRecord], sick: Sequence[str], clear_t: float, end: float,
               baseline_share: float | None) -> float | None:
    if not baseline_share:
        return None
    bins = time_bins(requests, clear_t, end, clear_t)
    i = _stays_from(bins, lambda b: sum(b.shares.get(az, 0.0) for az in sick) >= RECOVER_FRACTION * baseline_share)
    return None if i is None else bins[i].t


@dataclass
class ModeFigures:
    mode: str
    sick_azs: list[str]
    baseline: WindowFigures
    fault: WindowFigures  # the whole fault window
    after_detection: WindowFigures
    run: WindowFigures  # everything the client sent
    detect_s: float | None  # data plane: the sick zone's share stays <= DETECT_SHARE
    recover_s: float | None
    fault_s: float
    kv_detect_s: float | None = None  # azprobe mode: what Consul KV showed (demo metrics)
    kv_recover_s: float | None = None
    timeline: list[Bin] = field(default_factory=list)

    def to_json(self, with_timeline: bool = False) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "mode": self.mode, "sick_azs": self.sick_azs, "fault_s": round(self.fault_s, 3),
            "detect_s": self.detect_s, "recover_s": self.recover_s,
            "kv_detect_s": self.kv_detect_s, "kv_recover_s": self.kv_recover_s,
            "baseline": self.baseline.to_json(), "fault": self.fault.to_json(),
            "after_detection": self.after_detection.to_json(), "run": self.run.to_json(),
        }
        if with_timeline:
            doc["timeline"] = [asdict(b) for b in self.timeline]
        return doc


def mode_figures(mode: str, requests: Sequence[RequestRecord], admin: Sequence[AdminSample], sick: Sequence[str], *,
                 run_start: float, fault_start: float, fault_end: float, run_end: float, grace_s: float,
                 warmup_s: float = 1.0, azs: Sequence[str] = ()) -> ModeFigures:
    """All figures of one mode's run (see the module doc for the definitions)."""
    def window(start: float, end: float) -> WindowFigures:
        return window_figures(requests, admin, sick, start, end, fault_start)

    baseline = window(min(run_start + warmup_s, fault_start), fault_start)
    detect = detection_s(requests, sick, fault_start, fault_end)
    after_start = min(fault_start + (detect if detect is not None else grace_s), fault_end)
    return ModeFigures(
        mode=mode, sick_azs=list(sick), baseline=baseline, fault=window(fault_start, fault_end),
        after_detection=window(after_start, fault_end), run=window(run_start, run_end),
        detect_s=detect,
        # nothing to recover from when the mode never moved traffic away
        recover_s=None if detect is None else recovery_s(requests, sick, fault_end, run_end,
                                                         baseline.sick_share_client),
        fault_s=fault_end - fault_start,
        timeline=time_bins(requests, run_start, run_end, fault_start, width=1.0, azs=azs))
