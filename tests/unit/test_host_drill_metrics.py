"""The host drill's pure parts: Envoy's text /clusters per host, the admin samples that
carry them, the zone and host shares by Envoy's counters, and the scenarios' sick zones."""

from __future__ import annotations

import json

from azprobe.dev.demo.scenarios import get_scenario
from azprobe.dev.drill.hostdrill import DEGRADED_FLAG, host_drill_phases, host_share, zone_shares
from azprobe.dev.drill.metrics import AdminSample, parse_admin
from azprobe.dev.lab.http import host_flags

CLUSTERS = b"""backend::observability_name::backend
backend::198.18.2.10:8080::rq_total::120
backend::198.18.2.10:8080::health_flags::healthy
backend::198.18.2.10:8080::zone::az-b
backend::198.18.2.11:8080::rq_total::7
backend::198.18.2.11:8080::health_flags::/degraded_eds_health
azprobe-xds::/tmp/x.sock::rq_total::3
"""


def test_text_clusters_give_each_hosts_requests_and_flags() -> None:
    hosts = host_flags(CLUSTERS, "backend")
    assert hosts == {"198.18.2.10:8080": {"rq_total": 120, "health_flags": "healthy"},
                     "198.18.2.11:8080": {"rq_total": 7, "health_flags": "/degraded_eds_health"}}
    assert DEGRADED_FLAG in str(hosts["198.18.2.11:8080"]["health_flags"])


def test_admin_samples_keep_the_hosts_and_old_lines_still_parse() -> None:
    new = {"t": 2.0, "zones": {"az-b": {"rq_total": 127}}, "hosts": host_flags(CLUSTERS, "backend")}
    old = {"t": 1.0, "zones": {"az-b": {"rq_total": 100}}}
    samples = parse_admin(json.dumps(new) + "\n" + json.dumps(old) + "\n")
    assert [s.t for s in samples] == [1.0, 2.0]
    assert samples[0].host_rq == {} and samples[1].host_rq["198.18.2.11:8080"] == 7
    assert samples[1].host_flags["198.18.2.11:8080"] == "/degraded_eds_health"


def test_shares_come_from_counter_deltas_inside_the_window() -> None:
    admin = [AdminSample(0.0, {"az-a": 0, "az-b": 0}, {"a:1": 0, "b:1": 0, "b:2": 0}),
             AdminSample(1.0, {"az-a": 10, "az-b": 10}, {"a:1": 10, "b:1": 10, "b:2": 0}),
             AdminSample(2.0, {"az-a": 60, "az-b": 60}, {"a:1": 60, "b:1": 59, "b:2": 1})]
    assert zone_shares(admin, 1.0, 2.0) == {"az-a": 50.0, "az-b": 50.0}
    assert host_share(admin, ["b:2"], 1.0, 2.0) == 0.01
    assert host_share(admin, ["b:2"], 1.5, 2.0) is None  # one sample: no delta
    assert zone_shares(admin, 5.0, 6.0) == {}


def test_one_sick_server_is_no_sick_zone_but_four_of_six_are() -> None:
    azs = ["az-a", "az-b", "az-c"]
    gray, zone = host_drill_phases("gray-host")
    assert gray.sick_azs(azs) == [] and zone.sick_azs(azs) == ["az-b"]
    assert [f.server for f in zone.faults] == [1, 2, 3, 4] and zone.servers_per_az == 6
    assert host_drill_phases("delay-loss") is None and get_scenario("gray-zone").expect_drain


def test_the_drain_by_envoys_counters_starts_where_the_zone_stays_below_one_percent() -> None:
    from azprobe.dev.drill.hostdrill import envoy_drain_s

    zone = [0, 30, 60, 63, 63, 63, 63, 63, 63]  # az-b stops getting requests after t=3
    admin = [AdminSample(float(t), {"az-a": 100 * t, "az-b": n}) for t, n in enumerate(zone)]
    assert envoy_drain_s(admin, ["az-b"], 0.0, 8.0) == 3.0
    assert envoy_drain_s(admin, ["az-b"], 0.0, 4.0) is None  # held for less than MIN_HOLD_S
    assert envoy_drain_s(admin[:3], ["az-b"], 0.0, 8.0) is None  # never drained
