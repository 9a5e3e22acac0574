"""A sick host is not a sick zone: host judgement by quorum (pure). docs/quorum.md §9.

Input: each vantage point's per-destination-address sums over the evaluation window
(`NodeEvidence.hosts`, the window contract's optional `hosts` section summed per node by
the store). For one view (the same views and the same nodes as the zones' quorum,
controller/quorum.py), after the zones are judged:

1. **Per vantage point.** The model judges each node's hosts of one destination AZ
   against each other, as it judges zones against each other: the latency baseline is
   that node's best host of the zone (capped as for zones), failures and RTOs count as
   for zones. Hosts with fewer than `min_node_samples` samples are not judged by that
   node; at most `max_hosts_per_zone` per node and zone (the most samples first).
2. **Quorum.** A host is sick only when at least
   `max(2, the zones' needed(voters))` of the nodes that talk to it see it degraded, from
   the zones' number of source AZs; in a source view, the source view's strict majority.
   One node can never name a host, however few talk to it. Sick sources set aside by the
   zones' quorum do not vote. A zone judges at most `max_hosts_per_zone` hosts (those
   the most nodes talk to); the others are counted as not judged. A host fewer than
   MIN_HOST_VOTERS nodes report is not judged either (counted apart): the quorum could
   never name it, so it must not count in the zone's judged hosts of step 3.
3. **Host or zone.** A zone the quorum found degraded stays degraded when its sick hosts
   are at least `host_zone_fraction` of its judged hosts (the sickness spans the zone), or
   when no host is sick (the host evidence does not explain it). When sick hosts are
   fewer, the zone stays in play: it takes the verdict of the best zone the quorum found
   healthy (or a neutral one), and its sick hosts are named for the data plane to demote.
   A zone without host evidence is judged exactly as before.

The output: per zone a `ZoneHosts` (judged, not judged, the sick hosts worst first with
their reasons), in `ViewJudgement.hosts`; held zones in `ViewJudgement.held`.

4. **Operator switches** (`host_controls`, called by controller/decide.py for every view,
   controller/controls.py parses them). `control/hosts-off`: the nodes' host evidence is
   dropped before the quorum (`without_host_evidence`), so zones are judged exactly as
   without it and no host is named. `control/host/<addr>`: a pinned host leaves its
   zone's sick list, with a reason saying so; the zone's verdict is left as step 3 made
   it (a pin is about the data plane, not evidence). Both only ever remove hosts from
   the list: no switch can name one.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import TYPE_CHECKING, Protocol, TypeVar

from azprobe.contracts.stats import ZoneStats
from azprobe.contracts.weights import MAX_INT, MAX_STRING
from azprobe.contracts.weights_hosts import MAX_HOST_REASONS, MAX_ZONE_SICK_HOSTS, SickHostEntry
from azprobe.contracts.window import HOST_RTT_BUCKETS, HOST_RTT_FIRST_US, HostStats
from azprobe.controller.models import Model, ZoneHealth, fmt

if TYPE_CHECKING:  # quorum.py holds these records and imports this module
    from azprobe.controller.quorum import NodeEvidence, QuorumConfig, ViewJudgement
    from azprobe.controller.safety import Controls, HostPin

HostKey = tuple[str, str]  # (destination AZ, address)
MIN_HOST_VOTERS = 2  # one node never names a host
# The order a side's median vote is taken in, zones' and hosts' alike: by health, ties by
# node name.
MEDIAN_ORDER = attrgetter("verdict.health", "node")
_NODE = attrgetter("node")


class _Voter(Protocol):
    node: str
    verdict: ZoneHealth


_V = TypeVar("_V", bound=_Voter)


def median_vote(votes: Sequence[_V]) -> _V:
    """The lower middle of `votes` (not empty) in MEDIAN_ORDER. Only the healths are
    sorted, then the names of the votes at the median health: a key tuple per vote cost
    2.5 ms per 5,000 votes, and a cycle of 5,000 nodes takes the median of 30,000."""
    mid = (len(votes) - 1) // 2
    healths = sorted([v.verdict.health for v in votes])
    at = healths[mid]
    ties = sorted([v for v in votes if v.verdict.health == at], key=_NODE)
    if not ties:  # a NaN health equals nothing: the plain order's pick
        return sorted(votes, key=MEDIAN_ORDER)[mid]
    return ties[mid - bisect_left(healths, at)]


def _bucket_value_us(index: int) -> float:
    """A representative RTT of one host bucket: the geometric middle of its bounds (the
    first: half its upper bound; the last: twice its lower bound)."""
    if index == 0:
        return HOST_RTT_FIRST_US / 2
    lower = HOST_RTT_FIRST_US * 4 ** (index - 1)
    return 2.0 * lower if index < HOST_RTT_BUCKETS - 1 else 8.0 * lower


BUCKET_VALUES_US = tuple(_bucket_value_us(i) for i in range(HOST_RTT_BUCKETS))


class HostSums:
    """One node's sums about one destination address over the windows the store holds."""

    __slots__ = ("connects", "failures", "retrans", "rto", "rtt")

    def __init__(self, connects: int = 0, failures: int = 0, retrans: int = 0, rto: int = 0,
                 rtt: Sequence[int] | None = None) -> None:
        self.connects, self.failures, self.retrans, self.rto = connects, failures, retrans, rto
        self.rtt = list(rtt) if rtt is not None else [0] * HOST_RTT_BUCKETS

    def add(self, h: HostStats, sign: int = 1) -> None:
        self.connects += sign * h.connects
        self.failures += sign * h.failures
        self.retrans += sign * h.retrans
        self.rto += sign * h.rto
        rtt = self.rtt
        for i, n in enumerate(h.rtt_buckets):
            rtt[i] += sign * n

    @property
    def empty(self) -> bool:
        return not (self.connects or self.failures or self.retrans or self.rto or any(self.rtt))

    @property
    def samples(self) -> int:
        return self.connects + sum(self.rtt)

    def p95_ms(self) -> float | None:
        total = sum(self.rtt)
        if total <= 0:
            return None
        rank, seen = math.ceil(0.95 * total), 0
        for i, n in enumerate(self.rtt):
            seen += n
            if seen >= rank:
                return BUCKET_VALUES_US[i] / 1000.0
        return BUCKET_VALUES_US[-1] / 1000.0

    def zone_stats(self) -> ZoneStats:
        """The host's evidence on the model's scale. Retransmits are not scored: a host
        summary has no segment count to rate them against (they are shown)."""
        connects = max(self.connects, 0)
        success = None if connects == 0 else 1.0 - min(max(self.failures, 0), connects) / connects
        return ZoneStats(success=success, p95_ms=self.p95_ms(), rto_per_conn=max(self.rto, 0) / max(connects, 1),
                         samples=min(max(self.samples, 0), MAX_INT))


