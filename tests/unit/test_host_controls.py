"""The operator's host switches through the one decision function (controller/decide.py,
controller/hosts.py `host_controls`): a pin takes a named host off the list and leaves
the zone's verdict alone, hosts-off judges as without host evidence, and no switch ever
names a host the controller would not name without it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from azprobe.controller.decide import GLOBAL_VIEW, DecisionRules, decide_views
from azprobe.controller.hosts import sick_entries
from azprobe.controller.models import DefaultModel
from azprobe.controller.quorum import NodeEvidence
from azprobe.contracts.stats import ZoneStats
from azprobe.controller.safety import Controls, HostPin
from tests.unit.test_host_judgement import AZS, HOSTS, fleet

NOW = 1000.0
ALL_ADDRS = [a for addrs in HOSTS.values() for a in addrs]


def decide(nodes, controls=Controls()):
    rules = DecisionRules(DefaultModel())
    seen = {GLOBAL_VIEW: {az: ZoneStats(util=0.3) for az in AZS}}
    return decide_views(nodes, seen, rules=rules, states={}, now=NOW, controls=controls)


def pins(*addrs: str, until: float = NOW + 600, reason: str = "checked by hand") -> Controls:
    return Controls(host_pins={a: HostPin(a, until, reason) for a in addrs})


def named(views) -> dict[str, set[str]]:
    """view -> every address its decided document would name."""
    out = {}
    for name, view in views.items():
        entries = sick_entries(view.judgement, view.decision.zones)
        out[name] = {h.addr for hosts in entries.values() for h in hosts}
    return out


def test_a_pin_takes_a_named_host_off_the_list_with_the_operators_reason():
    bad, other = HOSTS["az-b"][2], HOSTS["az-b"][4]
    plain = decide(fleet({bad, other}))
    assert named(plain)[GLOBAL_VIEW] == {bad, other}
    pinned = decide(fleet({bad, other}), pins(bad, reason="NIC swapped at 03:10"))
    for name in (GLOBAL_VIEW, *AZS):
        assert named(pinned)[name] == {other}
    zone = pinned[GLOBAL_VIEW].decision.zones["az-b"]
    line = next(r for r in zone.reasons if "pinned healthy" in r)
    assert bad in line and f"control/host/{bad}" in line and "NIC swapped at 03:10" in line and "not demoted" in line
    # the zone's verdict is step 3's: a pin is about the data plane, not evidence
    before = plain[GLOBAL_VIEW].decision.zones["az-b"]
    assert (zone.share, zone.state, zone.health) == (before.share, before.state, before.health)


def test_a_pin_of_a_healthy_host_names_nothing_and_changes_nothing():
    views = decide(fleet(set()), pins(*ALL_ADDRS[:5]))
    assert named(views) == {name: set() for name in views}
    plain = decide(fleet(set()))
    assert {az: z.share for az, z in views[GLOBAL_VIEW].decision.zones.items()} == \
        {az: z.share for az, z in plain[GLOBAL_VIEW].decision.zones.items()}
    assert not any("pinned" in r for z in views[GLOBAL_VIEW].decision.zones.values() for r in z.reasons)


def test_an_expired_pin_is_no_pin():
    bad = HOSTS["az-b"][2]
    views = decide(fleet({bad}), pins(bad, until=NOW - 1))
    assert named(views)[GLOBAL_VIEW] == {bad}


def test_pinning_every_sick_host_keeps_the_zone_held_not_drained():
    bad = HOSTS["az-b"][2]
    views = decide(fleet({bad}), pins(bad))
    assert named(views)[GLOBAL_VIEW] == set()
    assert views[GLOBAL_VIEW].judgement.held == ("az-b",)
    assert views[GLOBAL_VIEW].decision.zones["az-b"].state == "ok"


def test_hosts_off_names_nothing_and_judges_as_without_host_evidence():
    bad = HOSTS["az-b"][2]
    nodes = fleet({bad})
    off = decide(nodes, Controls(hosts_off=True, hosts_off_reason="probe bug, ticket 42"))
    assert named(off) == {name: set() for name in off}
    without = decide([NodeEvidence(n.node, n.az, n.zones) for n in nodes])
    for name in without:
        a, b = off[name].decision.zones, without[name].decision.zones
        assert {az: (z.share, z.state) for az, z in a.items()} == {az: (z.share, z.state) for az, z in b.items()}
    zone = off[GLOBAL_VIEW].decision.zones["az-b"]
    assert any("control/hosts-off: probe bug, ticket 42" in r for r in zone.reasons)


@settings(max_examples=40, deadline=None)
@given(sick=st.sets(st.sampled_from(ALL_ADDRS), max_size=5), pinned=st.sets(st.sampled_from(ALL_ADDRS), max_size=8),
       off=st.booleans())
def test_no_switch_ever_names_a_host_the_controller_would_not(sick, pinned, off):
    nodes = fleet(set(sick))
    base = named(decide(nodes))
    controls = Controls(host_pins={a: HostPin(a, NOW + 60) for a in pinned}, hosts_off=off)
    switched = named(decide(nodes, controls))
    for name, addrs in switched.items():
        assert addrs <= base.get(name, set()) - set(pinned)


def test_the_controller_exports_named_and_pinned_hosts_per_zone_of_its_decision():
    from prometheus_client.parser import text_string_to_metric_families

    from azprobe.contracts.weights import ZoneWeights
    from azprobe.controller.metrics import ControllerMetrics

    metrics = ControllerMetrics()
    zone = ZoneWeights(weight=1.0, share=50, health=1.0, success=1.0, p95_ms=1.0, util=0.1, samples=100, state="ok",
                       reasons=())
    bad = HOSTS["az-b"][:2]
    view = decide(fleet(set(bad)), pins(bad[0]))[GLOBAL_VIEW]
    metrics.observe_zones({"az-a": zone, "az-b": zone}, sick_entries(view.judgement, view.decision.zones))
    metrics.observe_controls(pinned=1, hosts_off=False, ignored=3)

    def samples() -> dict:
        text = metrics.render().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}

    got = samples()
    assert got[("azprobe_controller_sick_hosts", (("az", "az-b"),))] == 1
    assert got[("azprobe_controller_sick_hosts", (("az", "az-a"),))] == 0
    assert got[("azprobe_controller_pinned_hosts", ())] == 1
    assert got[("azprobe_controller_control_keys_ignored", ())] == 3
    assert got[("azprobe_controller_host_naming_off", ())] == 0
    metrics.observe_zones({"az-a": zone})  # a zone that leaves the decision leaves the gauge
    assert ("azprobe_controller_sick_hosts", (("az", "az-b"),)) not in samples()
