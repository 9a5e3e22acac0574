"""envoy-eds rendering: Envoy v3 field names (checked by envoy-data-plane's generated
classes, which reject unknown fields), the weight policy, and endpoint validation."""

import json
import warnings

import pytest

with warnings.catch_warnings():  # the generated classes trip pydantic deprecation warnings
    warnings.simplefilter("ignore")
    from envoy_data_plane.envoy.config.endpoint.v3 import ClusterLoadAssignment
    from envoy_data_plane.envoy.service.discovery.v3 import DiscoveryResponse

from azprobe.consumers.localities import locality_weights
from azprobe.consumers.envoy import (CLA_TYPE, parse_endpoints, render_bytes,
                           render_cluster_load_assignment, watch_decision)
from azprobe.consumers.failover import effective_shares, failover_zones
from azprobe.errors import ConfigError
from azprobe.consumers.watch import EMPTY, FRESH, STALE
from azprobe.contracts.weights import WeightsDoc, ZoneWeights


def doc_with(shares: dict[str, int], generation: int = 7) -> WeightsDoc:
    zones = {az: ZoneWeights(1.0 if s > 20 else 0.2, s, 0.9, 0.99, 10.0, 0.3, 100, "ok") for az, s in shares.items()}
    return WeightsDoc(generation=generation, generated_at=1.0, expires_at=2.0, leader="ctl-1",
                      model="default", state="ok", zones=zones)


ENDPOINTS = {"az-a": ["198.18.1.10:8080", "198.18.1.11:8080"], "az-b": ["[2001:2::5]:9000"],
             "az-c": ["198.18.3.10:8080"]}


def parse_as_envoy(rendered: dict) -> ClusterLoadAssignment:
    response = DiscoveryResponse.from_dict(rendered)  # packs resources into Any by @type
    assert [r.type_url for r in response.resources] == [CLA_TYPE]
    return ClusterLoadAssignment.parse(response.resources[0].value)


def test_output_parses_as_envoy_v3_cluster_load_assignment():
    rendered = render_cluster_load_assignment("backend", ENDPOINTS, doc_with({"az-a": 85, "az-b": 15}))
    cla = parse_as_envoy(json.loads(json.dumps(rendered)))
    assert cla.cluster_name == "backend"
    by_zone = {e.locality.zone: e for e in cla.endpoints}
    assert by_zone["az-a"].load_balancing_weight == 85
    assert by_zone["az-b"].load_balancing_weight == 15
    sockets = [lb.endpoint.address.socket_address for lb in by_zone["az-a"].lb_endpoints]
    assert [(s.address, s.port_value) for s in sockets] == [("198.18.1.10", 8080), ("198.18.1.11", 8080)]
    assert by_zone["az-b"].lb_endpoints[0].endpoint.address.socket_address.address == "2001:2::5"
    # the version follows the content, not the generation
    assert rendered["version_info"] != "7"
    again = render_cluster_load_assignment("backend", ENDPOINTS, doc_with({"az-a": 85, "az-b": 15}, generation=8))
    assert again == rendered


def test_a_misspelt_field_would_be_caught_by_the_envoy_classes():
    rendered = render_cluster_load_assignment("backend", ENDPOINTS, None)
    rendered["resources"][0]["endpoints"][0]["load_balancing_wieght"] = 3
    with pytest.raises(Exception, match="load_balancing_wieght"):
        DiscoveryResponse.from_dict(rendered)


def test_zone_without_weight_gets_the_smallest_share_never_zero():
    weights = locality_weights(["az-a", "az-b", "az-c"], doc_with({"az-a": 85, "az-b": 15}))
    assert weights == {"az-a": 85, "az-b": 15, "az-c": 15}


def test_no_usable_document_means_equal_weights():
    rendered = render_cluster_load_assignment("backend", ENDPOINTS, None)
    cla = parse_as_envoy(rendered)
    assert {e.load_balancing_weight for e in cla.endpoints} == {1}
    assert rendered["version_info"].startswith("equal-")


def test_zones_in_document_without_endpoints_are_skipped():
    rendered = render_cluster_load_assignment("backend", {"az-a": ["198.18.1.10:80"]},
                                              doc_with({"az-a": 60, "az-z": 40}))
    zones = [e["locality"]["zone"] for e in rendered["resources"][0]["endpoints"]]
    assert zones == ["az-a"]
    assert rendered["resources"][0]["endpoints"][0]["load_balancing_weight"] == 60


def test_rendering_is_deterministic():
    doc = doc_with({"az-a": 85, "az-b": 15})
    endpoints = parse_endpoints(ENDPOINTS, "f")
    assert render_bytes("backend", endpoints, doc) == render_bytes("backend", dict(reversed(endpoints.items())), doc)