def host_sums(hosts: Iterable[HostStats]) -> dict[HostKey, HostSums]:
    """(dst, addr) -> sums of host summaries (the what-if's per-node form)."""
    out: dict[HostKey, HostSums] = {}
    for h in hosts:
        out.setdefault((h.dst, h.addr), HostSums()).add(h)
    return out


@dataclass(frozen=True)
class SickHost:
    """A host the quorum found degraded, with why (worst first in ZoneHosts.sick)."""

    addr: str
    health: float  # the median degraded vote's
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class ZoneHosts:
    """The host judgement of one destination AZ in one view."""

    judged: int
    sick: tuple[SickHost, ...] = ()
    not_judged: int = 0  # hosts beyond max_hosts_per_zone
    # Hosts fewer than MIN_HOST_VOTERS nodes report: the quorum could never name them
    # sick, so counting them as judged would let one node dilute a zone's sick fraction
    # with invented healthy addresses.
    too_few_voters: int = 0

    @property
    def sick_fraction(self) -> float:
        return len(self.sick) / self.judged if self.judged else 0.0


@dataclass
class _HostVote:
    node: str
    az: str
    stats: ZoneStats
    verdict: ZoneHealth
    degraded: bool
    retrans: int = 0
    evidence: Mapping[str, ZoneStats] = field(default_factory=dict)


