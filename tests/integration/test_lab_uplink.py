"""`lab fault --from AZ` (an AZ's uplink) on the real kernel: everything the AZ's client
nodes send is hit, toward every AZ, and nothing the other AZs' nodes send; `--az` still
hits only traffic toward one AZ. Checked with connect-time stopwatches run in each node
and the lab's nft counters."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from azprobe.dev.lab import Lab, LabSpec, unique_lab_name
from azprobe.dev.lab.netns import pid_alive

pytestmark = [pytest.mark.lab, pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root")]

DELAY_MS = 50.0
AZPROBE = [sys.executable, "-m", "azprobe.commands.cli"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with Lab.up(LabSpec(name=unique_lab_name("up"), azs=3, nodes_per_az=2, ipv6=True,
                        state_dir=tmp_path_factory.mktemp("lab"), traffic=False)) as running:
        yield running


@pytest.fixture
def clean(lab):
    yield lab
    lab.clear()


def _median_ms(lab: Lab, src: str, dst: str, node: int, ipv6: bool = False) -> float:
    result = lab.connect_probe(src, dst, count=7, node=node, ipv6=ipv6)
    assert result.ok == 7, result
    return statistics.median(result.connect_ms)


def _all_medians(lab: Lab, ipv6: bool = False) -> dict[tuple[str, int, str], float]:
    return {(src, node, dst): _median_ms(lab, src, dst, node, ipv6)
            for src in lab.azs for node in (0, 1) for dst in lab.azs}


@pytest.mark.parametrize("ipv6", [False, True], ids=["ipv4", "ipv6"])
def test_uplink_delay_hits_everything_one_az_sends_and_nothing_else(clean, ipv6):
    lab = clean
    baseline = _all_medians(lab, ipv6)
    before = lab.counters("az-b", uplink=True)
    lab.fault("az-b", delay_ms=DELAY_MS, uplink=True)
    delayed = _all_medians(lab, ipv6)
    for (src, node, dst), ms in delayed.items():
        if src == "az-b":  # every node of az-b, toward every AZ (its own included)
            expected = baseline[(src, node, dst)] + DELAY_MS
            assert abs(ms - expected) <= 0.1 * expected, (src, node, dst, baseline, delayed)
        else:  # a misplaced 50 ms delay would fail this generous bound
            assert ms < baseline[(src, node, dst)] + 5.0, (src, node, dst, baseline, delayed)
    after = lab.counters("az-b", uplink=True)
    # 2 nodes x 3 AZs x 7 connects: each SYN went through the uplink's delay line
    assert after["syns"] - before["syns"] == 42 and after["delay"] - before["delay"] >= 42
    assert lab.counters("az-a", uplink=True)["delay"] == 0
    # The uplink fault is not a fault toward az-b.
    assert lab.faults() == {} and lab.faults(uplink=True)["az-b"]["delay_ms"] == DELAY_MS


def test_uplink_loss_drops_only_what_the_az_sends(clean):
    lab = clean
    lab.fault("az-c", syn_loss_pct=100, uplink=True)
    before_c, before_a = lab.counters("az-c", uplink=True), lab.counters("az-a", uplink=True)
    for node in (0, 1):
        assert lab.connect_probe("az-c", "az-a", count=2, timeout_s=0.3, node=node).timeout == 2
        assert lab.connect_probe("az-a", "az-c", count=2, node=node).ok == 2  # replies are not az-c's uplink
    assert lab.counters("az-c", uplink=True)["syn_loss"] - before_c["syn_loss"] == 4
    assert lab.counters("az-a", uplink=True)["syn_loss"] == before_a["syn_loss"]


def test_both_directions_clear_independently(clean):
    lab = clean
    lab.fault("az-b", delay_ms=20, uplink=True)
    lab.fault("az-b", refuse=True)
    line = lab.status()["delay_lines"]["from-az-b"]["pid"]
    lab.clear("az-b", uplink=False)
    assert lab.faults() == {} and "az-b" in lab.faults(uplink=True) and pid_alive(line)
    assert lab.connect_probe("az-a", "az-b", count=2).ok == 2
    lab.clear("az-b", uplink=True)
    assert not pid_alive(line) and lab.faults(uplink=True) == {}
    assert "NFQUEUE" not in lab.exec(lab.router_ns, ["iptables", "-S", "FORWARD"]).stdout


def test_cli_fault_from_and_the_one_direction_rule(clean):
    lab = clean
    common = ["--name", lab.name, "--state-dir", str(lab.state_dir)]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(AZPROBE + ["lab", *args, *common], capture_output=True, text=True, timeout=60)

    both = run("fault", "--az", "az-a", "--from", "az-b", "--loss-pct", "5")
    assert both.returncode == 2 and both.stderr.count("\n") == 1 and "--from" in both.stderr
    neither = run("fault", "--loss-pct", "5")
    assert neither.returncode == 2 and "exactly one" in neither.stderr
    unknown = run("fault", "--from", "az-x", "--loss-pct", "5")
    assert unknown.returncode == 2 and "az-x" in unknown.stderr
    ok = run("fault", "--from", "az-b", "--loss-pct", "5")
    assert ok.returncode == 0 and "from az-b" in ok.stdout, ok.stderr
    status = json.loads(run("status", "--json").stdout)
    assert status["uplink_faults"]["az-b"]["loss_pct"] == 5 and status["faults"] == {}
    assert [n for n in status["azs"]["az-b"]["nodes"]] == [f"{lab.name}-cli-az-b", f"{lab.name}-cli-az-b-1"]
    assert run("clear", "--from", "az-b").returncode == 0
    assert lab.faults(uplink=True) == {}


def test_set_faults_degrades_several_azs_together(clean):
    from azprobe.dev.lab import Fault

    lab = clean
    baseline = {dst: _median_ms(lab, "az-b", dst, 1) for dst in lab.azs}
    lab.set_faults({"az-a": Fault(delay_ms=DELAY_MS), "az-c": Fault(delay_ms=DELAY_MS)})
    lines = lab.status()["delay_lines"]
    assert set(lines) == {"az-a", "az-c"} and all(line["alive"] for line in lines.values())
    for dst in ("az-a", "az-c"):
        expected = baseline[dst] + DELAY_MS
        assert abs(_median_ms(lab, "az-b", dst, 1) - expected) <= 0.1 * expected
    assert _median_ms(lab, "az-b", "az-b", 1) < baseline["az-b"] + 5.0
    assert set(lab.faults()) == {"az-a", "az-c"}
