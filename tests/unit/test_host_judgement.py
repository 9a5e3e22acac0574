"""Host judgement (controller/hosts.py) through the one decision function: a host is sick
only by a quorum of the nodes that talk to it, one liar among 9 names nothing, a minority
of sick hosts keeps its zone in play, a majority is the zone."""

from __future__ import annotations

from azprobe.contracts.stats import ZoneStats
from azprobe.contracts.window import HostStats, host_rtt_bucket
from azprobe.controller.decide import GLOBAL_VIEW, DecisionRules, decide_views
from azprobe.controller.hosts import HostSums
from azprobe.controller.models import DefaultModel
from azprobe.controller.quorum import NodeEvidence, QuorumConfig

AZS = ("az-a", "az-b", "az-c")
HOSTS = {az: [f"198.18.{i + 1}.{10 + h}" for h in range(6)] for i, az in enumerate(AZS)}
HEALTHY = ZoneStats(success=0.9995, p95_ms=1.0, util=0.3, samples=500)
SLOW = ZoneStats(success=0.999, p95_ms=205.0, util=0.3, syn_retrans_per_conn=0.05, samples=500)


def sums(rtt_us: int, *, connects: int = 20, failures: int = 0, rto: int = 0, samples: int = 40) -> HostSums:
    h = HostSums()
    buckets = [0] * 8
    buckets[host_rtt_bucket(rtt_us)] = samples
    h.add(HostStats("x", "y", "198.18.0.1", connects, failures, 0, rto, buckets))
    return h


def node(name: str, az: str, sick: set[str], *, zone_sick: bool | None = None, lie: set[str] = frozenset()) -> NodeEvidence:
    """One vantage point talking to every host: sick hosts +200 ms; its zone stats pool them."""
    hosts = {}
    for dst, addrs in HOSTS.items():
        for addr in addrs:
            bad = addr in sick or addr in lie
            hosts[(dst, addr)] = sums(205_000 if bad else 900, rto=3 if bad else 0)
    zones = {}
    for dst, addrs in HOSTS.items():
        pooled_sick = any(a in sick for a in addrs) if zone_sick is None else (zone_sick and dst == "az-b")
        zones[dst] = SLOW if pooled_sick or any(a in lie for a in addrs) else HEALTHY
    return NodeEvidence(name, az, zones, hosts)


def fleet(sick: set[str], **kw) -> list[NodeEvidence]:
    return [node(f"n-{az}-{i}", az, sick, **kw) for az in AZS for i in range(3)]


def decide(nodes, now=1000.0):
    rules = DecisionRules(DefaultModel())
    seen = {GLOBAL_VIEW: {az: ZoneStats(util=0.3) for az in AZS}}
    return decide_views(nodes, seen, rules=rules, states={}, now=now)


def test_one_sick_host_is_named_and_its_zone_keeps_its_share():
    bad = HOSTS["az-b"][2]
    views = decide(fleet({bad}))
    view = views[GLOBAL_VIEW]
    zone_hosts = view.judgement.hosts["az-b"]
    assert [s.addr for s in zone_hosts.sick] == [bad] and zone_hosts.judged == 6
    assert view.judgement.held == ("az-b",)
    assert "host quorum: 9 of 9 nodes" in zone_hosts.sick[0].reasons[0]
    zones = view.decision.zones
    assert zones["az-b"].state == "ok" and abs(zones["az-b"].share - 33) <= 1, zones
    assert any("a sick host is not a sick zone" in r for r in zones["az-b"].reasons)
    # every source view judges it too, from its own nodes
    for az in AZS:
        assert [s.addr for s in views[az].judgement.hosts["az-b"].sick] == [bad]


def test_without_hosts_the_decision_is_exactly_todays():
    bad = HOSTS["az-b"][2]
    with_hosts = fleet({bad})
    without = [NodeEvidence(n.node, n.az, n.zones) for n in with_hosts]
    views = decide(without)
    assert views[GLOBAL_VIEW].judgement.hosts == {} and views[GLOBAL_VIEW].judgement.held == ()
    assert views[GLOBAL_VIEW].decision.zones["az-b"].state == "degraded"  # today's drain


def test_a_majority_of_sick_hosts_is_the_zone():
    sick = set(HOSTS["az-b"][:4])
    view = decide(fleet(sick))[GLOBAL_VIEW]
    assert len(view.judgement.hosts["az-b"].sick) == 4 and view.judgement.held == ()
    assert view.decision.zones["az-b"].state == "degraded"
    assert any("spans the zone" in r for r in view.decision.zones["az-b"].reasons)


def test_a_liar_among_nine_cannot_name_a_host():
    honest = fleet(set())
    target = HOSTS["az-b"][0]
    liar = node("n-az-a-0", "az-a", set(), lie={target})
    nodes = [liar, *honest[1:]]
    view = decide(nodes)[GLOBAL_VIEW]
    assert view.judgement.hosts["az-b"].sick == ()
    assert view.decision.zones["az-b"].state == "ok"
    # and three liars from one AZ cannot either (two source AZs are needed)
    liars = [node(f"n-az-a-{i}", "az-a", set(), lie={target}) for i in range(3)]
    view = decide([*liars, *honest[3:]])[GLOBAL_VIEW]
    assert view.judgement.hosts["az-b"].sick == ()


def test_one_node_cannot_name_a_host_it_alone_talks_to():
    lone = "198.18.2.99"
    nodes = fleet(set())
    first = nodes[0]
    hosts = dict(first.hosts)
    hosts[("az-b", lone)] = sums(205_000, rto=5)
    nodes[0] = NodeEvidence(first.node, first.az, first.zones, hosts)
    view = decide(nodes)[GLOBAL_VIEW]
    assert view.judgement.hosts["az-b"].sick == ()


