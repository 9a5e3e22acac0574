"""Faults on the real kernel, checked against independent stopwatches and counters:
connect times measured in the client namespace, the kernel's own TCP counters, and the
nft counters the lab reports as ground truth."""

from __future__ import annotations

import statistics

import pytest

from azprobe.dev.lab import Lab, LabSpec, TrafficSpec, unique_lab_name
from azprobe.dev.lab.netns import pid_alive
from tests.helpers import wait_for

pytestmark = pytest.mark.lab  # root and the network tools: checked by the conftest (fails under CI)

DELAY_MS = 50.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    # No background traffic: counters then count only what a test sends.
    with Lab.up(LabSpec(name=unique_lab_name(), azs=3, state_dir=tmp_path_factory.mktemp("lab"),
                        traffic=False)) as running:
        yield running


@pytest.fixture
def clean(lab):
    yield lab
    lab.stop_traffic()
    lab.clear()


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def _median_connect_ms(lab: Lab, dst: str, ipv6: bool = False) -> float:
    result = lab.connect_probe("az-a", dst, count=15, ipv6=ipv6)
    assert result.ok == 15, result
    return statistics.median(result.connect_ms)


def test_delay_is_one_way_toward_one_az(clean):
    lab = clean
    baseline = {az: _median_connect_ms(lab, az) for az in lab.azs}
    lab.fault("az-b", delay_ms=DELAY_MS)
    delayed = {az: _median_connect_ms(lab, az) for az in lab.azs}
    expected = baseline["az-b"] + DELAY_MS
    assert abs(delayed["az-b"] - expected) <= 0.1 * expected, (baseline, delayed)
    for az in ("az-a", "az-c"):
        # Relative to the fault, not a stopwatch: a misplaced delay would add all of it.
        assert delayed[az] < baseline[az] + DELAY_MS / 2, (az, baseline, delayed)
    # The replies are not delayed: only the SYNs toward az-b went through the delay line.
    assert lab.counters("az-b")["delay"] >= 15
    assert lab.counters("az-a")["delay"] == 0


def test_clear_stops_the_delay_line(clean):
    lab = clean
    baseline = _median_connect_ms(lab, "az-c")
    lab.fault("az-c", delay_ms=DELAY_MS)
    pid = lab.status()["delay_lines"]["az-c"]["pid"]
    assert pid_alive(pid)
    lab.clear("az-c")
    assert not pid_alive(pid)
    assert "NFQUEUE" not in lab.exec(lab.router_ns, ["iptables", "-S", "FORWARD"]).stdout
    assert _median_connect_ms(lab, "az-c") < baseline + DELAY_MS / 2  # the delay is gone


def test_syn_loss_counts_exactly_the_dropped_syns(clean):
    lab = clean
    lab.fault("az-c", syn_loss_pct=50)
    before, netstat_before = lab.counters("az-c"), lab.netstat(lab.client_ns("az-a"))
    # Timeout below the 1 s SYN RTO: a dropped SYN is never retransmitted, so every
    # timed-out connect is exactly one dropped SYN.
    result = lab.connect_probe("az-a", "az-c", count=16, timeout_s=0.3)
    delta = _delta(before, lab.counters("az-c"))
    assert result.ok > 0 and result.timeout > 0, result
    assert delta["syns"] == 16
    assert delta["syn_loss"] == result.timeout
    assert delta["loss"] == delta["blackhole"] == delta["refuse"] == 0
    assert lab.netstat(lab.client_ns("az-a"))["TcpExtTCPSynRetrans"] == netstat_before["TcpExtTCPSynRetrans"]


def test_blackhole_times_out_one_az_only(clean):
    lab = clean
    lab.fault("az-c", blackhole=True)
    before = lab.counters("az-c")
    assert lab.connect_probe("az-a", "az-c", count=2, timeout_s=0.4).timeout == 2
    assert lab.counters("az-c")["blackhole"] - before["blackhole"] >= 2
    assert lab.connect_probe("az-a", "az-b", count=2).ok == 2


def test_refuse_resets_syns_of_one_az_only(clean):
    lab = clean
    lab.fault("az-b", refuse=True)
    before = lab.counters("az-b")
    assert lab.connect_probe("az-a", "az-b", count=3).refused == 3
    assert lab.counters("az-b")["refuse"] - before["refuse"] == 3
    assert lab.connect_probe("az-a", "az-c", count=2).ok == 2


def test_data_loss_makes_the_kernel_retransmit(clean):
    lab = clean
    client = lab.client_ns("az-a")
    lab.start_traffic(TrafficSpec(rate=5, conns=2, interval_ms=10, clients=("az-a",)))
    netstat_before = lab.netstat(client)
    lab.fault("az-c", loss_pct=20)
    before = lab.counters("az-c")
    wait_for(lambda: lab.counters("az-c")["loss"] - before["loss"] >= 20, timeout=15, message="20 drops toward az-c")
    wait_for(lambda: lab.netstat(client)["TcpRetransSegs"] > netstat_before["TcpRetransSegs"], timeout=10,
             message="kernel retransmits in the client namespace")
    assert lab.counters("az-b")["loss"] == 0


def test_generator_sees_blackhole_as_timeouts(clean):
    lab = clean
    lab.start_traffic(TrafficSpec(rate=20, conns=0, clients=("az-b",), connect_timeout_s=0.3))
    lab.fault("az-a", blackhole=True)
    wait_for(lambda: lab.traffic_stats().get("az-b", {}).get("az-a", {}).get("timeout", 0) >= 1, timeout=15,
             message="generator timeouts toward az-a")
    stats = lab.traffic_stats()["az-b"]
    assert stats["az-c"]["ok"] > 0 and stats["az-c"]["timeout"] == 0


def test_ipv6_delay_and_refuse(tmp_path):
    with Lab.up(LabSpec(name=unique_lab_name(), azs=2, ipv6=True, state_dir=tmp_path, traffic=False)) as lab:
        assert lab.server_addr("az-b", ipv6=True).startswith("2001:2:")
        baseline = _median_connect_ms(lab, "az-b", ipv6=True)
        lab.fault("az-b", delay_ms=DELAY_MS)
        delayed = _median_connect_ms(lab, "az-b", ipv6=True)
        assert abs(delayed - (baseline + DELAY_MS)) <= 0.1 * (baseline + DELAY_MS)
        assert _median_connect_ms(lab, "az-a", ipv6=True) < baseline + DELAY_MS / 2  # az-a not delayed
        lab.fault("az-b", refuse=True)
        before = lab.counters("az-b")["refuse"]
        assert lab.connect_probe("az-a", "az-b", count=2, ipv6=True).refused == 2
        assert lab.counters("az-b")["refuse"] - before == 2
