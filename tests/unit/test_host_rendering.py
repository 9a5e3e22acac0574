"""Sick hosts on both EDS doors (azprobe/consumers/localities.py): their endpoints are
DEGRADED, at most a third of a zone's at once, worst first; weights and lists unchanged."""

from __future__ import annotations

import pytest

from azprobe.consumers.envoy import render_cluster_load_assignment
from azprobe.consumers.localities import degraded_endpoints, plan_localities, sick_addresses
from azprobe.consumers.xds import resources
from azprobe.consumers.xds.snapshot import build_snapshot, chain_entries
from azprobe.contracts.weights_hosts import HostsDoc, SickHostEntry
from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from tests.helpers import sample_weights_doc

AZ_B = [(f"198.18.2.{10 + i}", 8080) for i in range(6)]
ENDPOINTS = {"az-a": [("198.18.1.10", 8080), ("198.18.1.11", 8080), ("198.18.1.12", 8080)], "az-b": AZ_B}
SICK = {"az-b": ["198.18.2.13", "198.18.2.11", "198.18.2.10"]}  # worst first


def test_a_third_at_most_worst_first():
    assert degraded_endpoints(AZ_B, SICK["az-b"]) == {("198.18.2.13", 8080), ("198.18.2.11", 8080)}
    assert degraded_endpoints(AZ_B[:2], ["198.18.2.10"]) == frozenset()  # 2 endpoints: a third is 0
    assert degraded_endpoints(AZ_B[:3], ["198.18.2.99", "198.18.2.12"]) == {("198.18.2.12", 8080)}
    # a host's endpoints go together: a worse host that does not fit is not passed over for a lesser one
    two_ports = [("198.18.2.10", 1), ("198.18.2.10", 2), *AZ_B[1:4]]
    assert degraded_endpoints(two_ports, ["198.18.2.10", "198.18.2.11"]) == frozenset()
    # addresses match in canonical form
    assert degraded_endpoints([("2001:2::0:5", 1), ("2001:2::6", 1), ("2001:2::7", 1)], ["2001:2::5"]) == \
        {("2001:2::0:5", 1)}


@pytest.mark.parametrize("weights", [None, sample_weights_doc(1, {"az-a": 50, "az-b": 50})])
def test_plan_keeps_every_endpoint_and_weight(weights):
    plain = plan_localities(ENDPOINTS, weights)
    marked = plan_localities(ENDPOINTS, weights, SICK)
    assert [(p.zone, p.weight, p.priority, p.endpoints) for p in plain] == \
        [(p.zone, p.weight, p.priority, p.endpoints) for p in marked]
    assert all(p.weight >= 1 and p.endpoints for p in marked)
    assert [len(p.degraded) for p in marked] == [0, 2]


def test_file_eds_marks_degraded():
    rendered = render_cluster_load_assignment("backend", ENDPOINTS, sample_weights_doc(1, {"az-a": 50, "az-b": 50}),
                                              SICK)
    az_b = rendered["resources"][0]["endpoints"][1]
    status = {e["endpoint"]["address"]["socket_address"]["address"]: e.get("health_status") for e in az_b["lb_endpoints"]}
    assert status == {"198.18.2.10": None, "198.18.2.11": "DEGRADED", "198.18.2.12": None, "198.18.2.13": "DEGRADED",
                      "198.18.2.14": None, "198.18.2.15": None}
    assert az_b["load_balancing_weight"] == 50
    plain = render_cluster_load_assignment("backend", ENDPOINTS, sample_weights_doc(1, {"az-a": 50, "az-b": 50}))
    assert "DEGRADED" not in str(plain) and plain["version_info"] != rendered["version_info"]


def test_xds_marks_degraded():
    eps = {"backend": ENDPOINTS}
    snap = build_snapshot("global", eps, None, chain_entries(eps), SICK)
    cla = endpoint_pb2.ClusterLoadAssignment()
    snap.entries(resources.ENDPOINT)["backend"].resource.Unpack(cla)
    statuses = {e.endpoint.address.socket_address.address: e.health_status
                for loc in cla.endpoints for e in loc.lb_endpoints}
    assert sorted(a for a, s in statuses.items() if s == health_check_pb2.DEGRADED) == ["198.18.2.11", "198.18.2.13"]
    assert all(loc.load_balancing_weight.value >= 1 and loc.lb_endpoints for loc in cla.endpoints)
    plain = build_snapshot("global", eps, None, chain_entries(eps))
    assert plain.system_version != snap.system_version


def test_sick_addresses_of_a_view():
    doc = HostsDoc(generation=1, generated_at=1.0, expires_at=2.0,
                   global_view={"az-b": (SickHostEntry("198.18.2.13"), SickHostEntry("198.18.2.11"))},
                   from_views={"az-a": {"az-b": (SickHostEntry("198.18.2.12"),)}})
    assert sick_addresses(doc) == {"az-b": ["198.18.2.13", "198.18.2.11"]}
    assert sick_addresses(doc, "az-a") == {"az-b": ["198.18.2.12"]}
    assert sick_addresses(None) == {}
