"""controller/quorum.py: per-node verdicts combined by quorum (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from azprobe.config import Section
from azprobe.contracts.stats import ZoneStats
from azprobe.controller.hosts import MEDIAN_ORDER, median_vote
from azprobe.controller.models import DEGRADED_BELOW, DefaultModel, ZoneHealth
from azprobe.controller.quorum import NodeEvidence, QuorumConfig, judge
from azprobe.errors import ConfigError

AZS = ("az-a", "az-b", "az-c")
OK = ZoneStats(success=1.0, p95_ms=10.0, samples=100)
DOWN = ZoneStats(success=0.0, p95_ms=2000.0, samples=100)


def _fleet(per_az: int | dict[str, int] = 10, lie=None) -> list[NodeEvidence]:
    nodes = []
    for az in AZS:
        for i in range(per_az if isinstance(per_az, int) else per_az[az]):
            name = f"{az}-{i}"
            zones = {dst: OK for dst in AZS}
            if lie:
                zones = lie(name, az, zones)
            nodes.append(NodeEvidence(name, az, zones))
    return nodes


def _judge(nodes, cfg=QuorumConfig()):
    return judge(nodes, DefaultModel(), DEGRADED_BELOW, cfg, {})


def test_needed_is_max_of_min_nodes_and_fraction_but_never_more_than_the_voters():
    cfg = QuorumConfig()
    assert [cfg.needed(n) for n in (1, 2, 3, 10, 30, 90, 300)] == [1, 2, 3, 3, 9, 27, 90]


def test_a_minority_cannot_degrade_a_zone_and_a_spread_quorum_can():
    def some(k, srcs):
        def lie(name, az, zones):
            if az in srcs and int(name.rsplit("-", 1)[1]) < k:
                return {**zones, "az-b": DOWN}
            return zones
        return lie

    j = _judge(_fleet(lie=some(8, ("az-a",))))[""]
    assert not j.tallies["az-b"].quorum and j.verdicts["az-b"].health >= DEGRADED_BELOW  # 8 of 30, one source AZ
    assert j.stats["az-b"].success == 1.0  # the healthy side's median, not a sum
    j = _judge(_fleet(lie=some(5, ("az-a", "az-c"))))[""]
    assert j.tallies["az-b"].quorum and j.tallies["az-b"].degraded == 10
    assert j.verdicts["az-b"].health < DEGRADED_BELOW and j.stats["az-b"].success == 0.0
    j = _judge(_fleet(lie=some(10, ("az-a",))))[""]  # a whole source AZ alone: spread not met
    assert not j.tallies["az-b"].quorum


def test_sick_sources_are_set_aside_only_while_a_minority():
    def uplink(name, az, zones):
        return {dst: DOWN for dst in zones} if az == "az-b" else zones

    j = _judge(_fleet(lie=uplink))[""]
    assert len(j.sick) == 10 and not any(t.quorum for t in j.tallies.values())
    assert "set aside as sick sources" in j.verdicts["az-a"].reasons[1]
    everything = _judge(_fleet(lie=lambda n, a, z: {d: DOWN for d in z}))[""]
    assert everything.sick == () and all(t.quorum for t in everything.tallies.values())


def test_healthy_zones_within_the_band_share_one_weight():
    def noisy(name, az, zones):  # az-c reads a little worse everywhere: noise, not an outage
        return {**zones, "az-b": DOWN, "az-c": ZoneStats(success=0.9985, p95_ms=24.0, samples=100)}

    j = _judge(_fleet(lie=noisy))[""]
    a, c = j.verdicts["az-a"], j.verdicts["az-c"]
    assert c.health < a.health and c.share_raw == a.share_raw
    off = _judge(_fleet(lie=noisy), QuorumConfig(healthy_band=0.0))[""]
    assert off.verdicts["az-c"].share_raw < off.verdicts["az-a"].share_raw


def test_volume_does_not_count():
    def heavy(name, az, zones):
        if name == "az-a-0":
            return {**zones, "az-b": ZoneStats(success=0.0, p95_ms=2000.0, samples=2**50)}
        return zones

    j = _judge(_fleet(lie=heavy))[""]
    assert not j.tallies["az-b"].quorum and j.stats["az-b"].success == 1.0


def test_source_views_judge_their_own_nodes():
    def from_a(name, az, zones):
        return {**zones, "az-b": DOWN} if az == "az-a" else zones

    views = _judge(_fleet(lie=from_a))
    assert set(views) == {"", *AZS}
    assert views["az-a"].tallies["az-b"].quorum and views["az-a"].tallies["az-b"].voters == 10
    assert not views["az-c"].tallies["az-b"].quorum and not views[""].tallies["az-b"].quorum


def test_a_source_view_needs_more_than_half_of_its_voters_and_min_nodes():
    cfg = QuorumConfig()
    assert [cfg.needed_in_source_view(n) for n in (1, 2, 3, 4, 5, 6, 9, 10, 30)] == [1, 2, 3, 3, 3, 4, 5, 6, 16]
    assert QuorumConfig(source_view_fraction=1.0).needed_in_source_view(10) == 10  # every voter


def _first(k, srcs=("az-a",)):
    def lie(name, az, zones):
        if az in srcs and int(name.rsplit("-", 1)[1]) < k:
            return {**zones, "az-b": DOWN}
        return zones
    return lie


def test_three_liars_in_one_az_do_not_drain_a_zone_for_that_azs_consumers():
    views = _judge(_fleet(lie=_first(3)))
    tally = views["az-a"].tallies["az-b"]
    assert (tally.degraded, tally.voters, tally.needed, tally.quorum) == (3, 10, 6, False)
    assert views["az-a"].verdicts["az-b"].health >= 0.9 and views["az-a"].stats["az-b"].success == 1.0
    assert not views[""].tallies["az-b"].quorum
    assert not _judge(_fleet(lie=_first(5)))["az-a"].tallies["az-b"].quorum  # half is not a majority
    assert _judge(_fleet(lie=_first(6)))["az-a"].tallies["az-b"].quorum


def test_a_broken_link_seen_by_every_node_of_the_source_az_drains_it_in_that_view():
    views = _judge(_fleet(lie=_first(10)))
    assert views["az-a"].tallies["az-b"].quorum and views["az-a"].verdicts["az-b"].health < 0.9
    assert views["az-a"].stats["az-b"].success == 0.0
    assert not views["az-c"].tallies["az-b"].quorum  # az-c's consumers keep az-b


@pytest.mark.parametrize("size", [1, 2])
def test_a_tiny_source_az_needs_every_one_of_its_nodes(size):
    per_az = {"az-a": size, "az-b": 10, "az-c": 10}
    assert _judge(_fleet(per_az, lie=_first(size)))["az-a"].tallies["az-b"].quorum
    if size == 2:
        assert not _judge(_fleet(per_az, lie=_first(1)))["az-a"].tallies["az-b"].quorum


def test_source_view_fraction_is_validated():
    assert QuorumConfig.from_section(Section({}, "quorum")).source_view_fraction == 0.5
    assert QuorumConfig.from_section(Section({"source_view_fraction": 0.75}, "quorum")).source_view_fraction == 0.75
    with pytest.raises(ConfigError, match="quorum.source_view_fraction"):
        QuorumConfig.from_section(Section({"source_view_fraction": 0.3}, "quorum"))


@dataclass
class _Ballot:
    node: str
    verdict: ZoneHealth


@given(st.lists(st.tuples(st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0]) | st.floats(0, 1), st.integers(0, 10**6)),
                min_size=1, max_size=60, unique_by=lambda t: t[1]))
def test_the_median_vote_is_the_lower_middle_in_health_then_node_order(pairs):
    votes = [_Ballot(f"n{node}", ZoneHealth(health, 1.0, 1.0, ())) for health, node in pairs]
    assert median_vote(votes) is sorted(votes, key=MEDIAN_ORDER)[(len(votes) - 1) // 2]


def test_a_nan_health_does_not_break_the_median_vote():
    votes = [_Ballot("a", ZoneHealth(math.nan, 1.0, 1.0, ())), _Ballot("b", ZoneHealth(0.5, 1.0, 1.0, ()))]
    assert median_vote(votes) in votes
