"""`azprobe agent` as operators run it: the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import child_url, refused_port, wait_for

AZPROBE = [sys.executable, "-m", "azprobe.commands.cli"]
GOOD = """
[node]
name = "cli"
az = "az-a"
[agent]
interval_s = 0.2
[topology]
az-a = ["127.0.0.2/32"]
az-b = ["127.0.0.3/32"]
"""


def _run(*args: str, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*AZPROBE, *args], capture_output=True, text=True, timeout=timeout, **kw)


@pytest.mark.parametrize("body, field", [
    (GOOD + "[extra]\n", "extra: unknown key"),
    (GOOD.replace("interval_s", "intervl_s"), "agent.intervl_s: unknown key"),
    (GOOD + 'az-c = ["127.0.0.300/32"]\n', "topology.az-c: bad CIDR"),
    (GOOD + 'az-c = ["127.0.0.0/8"]\n', "topology.az-c: 127.0.0.0/8 overlaps"),
    (GOOD.replace('az = "az-a"', 'az = "az-z"'), "node.az"),
])
def test_bad_config_exits_2_naming_the_field(tmp_path, body, field):
    cfg = tmp_path / "agent.toml"
    cfg.write_text(body)
    res = _run("agent", "--config", str(cfg))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("azprobe: ") and field in lines[0], res.stderr


def test_missing_config_file_exits_2(tmp_path):
    res = _run("agent", "--config", str(tmp_path / "nope.toml"))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [f"azprobe: {tmp_path / 'nope.toml'}: config file not found "
                                               "(pass --config with an existing file)"]


@pytest.mark.kernel
def test_not_root_exits_1_naming_the_prerequisite():
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        cfg = Path(d) / "agent.toml"
        cfg.write_text(GOOD)
        cfg.chmod(0o644)
        res = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *AZPROBE,
                              "agent", "--config", str(cfg), "--collector", "bpf"], capture_output=True, text=True,
                             timeout=30,
                             cwd=d, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip().splitlines() == [
        "azprobe: not root: loading BPF needs root (CAP_BPF, CAP_PERFMON); run the agent as root"]


def _get(url: str) -> dict:
    return json.load(urllib.request.urlopen(url, timeout=2))


def _healthy(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/healthz", timeout=2) as resp:
        return resp.status == 200


def _start_agent(cfg: Path, address_file: Path) -> subprocess.Popen:
    """An agent on 127.0.0.1 port 0, reporting the port it got in address_file."""
    address_file.unlink(missing_ok=True)
    return subprocess.Popen([*AZPROBE, "-v", "agent", "--config", str(cfg), "--listen", "127.0.0.1:0",
                             "--address-file", str(address_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stop(proc: subprocess.Popen) -> tuple[int, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err


@pytest.mark.kernel
def test_sighup_reload_and_restart_gives_new_boot_id(tmp_path):
    cfg = tmp_path / "agent.toml"
    cfg.write_text(GOOD)
    address_file = tmp_path / "agent.address"
    proc = _start_agent(cfg, address_file)
    try:
        url = child_url(address_file, proc)
        wait_for(lambda: _healthy(url), timeout=20, message="agent healthy")
        first = wait_for(lambda: _get(f"{url}/v1/windows?after=0")["windows"] and _get(f"{url}/v1/windows?after=0"),
                         timeout=5, message="first window")
        assert first["node"] == "cli" and first["windows"][0]["seq"] == 1
        # SIGHUP with az-c added: a refused connect to it lands on az-a -> az-c.
        cfg.write_text(GOOD + 'az-c = ["127.0.0.4/32"]\n')
        proc.send_signal(signal.SIGHUP)

        def refused_on_az_c(port_c: int) -> bool:
            with socket.socket() as s:
                s.bind(("127.0.0.2", 0))
                assert s.connect_ex(("127.0.0.4", port_c)) != 0
            windows = _get(f"{url}/v1/windows?after=0")["windows"]
            return any(p["dst"] == "az-c" and p["conn_refused"] for w in windows for p in w["paths"])

        with refused_port("127.0.0.4") as port_c:
            wait_for(lambda: refused_on_az_c(port_c), timeout=10, interval=0.3,
                     message="refusal on az-a -> az-c after SIGHUP")
        # A bad file on SIGHUP: one error line, the agent keeps running.
        cfg.write_text(GOOD + 'az-c = ["bad"]\n')
        proc.send_signal(signal.SIGHUP)
        seq = _get(f"{url}/v1/windows?after=0")["windows"][-1]["seq"]
        wait_for(lambda: _get(f"{url}/v1/windows?after=0")["windows"][-1]["seq"] > seq + 2, timeout=10,
                 message="agent still ticking after a bad reload")
        assert proc.poll() is None
        windows = _get(f"{url}/v1/windows?after=0")["windows"]
        assert [w["seq"] for w in windows] == list(range(1, len(windows) + 1))
        boot_id = first["boot_id"]
    finally:
        code, err = _stop(proc)
    assert code == 0, err
    assert sum("reload of" in line and "keeping the old topology" in line for line in err.splitlines()) == 1
    cfg.write_text(GOOD)
    proc = _start_agent(cfg, address_file)
    try:
        url = child_url(address_file, proc)
        wait_for(lambda: _healthy(url), timeout=20, message="restarted agent healthy")
        doc = wait_for(lambda: _get(f"{url}/v1/windows?after=0")["windows"] and _get(f"{url}/v1/windows?after=0"),
                       timeout=5, message="first window after restart")
        assert doc["boot_id"] != boot_id and doc["windows"][0]["seq"] == 1
    finally:
        code, err = _stop(proc)
    assert code == 0, err