def _node_votes(hosts: Mapping[HostKey, HostSums], node: str, az: str, model: Model, degraded_below: float,
                min_samples: int, per_zone: int) -> Iterable[tuple[HostKey, _HostVote]]:
    """One node's verdict on each host it has enough evidence about, zone by zone."""
    by_dst: dict[str, list[tuple[str, HostSums]]] = {}
    for (dst, addr), sums in hosts.items():
        if sums.samples >= min_samples:
            by_dst.setdefault(dst, []).append((addr, sums))
    for dst, entries in sorted(by_dst.items()):
        entries.sort(key=lambda e: (-e[1].samples, e[0]))
        evidence = {addr: sums.zone_stats() for addr, sums in entries[:per_zone]}
        retrans = {addr: sums.retrans for addr, sums in entries[:per_zone]}
        for addr, verdict in model.evaluate(evidence, explain=False).items():
            yield (dst, addr), _HostVote(node, az, evidence[addr], verdict, verdict.health < degraded_below,
                                         retrans[addr], evidence)


@dataclass
class NodeHostVotes:
    """One node's host votes, computed once per cycle and shared by its views."""

    node: str
    votes: list[tuple[HostKey, _HostVote]]
    evidence: set[HostKey]  # every host it has enough samples of, voted on or not (the per-zone cap)


def node_host_votes(nodes: Iterable[NodeEvidence], model: Model, degraded_below: float,
                    cfg: QuorumConfig) -> dict[str, NodeHostVotes]:
    """Step 1 for every node with host evidence: node -> its votes."""
    out: dict[str, NodeHostVotes] = {}
    for n in nodes:
        if not n.hosts:
            continue
        evidence = {key for key, sums in n.hosts.items() if sums.samples >= cfg.min_node_samples}
        votes = list(_node_votes(n.hosts, n.node, n.az, model, degraded_below, cfg.min_node_samples,
                                 cfg.max_hosts_per_zone))
        out[n.node] = NodeHostVotes(n.node, votes, evidence)
    return out


def judge_hosts(voters: Iterable[NodeHostVotes], aside: Iterable[str], model: Model, cfg: QuorumConfig, *,
                single_source: bool = False) -> dict[str, ZoneHosts]:
    """Step 2 for the nodes of one view: dst AZ -> ZoneHosts."""
    skip = set(aside)
    votes: dict[HostKey, list[_HostVote]] = {}
    seen: dict[str, set[str]] = {}  # every address with evidence, judged or not
    for n in voters:
        if n.node in skip:
            continue
        for dst, addr in n.evidence:
            seen.setdefault(dst, set()).add(addr)
        for key, vote in n.votes:
            votes.setdefault(key, []).append(vote)
    by_dst: dict[str, list[tuple[str, list[_HostVote]]]] = {}
    for (dst, addr), vs in votes.items():
        by_dst.setdefault(dst, []).append((addr, vs))
    out: dict[str, ZoneHosts] = {}
    for dst, entries in sorted(by_dst.items()):
        entries.sort(key=lambda e: (-len(e[1]), -sum(v.stats.samples for v in e[1]), e[0]))
        # Only a host the quorum could name sick is judged (_sick needs MIN_HOST_VOTERS
        # voters at least): a host one node alone reports is that node's word, and one
        # node inventing healthy hosts must not lower a sick zone's sick fraction.
        nameable = [e for e in entries if len(e[1]) >= MIN_HOST_VOTERS]
        judged = nameable[:cfg.max_hosts_per_zone]
        few = len(entries) - len(nameable)
        sick = [s for s in (_sick(addr, vs, cfg, model, single_source) for addr, vs in judged) if s is not None]
        sick.sort(key=lambda s: (s.health, s.addr))
        out[dst] = ZoneHosts(len(judged), tuple(sick), len(seen.get(dst, ())) - len(judged) - few, few)
    return out


