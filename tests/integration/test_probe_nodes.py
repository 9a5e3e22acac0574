"""`[node] addresses` on the real kernel: in a lab with two client nodes in one AZ (two
namespaces, each with its own IPv4 and IPv6 address), an agent configured with one
node's addresses counts exactly that node's connections; an agent without addresses
counts both. Ground truth: the connect probe's own counts, run in each node."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import threading

import pytest

from azprobe.agent.config import load_agent_config
from tests.agent_harness import latest_seq, path_total, running_agent
from azprobe.dev.lab import Lab, LabSpec, unique_lab_name
from tests.helpers import wait_for

pytestmark = [pytest.mark.kernel, pytest.mark.lab, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces and BPF")]

INTERVAL_S = 0.5
# Different counts per node, so a count that leaked from the other node cannot match.
CONNECTS = {0: 7, 1: 4}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    spec = LabSpec(name=unique_lab_name("nd"), azs=2, nodes_per_az=2, ipv6=True,
                   state_dir=tmp_path_factory.mktemp("lab"), traffic=False)
    with Lab.up(spec) as lab:
        yield lab


def _connect_from_both_nodes(lab: Lab, ipv6: bool) -> dict[int, int]:
    """Both nodes of az-a connect to az-b's server at the same time; returns each node's
    own count of established connects."""
    results = {}

    def run(node: int) -> None:
        results[node] = lab.connect_probe("az-a", "az-b", count=CONNECTS[node], ipv6=ipv6, node=node)

    threads = [threading.Thread(target=run, args=(n,)) for n in CONNECTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {n: r.ok for n, r in results.items()}


def _counted(agent, start: int, expected: int) -> dict[str, int]:
    wait_for(lambda: path_total(agent, start, "az-a", "az-b", "conn_ok") >= expected, timeout=10,
             message=f"{expected} connects in the agent's windows")
    seq = latest_seq(agent)
    wait_for(lambda: latest_seq(agent) >= seq + 1, timeout=10, message="one more window")
    return {f: path_total(agent, start, "az-a", "az-b", f) for f in ("conn_attempts", "conn_ok")}


@pytest.mark.parametrize("ipv6", [False, True], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("node", [0, 1])
def test_agent_counts_only_its_own_nodes_connections(lab, node, ipv6):
    vantage = lab.plan.node("az-a", node)
    config = dataclasses.replace(load_agent_config(lab.node_agent_config_path(vantage)), interval_s=INTERVAL_S)
    assert config.node == vantage.name
    assert config.addresses == tuple(ipaddress.ip_address(a) for a in vantage.addresses)
    with running_agent(config) as agent:
        wait_for(lambda: latest_seq(agent) >= 1, timeout=10, message="a first window")
        start = latest_seq(agent)
        ok = _connect_from_both_nodes(lab, ipv6)
        assert ok == CONNECTS
        counted = _counted(agent, start, ok[node])
    assert counted == {"conn_attempts": ok[node], "conn_ok": ok[node]}, (node, ok)


def test_agent_without_addresses_counts_every_node(lab):
    config = dataclasses.replace(load_agent_config(lab.agent_config_path), interval_s=INTERVAL_S)
    assert config.addresses == ()
    with running_agent(config) as agent:
        wait_for(lambda: latest_seq(agent) >= 1, timeout=10, message="a first window")
        start = latest_seq(agent)
        ok = _connect_from_both_nodes(lab, ipv6=False)
        counted = _counted(agent, start, sum(ok.values()))
    assert counted == {"conn_attempts": sum(CONNECTS.values()), "conn_ok": sum(CONNECTS.values())}
