"""Host summaries against injected truth: a lab of two servers per AZ, traffic off, the
real probe and one in-process agent. An nft rule dropping every SYN toward one server of
az-b shows on that host alone, as timed-out connects and SYN retransmits that equal the
drops nft counted; its neighbour in az-b stays clean."""

from __future__ import annotations

import dataclasses

import pytest

from azprobe.agent.config import load_agent_config
from azprobe.dev.lab import Lab, LabSpec, unique_lab_name
from tests.agent_harness import host_total, latest_seq, path_total, running_agent
from tests.helpers import wait_for

pytestmark = [pytest.mark.kernel, pytest.mark.lab, pytest.mark.slow]

CONNECTS = 3


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    spec = LabSpec(name=unique_lab_name("ph"), azs=3, servers_per_az=2, state_dir=tmp_path_factory.mktemp("lab"),
                   traffic=False)
    with Lab.up(spec) as running:  # removes its namespaces and nft tables also when a test fails
        yield running


@pytest.fixture(scope="module")
def agent(lab):
    config = dataclasses.replace(load_agent_config(lab.agent_config_path), interval_s=0.5)
    with running_agent(config) as a:
        wait_for(lambda: latest_seq(a) >= 2, timeout=10, message="agent windows")
        yield a


def test_a_host_behind_an_nft_drop_shows_failures_and_retransmits(lab, agent):
    sick, healthy = lab.server_addr("az-b", server=1), lab.server_addr("az-b", server=0)
    start = latest_seq(agent)
    drops_before = lab.host_counters(sick)["syn_loss"]
    lab.fault_host(sick, syn_loss_pct=100)
    try:
        # 2.5 s: each connect's SYN is retransmitted (1 s RTO) before it gives up.
        failed = lab.connect_probe("az-a", "az-b", count=CONNECTS, timeout_s=2.5, server=1)
    finally:
        lab.clear_host(sick)
    ok = lab.connect_probe("az-a", "az-b", count=CONNECTS, server=0)
    assert (failed.timeout, ok.ok) == (CONNECTS, CONNECTS)
    drops = lab.host_counters(sick)["syn_loss"] - drops_before
    retransmits = drops - CONNECTS  # every SYN nft dropped but each connect's first
    assert retransmits >= CONNECTS, drops
    wait_for(lambda: host_total(agent, start, "az-a", "az-b", sick, "failures") >= CONNECTS
             and host_total(agent, start, "az-a", "az-b", sick, "retrans") >= retransmits
             and host_total(agent, start, "az-a", "az-b", healthy, "connects") >= CONNECTS,
             timeout=15, message="the sick host's failures and retransmits in windows")
    seq = latest_seq(agent)
    wait_for(lambda: latest_seq(agent) > seq, timeout=5, message="one more window")
    sick_counts = {f: host_total(agent, start, "az-a", "az-b", sick, f) for f in ("connects", "failures", "retrans")}
    assert sick_counts == {"connects": CONNECTS, "failures": CONNECTS, "retrans": retransmits}
    healthy_counts = {f: host_total(agent, start, "az-a", "az-b", healthy, f)
                      for f in ("connects", "failures", "retrans", "rto")}
    assert healthy_counts == {"connects": CONNECTS, "failures": 0, "retrans": 0, "rto": 0}
    # The path holds both hosts: its SYN retransmits are the sick host's.
    assert path_total(agent, start, "az-a", "az-b", "syn_retrans") == retransmits
    assert path_total(agent, start, "az-a", "az-b", "conn_attempts") == 2 * CONNECTS
