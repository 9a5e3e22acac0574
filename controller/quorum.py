"""Every node counts once; the fleet decides by quorum (pure). docs/quorum.md.

Input: each vantage point's own evidence over the evaluation window, per destination AZ
(`NodeEvidence`: a node, its AZ, dst -> ZoneStats), as the collector's store sums it per
node. Steps, for one view (the global view: every node; weights/from/<src>: the nodes of
that source AZ):

1. **Judge per vantage point.** The configured model evaluates each node's own zones
   (those with at least `min_node_samples` samples): health < degraded_below is that
   node's "degraded" vote for that destination.
2. **Sick sources.** A node that judged >= 2 destinations and sees every one degraded is
   a sick source (its own uplink, its own kernel, or a liar): it is set aside, and
   reported, as long as the sick sources are a minority of the voting nodes. When most
   nodes see everything degraded it is not them, it is everything: they vote, and the
   safety rules' panic spreads traffic evenly.
3. **Quorum.** A destination is degraded only when at least
   `needed = min(voters, max(min_nodes, ceil(fraction * voters)))` distinct nodes see it
   degraded, spread over at least min(min_source_azs, source AZs among the voters)
   source AZs. Defaults: 3 nodes, 30 %, 2 source AZs. A small fleet (fewer voters than
   min_nodes) needs every voter. A source view is one AZ's own vantage: a real broken
   link from that AZ is seen by all its nodes, so it needs *more than*
   `source_view_fraction` (default: half) of them, and min_nodes, and never more than
   all: `min(voters, max(min_nodes, floor(source_view_fraction * voters) + 1))`
   (1 voter: 1; 2: 2; 3: 3; 10: 6).
4. **Robust figures.** The zone's published figures (success, P95, retransmit rates) are
   the per-field median over the nodes on the winning side (the degraded voters when the
   quorum holds, the others otherwise); its health, weight and share are those of the
   median node of that side. No node's volume enters any of it.
5. **Dead band.** Zones the quorum finds healthy whose health is within `healthy_band`
   of the best healthy zone share that zone's weight: healthy zones do not move against
   each other on noise (the default drill swung 50/49 -> 63/36 with weight^6 amplifying
   ~0.04 of health noise between two healthy zones).

6. **Hosts.** Where nodes report per-destination-address evidence (the window's optional
   `hosts`), hosts are judged by the same quorum, and a zone whose sick hosts are a
   minority of its judged hosts stays in play with them named (controller/hosts.py).

The output (`ViewJudgement`) is what the safety rules take: stats and verdicts per zone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from azprobe.config import Section
from azprobe.contracts.weights import MAX_INT
from azprobe.contracts.stats import ZoneStats
from azprobe.controller.hosts import HostKey, HostSums, ZoneHosts, median_vote, node_host_votes, with_hosts
from azprobe.controller.models import Model, ZoneHealth, fmt


@dataclass(frozen=True)
class QuorumConfig:
    """The [quorum] table."""

    min_nodes: int = 3
    fraction: float = 0.30
    # A source view degrades a zone only on MORE than this share of the source AZ's voters.
    # Below a half a minority of one AZ's nodes would drain a zone for that AZ's consumers.
    source_view_fraction: float = 0.5
    min_source_azs: int = 2
    min_node_samples: int = 10  # a node's evidence about one destination, to vote on it
    healthy_band: float = 0.10  # healthy zones within this much health of the best share its weight
    # A zone degraded by quorum stays degraded only when its sick hosts are at least this
    # share of its judged hosts; fewer, and they are demoted instead (controller/hosts.py).
    host_zone_fraction: float = 0.5
    max_hosts_per_zone: int = 256  # hosts judged per zone and view, and per node and zone

    @classmethod
    def from_section(cls, section: Section) -> "QuorumConfig":
        default = cls()
        cfg = cls(
            min_nodes=section.integer("min_nodes", default.min_nodes, min=1, max=100_000),
            fraction=section.number("fraction", default.fraction, min=0.0, max=1.0),
            source_view_fraction=section.number("source_view_fraction", default.source_view_fraction,
                                                min=0.5, max=1.0),
            min_source_azs=section.integer("min_source_azs", default.min_source_azs, min=1, max=64),
            min_node_samples=section.integer("min_node_samples", default.min_node_samples, min=1, max=10**9),
            healthy_band=section.number("healthy_band", default.healthy_band, min=0.0, max=1.0),
            host_zone_fraction=section.number("host_zone_fraction", default.host_zone_fraction, min=0.01, max=1.0),
            max_hosts_per_zone=section.integer("max_hosts_per_zone", default.max_hosts_per_zone, min=1, max=4096),
        )
        section.reject_unknown()
        return cfg

    def needed(self, voters: int) -> int:
        """Degraded votes a zone needs in the global view."""
        return min(voters, max(self.min_nodes, math.ceil(self.fraction * voters - 1e-9)))

    def needed_in_source_view(self, voters: int) -> int:
        """Degraded votes a zone needs in a source view: more than source_view_fraction
        of the voters (a strict majority by default), at least min_nodes, at most all."""
        return min(voters, max(self.min_nodes, math.floor(self.source_view_fraction * voters + 1e-9) + 1))


@dataclass(frozen=True)
class NodeEvidence:
    """One vantage point: what node `node` (in AZ `az`) saw of each destination."""

    node: str
    az: str
    zones: Mapping[str, ZoneStats]
    # (dst AZ, address) -> sums: the window's optional hosts section, empty without it
    hosts: Mapping[HostKey, HostSums] = field(default_factory=dict)


@dataclass(frozen=True)
class Tally:
    """Who saw what, for one destination in one view (`azprobe explain` shows it)."""

    voters: int
    degraded: int
    needed: int
    degraded_sources: tuple[str, ...]
    sources_needed: int
    quorum: bool

    def reason(self) -> str:
        srcs = ", ".join(self.degraded_sources) or "none"
        verdict = "degraded by quorum" if self.quorum else "not degraded"
        return (f"quorum: {self.degraded} of {self.voters} nodes see it degraded (from {srcs}); needs "
                f"{self.needed} from >= {self.sources_needed} source AZs -> {verdict}")


@dataclass(frozen=True)
class ViewJudgement:
    stats: dict[str, ZoneStats]
    verdicts: dict[str, ZoneHealth]
    tallies: dict[str, Tally]
    sick: tuple[str, ...] = ()  # nodes set aside as sick sources
    reasons: tuple[str, ...] = ()
    hosts: Mapping[str, ZoneHosts] = field(default_factory=dict)  # dst -> its judged hosts (controller/hosts.py)
    held: tuple[str, ...] = ()  # zones degraded by quorum but kept in play: a minority of their hosts is sick


@dataclass(slots=True)
class _Vote:
    node: str
    az: str
    dst: str
    stats: ZoneStats
    verdict: ZoneHealth  # without reasons (explain=False): only the median's are shown
    degraded: bool
    evidence: Mapping[str, ZoneStats]  # the node's whole evidence, to explain the median's verdict


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _median_stats(votes: list[_Vote], util: float | None, samples: int) -> ZoneStats:
    stats = [v.stats for v in votes]
    isfinite = math.isfinite
    return ZoneStats(
        success=_median([z.success for z in stats if z.success is not None and isfinite(z.success)]),
        p95_ms=_median([z.p95_ms for z in stats if z.p95_ms is not None and isfinite(z.p95_ms)]),
        util=util,
        syn_retrans_per_conn=_median([z.syn_retrans_per_conn for z in stats if isfinite(z.syn_retrans_per_conn)]) or 0.0,
        rto_per_conn=_median([z.rto_per_conn for z in stats if isfinite(z.rto_per_conn)]) or 0.0,
        samples=min(samples, MAX_INT))


def judge_nodes(nodes: Iterable[NodeEvidence], model: Model, degraded_below: float,
                cfg: QuorumConfig) -> dict[str, list[_Vote]]:
    """Step 1: each node's own verdict per destination, node -> votes. Without reason
    strings: at 5,000 nodes building them cost most of the judgement."""
    out: dict[str, list[_Vote]] = {}
    for n in nodes:
        evidence = {dst: z for dst, z in n.zones.items() if z.is_evidence(cfg.min_node_samples)}
        if not evidence:
            continue
        verdicts = model.evaluate(evidence, explain=False)
        out[n.node] = [_Vote(n.node, n.az, dst, evidence[dst], v, v.health < degraded_below, evidence)
                       for dst, v in sorted(verdicts.items())]
    return out


def judge_view(votes_by_node: Mapping[str, list[_Vote]], cfg: QuorumConfig, util: Mapping[str, float | None],
               model: Model, *, single_source: bool = False) -> ViewJudgement:
    """Steps 2-5 for the nodes given (all of them, or one source AZ's)."""
    reasons: list[str] = []
    sick = sorted(node for node, votes in votes_by_node.items()
                  if len(votes) >= 2 and all(v.degraded for v in votes))
    if sick and 2 * len(sick) < len(votes_by_node):
        shown = ", ".join(sick[:5]) + (f" and {len(sick) - 5} more" if len(sick) > 5 else "")
        reasons.append(f"{len(sick)} of {len(votes_by_node)} nodes see every zone degraded: set aside as sick "
                       f"sources ({shown})")
    else:
        if sick:
            reasons.append(f"{len(sick)} of {len(votes_by_node)} nodes see every zone degraded: a majority, "
                           "so they are not set aside")
        sick = []
    aside = set(sick)
    by_dst: dict[str, list[_Vote]] = {}
    for node, votes in votes_by_node.items():
        if node in aside:
            continue
        for v in votes:
            by_dst.setdefault(v.dst, []).append(v)

    stats: dict[str, ZoneStats] = {}
    verdicts: dict[str, ZoneHealth] = {}
    tallies: dict[str, Tally] = {}
    for dst, votes in sorted(by_dst.items()):
        degraded = [v for v in votes if v.degraded]
        sources = {v.az for v in votes}
        degraded_sources = tuple(sorted({v.az for v in degraded}))
        sources_needed = 1 if single_source else min(cfg.min_source_azs, len(sources))
        needed = cfg.needed_in_source_view(len(votes)) if single_source else cfg.needed(len(votes))
        quorum = len(degraded) >= needed and len(degraded_sources) >= sources_needed and bool(degraded)
        tally = Tally(len(votes), len(degraded), needed, degraded_sources, sources_needed, quorum)
        side = degraded if quorum else [v for v in votes if not v.degraded]
        median = median_vote(side)
        samples = sum([v.stats.samples for v in votes])
        stats[dst] = _median_stats(side, util.get(dst), samples)
        explained = model.evaluate(median.evidence)[dst]  # the same verdict, with its reasons
        why = (tally.reason(), f"median node {median.node} ({median.az}): {explained.reasons[0]}",
               *explained.reasons[1:])
        verdicts[dst] = ZoneHealth(health=median.verdict.health, weight=median.verdict.weight,
                                   share_raw=median.verdict.share_raw, reasons=why)
        tallies[dst] = tally
    _dead_band(verdicts, tallies, cfg.healthy_band)
    if sick:  # shown on every zone of the view, so `azprobe explain` says who was set aside
        verdicts = {dst: ZoneHealth(v.health, v.weight, v.share_raw, (v.reasons[0], *reasons, *v.reasons[1:]))
                    for dst, v in verdicts.items()}
    return ViewJudgement(stats, verdicts, tallies, tuple(sick), tuple(reasons))


def _dead_band(verdicts: dict[str, ZoneHealth], tallies: Mapping[str, Tally], band: float) -> None:
    healthy = [dst for dst, t in tallies.items() if not t.quorum]
    if len(healthy) < 2:
        return
    best = max(healthy, key=lambda d: (verdicts[d].health, d))
    top = verdicts[best]
    for dst in healthy:
        v = verdicts[dst]
        if dst != best and top.health - v.health <= band and v.share_raw != top.share_raw:
            verdicts[dst] = ZoneHealth(v.health, top.weight, top.share_raw, v.reasons + (
                f"healthy: within healthy_band {band:g} of the best healthy zone {best} "
                f"(health {fmt(top.health, 3)}): the same weight",))


def judge(nodes: Iterable[NodeEvidence], model: Model, degraded_below: float, cfg: QuorumConfig,
          util: Mapping[str, float | None]) -> dict[str, ViewJudgement]:
    """The global view ("") and one view per source AZ, as controller/publish.py names them."""
    nodes = list(nodes)
    votes = judge_nodes(nodes, model, degraded_below, cfg)
    host_votes = node_host_votes(nodes, model, degraded_below, cfg)  # once per node, shared by its views
    out = {"": with_hosts(judge_view(votes, cfg, util, model), host_votes.values(), model, cfg)}
    for src in sorted({n.az for n in nodes}):
        mine = {node: v for node, v in votes.items() if v and v[0].az == src}
        out[src] = with_hosts(judge_view(mine, cfg, util, model, single_source=True),
                              [host_votes[n.node] for n in nodes if n.az == src and n.node in host_votes], model, cfg,
                              single_source=True)
    return out
