"""The real `azprobe agent` speaking sd_notify to a real NOTIFY_SOCKET, the way systemd
runs it under Type=notify + WatchdogSec.

How "stuck" is produced, honestly: AZPROBE_TEST_STALL_FILE makes the loop's own tick
hook block while the file exists, so the agent's collection loop is wedged but the
process (and its HTTP thread) keeps running. If pings came from a timer thread they
would continue, and this test would fail. SIGSTOP would freeze every thread and so
could not tell the two designs apart.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from azprobe.daemon.address_file import format_host_port, read_address_file
from tests.helpers import wait_for

pytestmark = pytest.mark.kernel  # loads BPF: root etc., checked by the conftest (fails under CI)

WATCHDOG_USEC = 1_000_000  # 1 s: a ping at most every 0.5 s
INTERVAL_S = 0.2


def healthz(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


class NotifyListener:
    """The systemd side: a datagram socket that records every notification in order."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)
        self.received: list[tuple[float, dict[str, str]]] = []

    def drain(self) -> list[tuple[float, dict[str, str]]]:
        while True:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                return self.received
            fields = dict(line.split("=", 1) for line in data.decode().split("\n") if "=" in line)
            self.received.append((time.monotonic(), fields))

    def count(self, key: str) -> int:
        return sum(key in m for _, m in self.drain())

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def agent_under_notify(tmp_path):
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[node]\nname = "notify-test"\naz = "az-a"\n'
        f'[agent]\nlisten = "127.0.0.1:0"\ninterval_s = {INTERVAL_S}\nring_size = 50\n'
        f'[topology]\naz-a = ["127.0.0.0/8"]\n')
    listener = NotifyListener(tmp_path / "notify.sock")
    stall = tmp_path / "stall"
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify.sock"),
           "WATCHDOG_USEC": str(WATCHDOG_USEC), "AZPROBE_TEST_STALL_FILE": str(stall)}
    env.pop("WATCHDOG_PID", None)
    address_file = tmp_path / "agent.address"
    proc = subprocess.Popen([sys.executable, "-m", "azprobe.commands.cli", "agent", "--config", str(config),
                             "--address-file", str(address_file)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield proc, listener, address_file, stall
    finally:
        stall.unlink(missing_ok=True)
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        proc.stderr.close()
        listener.close()


def test_agent_notify_ready_watchdog_and_stall(agent_under_notify):
    proc, listener, address_file, stall = agent_under_notify

    # READY=1 only once the probe is loaded and HTTP serves: /healthz must answer the
    # moment READY is seen, and READY is the first thing the agent says.
    wait_for(lambda: proc.poll() is not None or listener.count("READY"), timeout=90,
             message="READY=1 from the agent")
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    address = read_address_file(address_file)  # written before READY: serving on the port it reports
    assert address is not None
    url = f"http://{format_host_port(*address)}"
    assert healthz(url) == 200
    first = listener.received[0][1]
    assert first.get("READY") == "1" and "serving" in first.get("STATUS", "")

    # The loop is alive: pings keep coming, spaced by the rate limit (>= half the interval).
    wait_for(lambda: listener.count("WATCHDOG") >= 4, timeout=15, message="4 WATCHDOG=1 pings")
    ping_times = [t for t, m in listener.drain() if "WATCHDOG" in m]
    assert all(b - a >= WATCHDOG_USEC / 2e6 * 0.9 for a, b in zip(ping_times, ping_times[1:]))

    # Wedge the loop. Once /healthz reports it stale the loop is provably stuck.
    stall.touch()
    wait_for(lambda: healthz(url) == 503, timeout=10, message="/healthz to report the stuck loop")
    pings_when_stuck = listener.count("WATCHDOG")
    # Observe for 3 watchdog periods: systemd would have killed the service by now.
    deadline = time.monotonic() + 3 * WATCHDOG_USEC / 1e6
    while time.monotonic() < deadline:
        assert listener.count("WATCHDOG") == pings_when_stuck, "WATCHDOG=1 sent while the loop was stuck"
        assert proc.poll() is None
        time.sleep(0.05)
    assert healthz(url) == 503  # still alive and serving, just not progressing

    # Unwedge: pings resume.
    stall.unlink()
    wait_for(lambda: listener.count("WATCHDOG") > pings_when_stuck, timeout=10, message="pings to resume")
    wait_for(lambda: healthz(url) == 200, timeout=10, message="/healthz to recover")

    # Shutdown announces itself.
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert listener.count("STOPPING") == 1