def _sick(addr: str, votes: list[_HostVote], cfg: QuorumConfig, model: Model, single_source: bool) -> SickHost | None:
    voters = len(votes)
    degraded = [v for v in votes if v.degraded]
    sources = {v.az for v in votes}
    degraded_sources = sorted({v.az for v in degraded})
    if single_source:
        needed, sources_needed = cfg.needed_in_source_view(voters), 1
    else:
        needed, sources_needed = cfg.needed(voters), min(cfg.min_source_azs, len(sources))
    needed = max(needed, MIN_HOST_VOTERS)
    if voters < MIN_HOST_VOTERS or len(degraded) < needed or len(degraded_sources) < sources_needed:
        return None
    median = median_vote(degraded)
    explained = model.evaluate(median.evidence)[addr]
    s = median.stats
    figures = (f"host figures (median node): p95 ~{fmt(s.p95_ms) if s.p95_ms is not None else '?'} ms, "
               f"failures {100 * (1 - s.success) if s.success is not None else 0:.2f}%, "
               f"rto {fmt(s.rto_per_conn, 3)}/conn, retransmits {median.retrans}, samples {s.samples}")
    return SickHost(addr, median.verdict.health, (
        f"host quorum: {len(degraded)} of {voters} nodes see it degraded (from {', '.join(degraded_sources)}); "
        f"needs {needed} from >= {sources_needed} source AZs -> sick host",
        f"median node {median.node} ({median.az}), against that node's other hosts of the zone: "
        f"{explained.reasons[0]}",
        figures))


def hold_zones(verdicts: Mapping[str, ZoneHealth], quorum: Mapping[str, bool], hosts: Mapping[str, ZoneHosts],
               fraction: float) -> tuple[dict[str, ZoneHealth], tuple[str, ...]]:
    """Step 3: the verdicts with the zones whose sickness is a minority of their hosts
    held in play, and the names of those zones. `quorum`: dst -> degraded by quorum."""
    out = dict(verdicts)
    healthy = [v for dst, v in verdicts.items() if not quorum.get(dst)]
    best = max(healthy, key=lambda v: v.health) if healthy else None
    held: list[str] = []
    for dst, zh in sorted(hosts.items()):
        v = out.get(dst)
        if v is None or not zh.judged:
            continue
        names = ", ".join(s.addr for s in zh.sick[:5]) + (f" and {len(zh.sick) - 5} more" if len(zh.sick) > 5 else "")
        share = f"{len(zh.sick)} of {zh.judged} judged hosts sick ({100 * zh.sick_fraction:.0f} %"
        extra = f"; {zh.not_judged} hosts not judged (max_hosts_per_zone)" if zh.not_judged else ""
        if zh.too_few_voters:
            extra += (f"; {zh.too_few_voters} hosts not judged (reported by fewer than {MIN_HOST_VOTERS} nodes, "
                      f"which cannot name a host)")
        if not zh.sick:
            why = f"hosts: none of {zh.judged} judged hosts sick{extra}"
        elif zh.sick_fraction >= fraction:
            why = (f"hosts: {share} >= host_zone_fraction {100 * fraction:g} %): the sickness spans the zone "
                   f"({names}){extra}")
        elif quorum.get(dst):
            why = (f"hosts: {share} < host_zone_fraction {100 * fraction:g} %): a sick host is not a sick zone, "
                   f"the zone stays in play and its sick hosts are demoted ({names}){extra}")
            base = best or ZoneHealth(1.0, 1.0, 1.0, ())
            v = ZoneHealth(base.health, base.weight, base.share_raw, v.reasons)
            held.append(dst)
        else:
            why = f"hosts: {share}): sick hosts demoted ({names}){extra}"
        out[dst] = replace(v, reasons=(why, *v.reasons))
    return out, tuple(held)


