"""envoy-eds rendering: Envoy v3 field names (checked by envoy-data-plane's generated
classes, which reject unknown fields), the weight policy, and endpoint validation."""

import json
import warnings

import pytest

with warnings.catch_warnings():  # the generated classes trip pydantic deprecation warnings
    warnings.simplefilter("ignore")
    from envoy_data_plane.envoy.config.endpoint.v3 import ClusterLoadAssignment
    from envoy_data_plane.envoy.service.discovery.v3 import DiscoveryResponse

from azprobe.consumers.envoy import (CLA_TYPE, locality_weights, parse_endpoints, render_bytes,
                           render_cluster_load_assignment, watch_decision)
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
    assert rendered["version_info"] == "7"


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
    assert rendered["version_info"] == "equal"


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
    ({"az-a": ["198.18.1.1:80", "198.18.1.1:80"]}, r"f: az-a: lists an endpoint twice"),
])
def test_bad_endpoints_name_the_entry(data, pattern):
    with pytest.raises(ConfigError, match=pattern) as exc:
        parse_endpoints(data, "f")
    assert exc.value.exit_code == 2


def test_watch_decision_holds_the_file_while_consul_is_unreachable():
    doc = doc_with({"az-a": 100})
    assert watch_decision(doc, FRESH, False, True) == (True, doc)
    assert watch_decision(None, STALE, False, True) == (True, None)       # expired: equal
    assert watch_decision(None, EMPTY, True, True) == (True, None)        # key absent: equal
    assert watch_decision(None, EMPTY, False, True) == (False, None)      # unreachable: hold file
    assert watch_decision(None, EMPTY, False, False) == (True, None)      # no file yet: equal
