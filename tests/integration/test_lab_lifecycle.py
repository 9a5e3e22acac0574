"""Lab up/down on the real kernel: nothing is left behind, labs coexist, the CLI speaks
clearly. Each lab gets a unique name (unique_lab_name) and a tmp state dir."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from azprobe.errors import ConfigError
from azprobe.dev.lab import Lab, LabSpec, TrafficSpec, teardown, unique_lab_name
from azprobe.dev.lab.netns import list_lab_namespaces, pid_alive
from azprobe.dev.lab.state import CLAIM_DIR
from tests.helpers import require_tools, wait_for

pytestmark = pytest.mark.lab  # root and the network tools: checked by the conftest (fails under CI)

AZPROBE = [sys.executable, "-m", "azprobe.commands.cli"]


def _nft_tables_in_root_ns() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout


def _slot_claims(name: str) -> list[str]:
    return [p.name for p in CLAIM_DIR.iterdir() if p.read_text().strip() == name] if CLAIM_DIR.is_dir() else []


def _assert_gone(name: str, pids: list[int]) -> None:
    assert list_lab_namespaces(name) == []
    assert not [p for p in pids if pid_alive(p)], "lab processes survived teardown"
    assert f" {name}\n" not in _nft_tables_in_root_ns()
    assert _slot_claims(name) == []


def _pids(lab: Lab) -> list[int]:
    status = lab.status()
    return [p["pid"] for p in status["processes"]] + [d["pid"] for d in status["delay_lines"].values()]


def test_up_builds_a_working_lab_and_down_leaves_nothing(tmp_path):
    name = unique_lab_name()
    with Lab.up(LabSpec(name=name, azs=2, state_dir=tmp_path / "s", traffic=TrafficSpec(rate=10))) as lab:
        assert sorted(list_lab_namespaces(name)) == sorted(lab.namespaces)
        assert lab.agent_config_path.read_text().count("198.18.") == 2
        # Traffic flows from every client to every AZ, both new and long-lived connections.
        stats = wait_for(lambda: (s := lab.traffic_stats()) and all(
            t["ok"] > 0 and t["requests"] > 0 for c in s.values() for t in c.values()) and len(s) == 2 and s,
            timeout=10, message="traffic from every client to every AZ")
        assert set(stats["az-a"]) == {"az-a", "az-b"}
        lab.fault("az-b", delay_ms=5)
        status = lab.status()
        assert status["healthy"] and status["delay_lines"]["az-b"]["alive"]
        pids = _pids(lab)
        assert len(pids) == 2 + 2 + 2 + 1  # echo servers, HTTP servers, generators, delay line
    _assert_gone(name, pids)
    assert lab.down() == []  # idempotent: nothing left to remove


def test_teardown_when_the_test_body_raises(tmp_path):
    name = unique_lab_name()
    with pytest.raises(RuntimeError, match="boom"):
        with Lab.up(LabSpec(name=name, azs=1, state_dir=tmp_path, traffic=False)) as lab:
            pids = _pids(lab)
            raise RuntimeError("boom")
    _assert_gone(name, pids)


def test_down_by_name_after_a_crash_without_state(tmp_path):
    name = unique_lab_name()
    lab = Lab.up(LabSpec(name=name, azs=2, state_dir=tmp_path, traffic=True))
    pids = _pids(lab)
    (tmp_path / "state.json").unlink()  # as if `lab up` died before writing it
    removed = teardown(name)  # by name alone, default state dir
    assert any(r.startswith("netns ") for r in removed)
    _assert_gone(name, pids)


def test_two_labs_coexist_with_distinct_addresses(tmp_path):
    a, b = unique_lab_name(), unique_lab_name()
    with Lab.up(LabSpec(name=a, azs=2, state_dir=tmp_path / "a", traffic=False)) as lab_a, \
            Lab.up(LabSpec(name=b, azs=2, state_dir=tmp_path / "b", traffic=False)) as lab_b:
        assert lab_a.plan.index != lab_b.plan.index
        assert not lab_a.plan.cidr_v4.overlaps(lab_b.plan.cidr_v4)
        assert lab_a.connect_probe("az-a", "az-b", count=2).ok == 2
        assert lab_b.connect_probe("az-b", "az-a", count=2).ok == 2
        with pytest.raises(ConfigError, match="already up"):
            Lab.up(LabSpec(name=a, state_dir=tmp_path / "c", traffic=False))
    assert list_lab_namespaces(a) == [] and list_lab_namespaces(b) == []


def test_cli_up_fault_status_clear_down(tmp_path):
    name = unique_lab_name()
    sdir = tmp_path / "cli"
    common = ["--name", name, "--state-dir", str(sdir)]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(AZPROBE + ["lab", *args, *common], capture_output=True, text=True, timeout=60)

    try:
        up = run("up", "--azs", "2", "--no-traffic", "--json")
        assert up.returncode == 0, up.stderr
        info = json.loads(up.stdout)
        assert list(info["azs"]) == ["az-a", "az-b"] and info["traffic"] is None
        assert (sdir / "agent.toml").exists()

        bad = run("fault", "--az", "az-x", "--delay-ms", "5")
        assert bad.returncode == 2
        assert bad.stderr.strip() == f"azprobe: az: no AZ 'az-x' in lab '{name}' (choose one of: az-a, az-b)"

        assert run("fault", "--az", "az-b", "--refuse").returncode == 0
        status = json.loads(run("status", "--json").stdout)
        assert status["faults"]["az-b"]["refuse"] is True and status["healthy"]

        assert run("clear", "--az", "az-b").returncode == 0
        assert json.loads(run("status", "--json").stdout)["faults"] == {}
    finally:
        down = run("down")
    assert down.returncode == 0 and "netns" in down.stdout
    assert list_lab_namespaces(name) == []
    again = run("down")
    assert again.returncode == 0 and "nothing was up" in again.stdout


def test_cli_without_root_says_so(tmp_path):
    require_tools("setpriv")
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *AZPROBE, "lab", "up",
                           "--name", unique_lab_name(), "--state-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "needs root" in proc.stderr and "sudo" in proc.stderr
