"""A daemon that cannot start because of its host or its flags says so in one line naming
the setting and the fix, with the agent's exit codes: the controller's listen address in
use (a missing prerequisite, exit 1), and an --address-file that cannot be written, for
the agent and the controller alike (a bad flag, exit 2). Never a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import refused_port

ROOT = Path(__file__).resolve().parents[2]
AGENT = """[node]
name = "start-errors"
az = "az-a"
[agent]
listen = "127.0.0.1:0"
interval_s = 0.2
[topology]
az-a = ["198.18.0.0/24"]
az-b = ["198.18.1.0/24"]
"""


def _controller_toml(tmp_path: Path, listen: str, consul_port: int) -> Path:
    path = tmp_path / "controller.toml"
    path.write_text(f'[controller]\nname = "ctl"\nlisten = "{listen}"\n[consul]\naddress = '
                    f'"http://127.0.0.1:{consul_port}"\n[agents]\nstatic = ["http://127.0.0.1:{consul_port}"]\n'
                    '[topology]\nazs = ["az-a", "az-b"]\n')
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # subprocess.run kills the child when the timeout passes, so none outlives the test
    return subprocess.run([sys.executable, "-m", "azprobe.commands.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


def _one_line(proc: subprocess.CompletedProcess[str], code: int, start: str, *words: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("azprobe: ")]
    assert proc.returncode == code and "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"azprobe: {start}"), proc.stderr
    assert all(word in lines[0] for word in words), lines[0]


def test_the_controller_listen_address_in_use_is_one_line_and_exit_1(tmp_path):
    with socket.socket() as busy, refused_port() as consul_port:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _run("controller", "--config", str(_controller_toml(tmp_path, f"127.0.0.1:{port}", consul_port)))
    _one_line(proc, 1, f"controller.listen 127.0.0.1:{port}: ", "in use", "set controller.listen")


@pytest.mark.parametrize("address_file, problem", [
    ("missing/addr", "does not exist"),
    ("controller.toml/addr", "is not a directory"),
])
def test_an_address_file_the_controller_cannot_write_is_one_line_and_exit_2(tmp_path, address_file, problem):
    with refused_port() as consul_port:
        proc = _run("controller", "--config", str(_controller_toml(tmp_path, "127.0.0.1:0", consul_port)),
                    "--address-file", str(tmp_path / address_file))
    _one_line(proc, 2, "--address-file: ", problem, "pass a path")


def test_an_address_file_the_agent_cannot_write_is_one_line_and_exit_2(tmp_path):
    config = tmp_path / "agent.toml"
    config.write_text(AGENT)
    proc = _run("agent", "--config", str(config), "--collector", "sockdiag",
                "--address-file", str(tmp_path / "missing" / "addr"))
    _one_line(proc, 2, "--address-file: ", "does not exist", "pass a path")
