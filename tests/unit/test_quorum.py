"""controller/quorum.py: per-node verdicts combined by quorum (pure)."""

from __future__ import annotations

from azprobe.contracts.stats import ZoneStats
from azprobe.controller.models import DEGRADED_BELOW, DefaultModel
from azprobe.controller.quorum import NodeEvidence, QuorumConfig, judge

AZS = ("az-a", "az-b", "az-c")
OK = ZoneStats(success=1.0, p95_ms=10.0, samples=100)
DOWN = ZoneStats(success=0.0, p95_ms=2000.0, samples=100)


def _fleet(per_az: int = 10, lie=None) -> list[NodeEvidence]:
    nodes = []
    for az in AZS:
        for i in range(per_az):
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
