"""What the decision reads of the evaluation window: per-node sums and the zones seen (pure).

The quorum judges each node on its own evidence (controller/quorum.py); the window store
(controller/window_store.py) keeps that evidence summed per node and destination AZ as an
``Aggregate``: counters added, RTT and connect histograms *merged* (percentiles are read
from merged histograms, never averaged). Beyond it the decision reads only ``ZonesSeen``:
which zones each view knows of, and each AZ's utilisation.

Definitions (docs/contracts.md "Model input"), ``Aggregate.zone_stats``:
- success = ok / (ok + refused + timeout); attempts still pending are not counted;
  None when nothing completed.
- p95_ms = P95 of the merged smoothed-RTT histogram (ms); connect P95 on the Aggregate.
- syn_retrans_per_conn, rto_per_conn = count / max(conn_attempts, 1): RTOs on long-lived
  connections with no new connects still show up (as a count per 1 attempt).
- samples = completed connections + RTT samples. Whether that is enough evidence is
  ``ZoneStats.is_evidence(min_samples)`` (the safety rules' ``min_samples``).

``zones_seen``: util = cpu_weight*cpu + mem_weight*mem (normalised) of each node's mean
over its windows, and an AZ's is the median over its nodes: each node counts once, so a
chatty agent does not outweigh a quiet one, and one node reporting itself at 100 % cannot
move its AZ's figure (a mean would move by a third of its lie in an AZ of three nodes);
`azprobe model` takes the same median. The ``other`` destination (outside the topology)
is no zone.

Also ``failures_by_zone(windows)``: refused + timed-out connects per destination AZ, the
spike detector's input (feed it only the windows *new* this cycle, not the whole window).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from azprobe.contracts.stats import ZoneStats
from azprobe.contracts.window import OTHER_AZ, TcpCounters, Window

__all__ = ["Aggregate", "NodeSeen", "UtilWeights", "ZonesSeen", "failures_by_zone", "zones_seen"]


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


class NodeSeen(NamedTuple):
    """One node of the evaluation window, as zones_seen reads it (a tuple: one per node per cycle)."""

    az: str
    dsts: Iterable[str]  # the destination AZs its windows hold a path to (``other`` excluded)
    cpu: float  # its mean over its windows
    mem: float


@dataclass(frozen=True)
class ZonesSeen:
    """The zones each view knows of, beyond the nodes' votes: a zone nobody can judge is
    still a zone (held or neutral, never drained), and the quorum's figures carry its
    utilisation."""

    util: dict[str, float | None]  # every zone of the global view -> its AZ's utilisation (None: no agent there)
    by_source: dict[str, tuple[str, ...]]  # source AZ -> the destinations its nodes hold a path to

    @property
    def zones(self) -> tuple[str, ...]:
        return tuple(self.util)


def zones_seen(nodes: Iterable[NodeSeen], weights: UtilWeights = UtilWeights()) -> ZonesSeen:
    """The global view's zones (destinations some node holds a path to, and AZs with
    agents) with their utilisation, and each source AZ's destinations (module docstring)."""
    per_az: dict[str, list[float]] = defaultdict(list)
    dsts_by_source: dict[str, set[str]] = defaultdict(set)
    for n in nodes:
        per_az[n.az].append(weights.combine(n.cpu, n.mem))
        dsts_by_source[n.az].update(n.dsts)
    util = {az: statistics.median(v) for az, v in per_az.items()}
    zone_names = set().union(*dsts_by_source.values()) | set(util)
    zone_names.discard(OTHER_AZ)
    return ZonesSeen(util={az: util.get(az) for az in sorted(zone_names)},
                     by_source={src: tuple(sorted(dsts)) for src, dsts in sorted(dsts_by_source.items()) if dsts})


def failures_by_zone(windows: Iterable[Window]) -> dict[str, int]:
    """Refused + timed-out connects per destination AZ (``other`` excluded)."""
    out: dict[str, int] = defaultdict(int)
    for w in windows:
        for p in w.paths:
            if p.dst != OTHER_AZ:
                out[p.dst] += p.conn_refused + p.conn_timeout
    return dict(out)