@pytest.mark.parametrize("data,pattern", [
    ({}, r"expected a non-empty mapping"),
    ([], r"expected a non-empty mapping"),
    ({"az-a": []}, r"f: az-a: expected a non-empty list"),
    ({"az-a": "198.18.1.1:80"}, r"f: az-a: expected a non-empty list"),
    ({"az-a": ["198.18.1.1"]}, r"f: az-a\[0\]: '198.18.1.1' is not ip:port"),
    ({"az-a": ["198.18.1.1:0"]}, r"f: az-a\[0\]"),
    ({"az-a": ["198.18.1.1:70000"]}, r"f: az-a\[0\]"),
    ({"az-a": ["backend.local:80"]}, r"f: az-a\[0\]: .*not an IP address"),
    ({"az-a": ["2001:2::5:80"]}, r"IPv6 needs brackets"),
    ({"az-a": [80]}, r"f: az-a\[0\]: expected \"ip:port\""),
    ({"az-a": ["198.18.1.1:80", "198.18.1.1:80"]}, r"f: az-a\[1\]: .* listed already, at f: az-a\[0\]"),
    # across AZs and spellings: Envoy keeps one copy, and the later locality has no hosts
    ({"az-a": ["198.18.1.1:80"], "az-b": ["198.18.1.2:80", "198.18.1.1:80"]},
     r"f: az-b\[1\]: '198.18.1.1:80' is listed already, at f: az-a\[0\]"),
    ({"az-a": ["[2001:db8::1]:80", "[2001:DB8:0::1]:80"]}, r"f: az-a\[1\]: .* listed already, at f: az-a\[0\]"),
    ({"az-a": ["[fe80::1%eth0]:80"]}, r"f: az-a\[0\]: .*scoped IPv6 address"),
])
def test_bad_endpoints_name_the_entry(data, pattern):
    with pytest.raises(ConfigError, match=pattern) as exc:
        parse_endpoints(data, "f")
    assert exc.value.exit_code == 2


def test_endpoints_are_parsed_to_their_canonical_address():
    # Envoy and gRPC compare the address as written: one spelling per host
    assert parse_endpoints({"az-a": ["[2001:DB8:0::1]:80", "198.18.1.1:80"]}, "f") == {
        "az-a": [("2001:db8::1", 80), ("198.18.1.1", 80)]}


def test_watch_decision_holds_the_file_while_consul_is_unreachable():
    doc = doc_with({"az-a": 100})
    assert watch_decision(doc, FRESH, False, True) == (True, doc)
    assert watch_decision(None, STALE, False, True) == (True, None)       # expired: equal
    assert watch_decision(None, EMPTY, True, True) == (True, None)        # key absent: equal
    assert watch_decision(None, EMPTY, False, True) == (False, None)      # unreachable: hold file
    assert watch_decision(None, EMPTY, False, False) == (True, None)      # no file yet: equal


# --- drained zones: Envoy priority 1 (azprobe.consumers.failover) ---

def drained_doc(az_b_share: int, az_b_state: str = "degraded", generation: int = 9) -> WeightsDoc:
    zones = {"az-a": ZoneWeights(1.0, 100 - az_b_share - 49, 0.99, 0.999, 5.0, 0.3, 100, "ok"),
             "az-b": ZoneWeights(0.14, az_b_share, 0.2, 0.95, 400.0, 0.3, 100, az_b_state),
             "az-c": ZoneWeights(1.0, 49, 0.99, 0.999, 5.0, 0.3, 100, "ok")}
    return WeightsDoc(generation=generation, generated_at=1.0, expires_at=2.0, leader="ctl-1",
                      model="default", state="degraded", zones=zones)


def priorities(rendered: dict) -> dict[str, int]:
    cla = parse_as_envoy(rendered)
    return {e.locality.zone: e.priority for e in cla.endpoints}


def test_a_drained_zone_is_rendered_at_failover_priority():
    rendered = render_cluster_load_assignment("backend", ENDPOINTS, drained_doc(1))
    assert priorities(rendered) == {"az-a": 0, "az-b": 1, "az-c": 0}


def test_a_degraded_zone_still_in_its_dwell_keeps_priority_zero():
    assert priorities(render_cluster_load_assignment("backend", ENDPOINTS, drained_doc(30))) == \
        {"az-a": 0, "az-b": 0, "az-c": 0}


def test_an_operator_shift_is_failover_too_but_a_low_ok_zone_is_not():
    assert failover_zones(drained_doc(1, "shifted"), ["az-a", "az-b", "az-c"]) == {"az-b"}
    assert failover_zones(drained_doc(1, "ok"), ["az-a", "az-b", "az-c"]) == set()


def test_never_every_zone_at_failover_priority():
    # only az-b has endpoints and it is drained: nothing to fail over from, so it stays at 0
    rendered = render_cluster_load_assignment("backend", {"az-b": ["198.18.2.10:80"]}, drained_doc(1))
    assert priorities(rendered) == {"az-b": 0}
    assert failover_zones(None, ["az-a"]) == set()


def test_effective_shares_give_drained_zones_nothing():
    shares = effective_shares(drained_doc(1))
    assert shares["az-b"] == 0.0
    assert abs(sum(shares.values()) - 100.0) < 1e-9 and shares["az-a"] == 100.0 * 50 / 99


def test_version_changes_with_the_content_only():
    a = render_cluster_load_assignment("backend", ENDPOINTS, drained_doc(1, generation=1))
    b = render_cluster_load_assignment("backend", ENDPOINTS, drained_doc(1, generation=2))
    c = render_cluster_load_assignment("backend", ENDPOINTS, drained_doc(30, generation=3))
    assert a["version_info"] == b["version_info"] != c["version_info"]
