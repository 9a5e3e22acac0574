"""Merge agents' windows into per-path and per-destination-AZ evidence (pure).

Input: parsed windows (``azprobe.contracts.window.Window``) from every agent; the ones whose
``end`` falls inside the evaluation window ``(now - evaluation_window_s, now]`` count.
De-duplication (boot_id / seq) is the collector's job: every window given is counted.

Output (``MergedView``):
- ``paths[(src, dst)]``: an ``Aggregate`` -- summed counters plus *merged* RTT and
  connect histograms (percentiles are read from merged histograms, never averaged).
- ``zones[dst]``: the global ``ZoneStats`` per destination AZ (all sources together),
  the model input. The ``other`` destination (outside the topology) is excluded.
- ``by_source[src][dst]``: the same, as seen from one source AZ (for weights/from/<src>).
- ``util[az]``: weighted CPU+memory utilisation of the AZ's agents, None without agents.

Definitions (docs/contracts.md "Model input"):
- success = ok / (ok + refused + timeout); attempts still pending are not counted;
  None when nothing completed.
- p95_ms = P95 of the merged smoothed-RTT histogram (ms); connect P95 on the Aggregate.
- syn_retrans_per_conn, rto_per_conn = count / max(conn_attempts, 1): RTOs on long-lived
  connections with no new connects still show up (as a count per 1 attempt).
- util = cpu_weight*cpu + mem_weight*mem (normalised), averaged per node, then over the
  nodes of the AZ, so a chatty agent does not outweigh a quiet one.
- samples = completed connections + RTT samples. Whether that is enough evidence is
  ``ZoneStats.is_evidence(min_samples)`` (the safety rules' ``min_samples``).

Also ``failures_by_zone(windows)``: refused + timed-out connects per destination AZ, the
spike detector's input (feed it only the windows *new* this cycle, not the whole window).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from azprobe.contracts.stats import ZoneStats
from azprobe.contracts.window import OTHER_AZ, TcpCounters, Window

__all__ = ["Aggregate", "MergedView", "UtilWeights", "merge_windows", "failures_by_zone"]


@dataclass(frozen=True)
class UtilWeights:
    """How CPU and memory mix into U ("weighted CPU+memory utilisation")."""

    cpu: float = 0.5
    mem: float = 0.5

    def combine(self, cpu: float, mem: float) -> float:
        total = self.cpu + self.mem
        if total <= 0:
            return 0.0
        return min(max((self.cpu * cpu + self.mem * mem) / total, 0.0), 1.0)


@dataclass(kw_only=True)
class Aggregate(TcpCounters):
    """Summed counters and merged histograms for one path or one destination AZ."""

    @property
    def completed(self) -> int:
        return self.conn_ok + self.conn_refused + self.conn_timeout

    @property
    def failures(self) -> int:
        return self.conn_refused + self.conn_timeout

    @property
    def success(self) -> float | None:
        done = self.completed
        return self.conn_ok / done if done else None

    @property
    def p95_rtt_ms(self) -> float | None:
        q = self.rtt_us.quantile(0.95)
        return None if q is None else q / 1000.0

    @property
    def p95_connect_ms(self) -> float | None:
        q = self.connect_us.quantile(0.95)
        return None if q is None else q / 1000.0

    @property
    def samples(self) -> int:
        return self.completed + self.rtt_us.total

    def zone_stats(self, util: float | None) -> ZoneStats:
        per = max(self.conn_attempts, 1)
        return ZoneStats(
            success=self.success,
            p95_ms=self.p95_rtt_ms,
            util=util,
            syn_retrans_per_conn=self.syn_retrans / per,
            rto_per_conn=self.rto / per,
            samples=self.samples,
        )


@dataclass(frozen=True)
class MergedView:
    paths: dict[tuple[str, str], Aggregate]
    zones: dict[str, ZoneStats]
    by_source: dict[str, dict[str, ZoneStats]]
    util: dict[str, float | None]
    windows_used: int


def windows_in_evaluation(windows: Iterable[Window], now: float, evaluation_window_s: float) -> list[Window]:
    """The windows whose end lies in (now - evaluation_window_s, now]."""
    since = now - evaluation_window_s
    return [w for w in windows if since < w.end <= now]


def utilisation_by_az(windows: Iterable[Window], weights: UtilWeights = UtilWeights()) -> dict[str, float]:
    """Per AZ: mean over nodes of each node's mean weighted utilisation."""
    per_node: dict[tuple[str, str], list[float]] = defaultdict(list)
    for w in windows:
        per_node[(w.az, w.node)].append(weights.combine(w.util.cpu, w.util.mem))
    per_az: dict[str, list[float]] = defaultdict(list)
    for (az, _node), values in per_node.items():
        per_az[az].append(sum(values) / len(values))
    return {az: sum(v) / len(v) for az, v in per_az.items()}


def merge_windows(
    windows: Iterable[Window],
    *,
    now: float,
    evaluation_window_s: float = 5.0,
    util_weights: UtilWeights = UtilWeights(),
) -> MergedView:
    """Aggregate the windows inside the evaluation window (see module docstring)."""
    used = windows_in_evaluation(windows, now, evaluation_window_s)
    paths: dict[tuple[str, str], Aggregate] = defaultdict(Aggregate)
    for w in used:
        for p in w.paths:
            paths[(p.src, p.dst)].merge(p)
    util = utilisation_by_az(used, util_weights)

    per_dst: dict[str, Aggregate] = defaultdict(Aggregate)
    per_src_dst: dict[str, dict[str, Aggregate]] = defaultdict(lambda: defaultdict(Aggregate))
    for (src, dst), agg in paths.items():
        if dst == OTHER_AZ:
            continue
        per_dst[dst].merge(agg)
        per_src_dst[src][dst].merge(agg)

    # An AZ with agents but no traffic towards it is still a zone (with no evidence).
    zone_names = set(per_dst) | {az for az in util if az != OTHER_AZ}
    zones = {az: per_dst[az].zone_stats(util.get(az)) if az in per_dst else ZoneStats(util=util.get(az))
             for az in sorted(zone_names)}
    by_source = {
        src: {dst: agg.zone_stats(util.get(dst)) for dst, agg in sorted(dsts.items())}
        for src, dsts in sorted(per_src_dst.items())
    }
    all_util: dict[str, float | None] = {az: util.get(az) for az in sorted(zone_names)}
    return MergedView(paths=dict(paths), zones=zones, by_source=by_source, util=all_util, windows_used=len(used))


def failures_by_zone(windows: Iterable[Window]) -> dict[str, int]:
    """Refused + timed-out connects per destination AZ (``other`` excluded)."""
    out: dict[str, int] = defaultdict(int)
    for w in windows:
        for p in w.paths:
            if p.dst != OTHER_AZ:
                out[p.dst] += p.conn_refused + p.conn_timeout
    return dict(out)
