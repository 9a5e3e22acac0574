"""Several servers per AZ and `lab fault --host` on the real kernel: a fault aimed at one
server of an AZ slows and drops only traffic toward that server; the AZ's other server
and every other AZ stay clean. Checked with connect-time stopwatches run in a client node,
real echo round trips, and the lab's per-server nft counters."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

import pytest

from azprobe.dev.lab import Lab, LabSpec, unique_lab_name
from azprobe.dev.lab import netns

pytestmark = [pytest.mark.lab, pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root")]

DELAY_MS = 50.0
AZPROBE = [sys.executable, "-m", "azprobe.commands.cli"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with Lab.up(LabSpec(name=unique_lab_name("hs"), azs=3, servers_per_az=2, ipv6=True,
                        state_dir=tmp_path_factory.mktemp("lab"), traffic=False)) as running:
        yield running


def _median_ms(lab: Lab, dst: str, server: int, ipv6: bool = False) -> float:
    result = lab.connect_probe("az-a", dst, count=7, server=server, ipv6=ipv6)
    assert result.ok == 7, result
    return statistics.median(result.connect_ms)


def _medians(lab: Lab, ipv6: bool = False) -> dict[tuple[str, int], float]:
    return {(dst, j): _median_ms(lab, dst, j, ipv6) for dst in lab.azs for j in (0, 1)}


def _cli(lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AZPROBE, "lab", *args, "--name", lab.name, "--state-dir", str(lab.state_dir)],
                          capture_output=True, text=True, timeout=60)


def test_servers_have_their_own_namespaces_addresses_and_listeners(lab):
    assert lab.plan.servers_per_az == 2
    addrs = [a for az in lab.azs for a in lab.server_addrs(az)] + \
            [a for az in lab.azs for a in lab.server_addrs(az, ipv6=True)]
    assert len(set(addrs)) == 12
    present = set(netns.list_lab_namespaces(lab.name))
    assert {s.ns for s in lab.plan.servers} <= present
    for az in lab.azs:
        for j in (0, 1):
            assert lab.connect_probe("az-a", az, count=1, server=j).ok == 1
            assert lab.connect_probe("az-a", az, count=1, server=j, ipv6=True).ok == 1


@pytest.mark.parametrize("ipv6", [False, True], ids=["ipv4", "ipv6"])
def test_host_delay_hits_only_that_server(lab, ipv6):
    sick = lab.server_addr("az-b", server=1)  # aimed by its IPv4 address: every address of it
    baseline = _medians(lab, ipv6)
    before = lab.host_counters(sick)
    out = _cli(lab, "fault", "--host", sick, "--delay-ms", str(DELAY_MS))
    try:
        assert out.returncode == 0, out.stderr
        assert lab.plan.zone("az-b").servers[1].ns in out.stdout
        delayed = _medians(lab, ipv6)
        after = lab.host_counters(sick)
    finally:
        assert _cli(lab, "clear", "--host", sick).returncode == 0
    for (dst, j), ms in delayed.items():
        if (dst, j) == ("az-b", 1):
            expected = baseline[(dst, j)] + DELAY_MS
            assert abs(ms - expected) <= 0.1 * expected, (dst, j, baseline, delayed)
        else:  # a misplaced 50 ms delay would fail this generous bound
            assert ms < baseline[(dst, j)] + 5.0, (dst, j, baseline, delayed)
    assert after["syns"] - before["syns"] == 7 and after["delay"] - before["delay"] >= 7
    other = lab.host_counters(lab.server_addr("az-b", server=0))
    assert other["delay"] == 0
    assert lab.counters("az-b")["delay"] == 0  # a host fault is not a fault toward the AZ
    assert lab.host_faults() == {} and lab.faults() == {}


def test_host_loss_drops_only_that_servers_packets_on_real_round_trips(lab):
    sick, healthy = lab.server_addr("az-b", server=1), lab.server_addr("az-b", server=0)
    lab.fault_host(sick, syn_loss_pct=100)
    try:
        assert lab.host_faults()[lab.plan.zone("az-b").servers[1].ns]["syn_loss_pct"] == 100
        before_sick, before_ok = lab.host_counters(sick), lab.host_counters(healthy)
        assert lab.connect_probe("az-a", "az-b", count=3, timeout_s=0.3, server=1).timeout == 3
        assert lab.connect_probe("az-a", "az-b", count=3, server=0).ok == 3
        assert lab.connect_probe("az-a", "az-c", count=3, server=1).ok == 3
        assert lab.host_counters(sick)["syn_loss"] - before_sick["syn_loss"] >= 3
        assert lab.host_counters(healthy)["syn_loss"] == before_ok["syn_loss"]
    finally:
        lab.clear()  # every fault, the host faults too
    assert lab.host_faults() == {}
    assert lab.connect_probe("az-a", "az-b", count=2, server=1).ok == 2


def test_bad_host_exits_2_naming_the_field(lab):
    out = _cli(lab, "fault", "--host", "198.18.0.1", "--delay-ms", "5")
    assert out.returncode == 2 and "host" in out.stderr, (out.returncode, out.stderr)
    out = _cli(lab, "fault", "--host", lab.server_addr("az-b"), "--az", "az-b", "--delay-ms", "5")
    assert out.returncode == 2 and "exactly one" in out.stderr, out.stderr