def test_one_node_inventing_healthy_hosts_cannot_keep_a_sick_zone_in_play():
    # 4 of 6 real hosts sick, every node votes az-b degraded: the zone drains. One node
    # adding 10 healthy addresses only it reports must not dilute the sick fraction.
    nodes = fleet(set(HOSTS["az-b"][:4]))
    first = nodes[0]
    hosts = dict(first.hosts)
    for i in range(10):
        hosts[("az-b", f"198.18.2.{200 + i}")] = sums(900)
    nodes.append(NodeEvidence("n-liar", "az-a", first.zones, hosts))
    view = decide(nodes)[GLOBAL_VIEW]
    zone_hosts = view.judgement.hosts["az-b"]
    assert zone_hosts.judged == 6 and len(zone_hosts.sick) == 4 and zone_hosts.too_few_voters == 10
    assert view.judgement.held == () and view.decision.zones["az-b"].state == "degraded"
    assert "10 hosts not judged (reported by fewer than 2 nodes" in view.decision.zones["az-b"].reasons[0]


def test_hosts_judged_per_zone_are_bounded():
    rules = DecisionRules(DefaultModel(), QuorumConfig(max_hosts_per_zone=4))
    seen = {GLOBAL_VIEW: {az: ZoneStats(util=0.3) for az in AZS}}
    view = decide_views(fleet(set()), seen, rules=rules, states={}, now=1.0)[GLOBAL_VIEW]
    assert view.judgement.hosts["az-b"].judged == 4 and view.judgement.hosts["az-b"].not_judged == 2


def test_a_zone_sick_without_sick_hosts_still_drains():
    # the pooled evidence says az-b is degraded, yet no host stands out: not the hosts' doing
    view = decide(fleet(set(), zone_sick=True))[GLOBAL_VIEW]
    assert view.judgement.held == ()
    assert view.decision.zones["az-b"].state == "degraded"


def test_host_p95_from_the_coarse_sketch():
    assert sums(900).p95_ms() == 0.512
    assert 100 < sums(205_000).p95_ms() < 262
    assert HostSums().p95_ms() is None


def test_the_what_if_per_node_form_takes_host_summaries():
    import pytest

    from azprobe.contracts.stats import StatsError, parse_nodes_document
    from azprobe.controller.hosts import host_sums

    host = {"src": "az-a", "dst": "az-b", "addr": "198.18.2.10", "connects": 20, "failures": 1, "retrans": 0,
            "rto": 2, "rtt_buckets": [0, 40, 0, 0, 0, 0, 0, 0]}
    doc = {"nodes": [{"node": "n1", "az": "az-a", "zones": {}, "hosts": [host]}]}
    (v,) = parse_nodes_document(doc)
    sums = host_sums(v.hosts)[("az-b", "198.18.2.10")]
    assert (sums.connects, sums.failures, sums.rto, sums.samples) == (20, 1, 2, 60)
    for bad, field in (({**host, "src": "az-c"}, "nodes[0].hosts[0].src"),
                       ({**host, "addr": "198.18.2.010"}, "nodes[0].hosts[0].addr"),
                       ({**host, "rtt_buckets": [1]}, "nodes[0].hosts[0]")):
        with pytest.raises(StatsError) as exc:
            parse_nodes_document({"nodes": [{"node": "n1", "az": "az-a", "zones": {}, "hosts": [bad]}]})
        assert exc.value.field == field
    with pytest.raises(StatsError, match="twice"):
        parse_nodes_document({"nodes": [{"node": "n1", "az": "az-a", "zones": {}, "hosts": [host, host]}]})


def _window(seq: float, hosts, az="az-a"):
    from azprobe.contracts.window import Utilisation, Window

    return Window(node="n1", az=az, boot_id="b", seq=int(seq), start=seq - 1, end=seq, util=Utilisation(0.1, 0.1),
                  paths=[], hosts=hosts)


def test_the_store_sums_each_nodes_hosts_and_takes_back_exactly_what_it_added(monkeypatch):
    from azprobe.controller import window_store
    from azprobe.controller.window_store import WindowStore

    monkeypatch.setattr(window_store, "MAX_HOSTS", 2)  # a node's sums hold at most this many addresses
    h = lambda addr, n: HostStats("az-a", "az-b", addr, n, 0, 0, 0, [0, n, 0, 0, 0, 0, 0, 0])  # noqa: E731
    store = WindowStore(horizon_s=5.0)
    store.add("u", _window(1, [h("198.18.2.1", 3), h("198.18.2.2", 4)]), at=1.0)
    store.add("u", _window(2, [h("198.18.2.1", 5), h("198.18.2.3", 7)]), at=2.0)  # .3: over the cap
    sums = store.node_hosts()["n1"]
    assert {k[1]: s.connects for k, s in sums.items()} == {"198.18.2.1": 8, "198.18.2.2": 4}
    assert store._nodes["n1"].hosts_over_cap == 1
    store.prune(6.5)  # the first window leaves
    assert {k[1]: s.connects for k, s in store.node_hosts()["n1"].items()} == {"198.18.2.1": 5}
    store.prune(7.5)
    assert store.node_hosts() == {}


def test_the_topology_drops_foreign_host_summaries():
    from tests.controller_harness import topology

    topo = topology()
    kept = topo.admit(_window(1, [HostStats("az-a", "az-b", "198.18.2.1", 1), HostStats("az-c", "az-b", "198.18.2.2", 1),
                                  HostStats("az-a", "az-z", "198.18.9.9", 1)]))
    assert [x.addr for x in kept.hosts] == ["198.18.2.1"] and topo.counters.hosts_foreign == 2