def with_hosts(judgement: ViewJudgement, voters: Iterable[NodeHostVotes], model: Model, cfg: QuorumConfig, *,
               single_source: bool = False) -> ViewJudgement:
    """The view's judgement with its hosts judged and step 3 applied; unchanged (the
    same object) when no node of the view reports hosts."""
    voters = list(voters)
    if not voters:
        return judgement
    hosts = judge_hosts(voters, judgement.sick, model, cfg, single_source=single_source)
    if not hosts:
        return judgement
    quorum = {dst: t.quorum for dst, t in judgement.tallies.items()}
    verdicts, held = hold_zones(judgement.verdicts, quorum, hosts, cfg.host_zone_fraction)
    return replace(judgement, verdicts=verdicts, hosts=hosts, held=held)


def sick_entries(judgement: ViewJudgement | None, zones: Iterable[str]) -> dict[str, tuple[SickHostEntry, ...]]:
    """The named hosts of a view's zones (those of the decided document), as the
    sick-hosts contract holds them: worst first, bounded per zone, reasons cut to size."""
    if judgement is None or not judgement.hosts:
        return {}
    out = {}
    for az in zones:
        zh = judgement.hosts.get(az)
        if zh is not None and zh.sick:
            out[az] = tuple(SickHostEntry(s.addr, tuple(r[:MAX_STRING] for r in s.reasons[:MAX_HOST_REASONS]))
                            for s in zh.sick[:MAX_ZONE_SICK_HOSTS])
    return out


MAX_PIN_REASONS = 4  # pinned hosts described per zone; the rest are counted


def without_host_evidence(nodes: Iterable[NodeEvidence], controls: Controls) -> list[NodeEvidence]:
    """The nodes' evidence as the quorum takes it: with control/hosts-off, without hosts."""
    if not controls.hosts_off:
        return list(nodes)
    return [replace(n, hosts={}) if n.hosts else n for n in nodes]


def host_controls(judgement: ViewJudgement, controls: Controls, now: float) -> ViewJudgement:
    """Step 4: the judgement with the operator's host switches applied. Removes hosts
    from the sick lists and adds reasons, nothing else: the same object when no switch
    is in force or none applies."""
    if controls.hosts_off:
        why = ("hosts: host naming off by operator (control/hosts-off"
               + (f": {controls.hosts_off_reason}" if controls.hosts_off_reason else "")
               + "): zones judged without host evidence, no host named")
        verdicts = {dst: replace(v, reasons=(why, *v.reasons)) for dst, v in judgement.verdicts.items()}
        return replace(judgement, verdicts=verdicts)
    pins = {addr: p for addr, p in controls.host_pins.items() if p.until > now}
    if not pins or not judgement.hosts:
        return judgement
    hosts, verdicts = dict(judgement.hosts), dict(judgement.verdicts)
    for dst, zh in judgement.hosts.items():
        pinned = [pins[s.addr] for s in zh.sick if s.addr in pins]
        if not pinned:
            continue
        hosts[dst] = replace(zh, sick=tuple(s for s in zh.sick if s.addr not in pins))
        v = verdicts.get(dst)
        if v is not None:
            lines = _pin_reasons(pinned, now)
            verdicts[dst] = replace(v, reasons=(*v.reasons[:1], *lines, *v.reasons[1:]))
    return replace(judgement, hosts=hosts, verdicts=verdicts)


def _pin_reasons(pinned: Sequence[HostPin], now: float) -> list[str]:
    lines = [f"hosts: {p.addr} pinned healthy by operator (control/host/{p.addr}) until {p.until:.0f} "
             f"(in {max(p.until - now, 0) / 60:.0f} min), not demoted: {p.reason or 'no reason given'}"
             for p in pinned[:MAX_PIN_REASONS]]
    if len(pinned) > MAX_PIN_REASONS:
        lines.append(f"hosts: {len(pinned) - MAX_PIN_REASONS} more pinned hosts not demoted")
    return lines
