"""Per-destination-host summaries from the real probe on the real kernel, driven by
loopback TCP in the root namespace: two servers of one AZ are two hosts of one path, each
with its own connects and srtt samples; a refusing host shows its failures; a table of one
host counts the second as dropped, in the windows and on /metrics.

Addresses 127.0.22.0/24 are this module's alone (test_probe_loopback has 127.0.0.2-5), so
exact counts on these hosts are ours.
"""

from __future__ import annotations

import json
import socket
import tomllib
import urllib.request

import pytest

from azprobe.agent.config import parse_agent_config
from azprobe.agent.probe import Probe
from tests.agent_harness import host_total, hosts_dropped, latest_seq, path_total, running_agent
from tests.helpers import EchoServer, wait_for

pytestmark = pytest.mark.kernel

A, B1, B2, C = "127.0.22.1", "127.0.22.2", "127.0.22.3", "127.0.22.4"
CONFIG = f"""
[node]
name = "hosts"
az = "az-a"
[agent]
interval_s = 0.2
[topology]
az-a = ["{A}/32"]
az-b = ["{B1}/32", "{B2}/32"]
az-c = ["{C}/32"]
"""
AGENT_CONFIG = parse_agent_config(tomllib.loads(CONFIG))


def _exchange(server: EchoServer, size: int = 2000) -> None:
    """One connect from az-a's address to `server` and one echoed exchange."""
    with socket.create_connection((server.host, server.port), timeout=5, source_address=(A, 0)) as s:
        s.sendall(b"x" * size)
        got = b""
        while len(got) < size:
            got += s.recv(65536)


@pytest.fixture
def servers():
    started = [EchoServer(B1), EchoServer(B2)]
    try:
        yield started
    finally:
        for server in started:
            server.close()


def _refused(dst: str) -> None:
    """A connect the kernel refuses: a port bound but not listening."""
    closed = socket.socket()
    closed.bind((dst, 0))
    try:
        with socket.socket() as s:
            s.bind((A, 0))
            with pytest.raises(ConnectionRefusedError):
                s.connect(closed.getsockname())
    finally:
        closed.close()


def _settle(agent, after: int, addr: str, dst: str, field: str, want: int) -> int:
    """Wait for a host's count to reach `want`, then one more window so late extras show."""
    wait_for(lambda: host_total(agent, after, "az-a", dst, addr, field) >= want, timeout=30,
             message=f"{field} of host {addr} >= {want}; windows' hosts: "
                     f"{[h for w in agent.ring.after(after) for h in w.hosts]}")
    seq = latest_seq(agent)
    wait_for(lambda: latest_seq(agent) > seq, timeout=5, message="one more window")
    return host_total(agent, after, "az-a", dst, addr, field)


def test_two_servers_of_one_az_are_two_hosts_with_their_own_counts(servers):
    with running_agent(AGENT_CONFIG) as agent:
        wait_for(lambda: latest_seq(agent) >= 1, timeout=5, message="first window")
        start = latest_seq(agent)
        b1, b2 = servers
        for _ in range(3):
            _exchange(b1)
        for _ in range(5):
            _exchange(b2)
        _refused(C)
        _refused(C)
        assert _settle(agent, start, B1, "az-b", "connects", 3) == 3
        assert _settle(agent, start, B2, "az-b", "connects", 5) == 5
        assert _settle(agent, start, C, "az-c", "failures", 2) == 2
        assert host_total(agent, start, "az-a", "az-c", C, "connects") == 2
        assert host_total(agent, start, "az-a", "az-b", B1, "failures") == 0
        assert host_total(agent, start, "az-a", "az-b", B2, "failures") == 0
        # The hosts add up to their path.
        assert path_total(agent, start, "az-a", "az-b", "conn_attempts") == 8
        # srtt is sampled one tick in 4: exchange until each host has samples of its own.
        for server, addr in ((b1, B1), (b2, B2)):
            def sampled(server=server, addr=addr) -> bool:
                _exchange(server)
                return host_total(agent, start, "az-a", "az-b", addr, "rtt") >= 2
            wait_for(sampled, timeout=30, interval=0.05, message=f"srtt samples of host {addr}")
        assert hosts_dropped(agent, start) == 0
        # The served windows carry the section, and /metrics the counter.
        doc = json.load(urllib.request.urlopen(f"{agent.url}/v1/windows?after={start}", timeout=5))
        served = {(h["dst"], h["addr"]) for w in doc["windows"] for h in w.get("hosts", [])}
        assert {("az-b", B1), ("az-b", B2), ("az-c", C)} <= served
        metrics = urllib.request.urlopen(f"{agent.url}/metrics", timeout=5).read().decode()
        assert "azprobe_hosts_dropped_total 0.0" in metrics


def test_a_full_host_table_counts_the_next_host_as_dropped(servers):
    probe = Probe.load(max_hosts=1)
    try:
        with running_agent(AGENT_CONFIG, probe=probe) as agent:
            wait_for(lambda: latest_seq(agent) >= 1, timeout=5, message="first window")
            start = latest_seq(agent)
            b1, b2 = servers
            _exchange(b1)
            assert _settle(agent, start, B1, "az-b", "connects", 1) == 1
            for _ in range(3):
                _exchange(b2)
            wait_for(lambda: hosts_dropped(agent, start) >= 3, timeout=30, message="3 dropped connects")
            assert host_total(agent, start, "az-a", "az-b", B2, "connects") == 0
            # Every connect still counts on its path; only the host summary is left out.
            wait_for(lambda: path_total(agent, start, "az-a", "az-b", "conn_ok") >= 4, timeout=30,
                     message="4 connects on az-a -> az-b")
            assert agent.gauges()["hosts_dropped_total"] == probe.hosts_dropped >= 3
            metrics = urllib.request.urlopen(f"{agent.url}/metrics", timeout=5).read().decode()
            assert f"azprobe_hosts_dropped_total {float(probe.hosts_dropped)}" in metrics
    finally:
        probe.close()


def test_max_hosts_0_compiles_the_hosts_out(servers):
    probe = Probe.load(max_hosts=0)
    try:
        with pytest.raises(KeyError):
            probe.bpf[b"hosts"]  # no table, and no host code in the handlers
        with running_agent(AGENT_CONFIG, probe=probe) as agent:
            wait_for(lambda: latest_seq(agent) >= 1, timeout=5, message="first window")
            start = latest_seq(agent)
            _exchange(servers[0])
            wait_for(lambda: path_total(agent, start, "az-a", "az-b", "conn_ok") >= 1, timeout=30,
                     message="the connect on its path")
            assert all(not w.hosts and not w.hosts_dropped for w in agent.ring.after(start))
    finally:
        probe.close()
