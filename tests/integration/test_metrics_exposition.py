"""Both daemons' /metrics as Prometheus's own linter sees them: a real scrape of a running
agent (on the BPF probe, and on the sock_diag collector) and of a running controller
(devconsul, fake agents over HTTP) passes `promtool check metrics` with nothing to
report, and every family in it is one azprobe.contracts.prom defines, with its type.

Topology az-a = 127.0.0.6 (the agent's AZ), az-b = 127.0.0.7: no other test uses them.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from azprobe.agent.sockdiag import SockDiagCollector
from tests.agent_harness import latest_seq, running_agent
from azprobe.contracts import prom
from tests.controller_harness import ControllerProcess
from tests.fakeagent import FakeAgentServer, PathSpec, zone_agents
from tests.helpers import refused_port, wait_for

PROMTOOL = Path("/usr/bin/promtool")  # scripts/setup-host.sh: Debian package prometheus
A, B = "127.0.0.6", "127.0.0.7"
CONFIG = f"""
[node]
name = "exposition"
az = "az-a"
[agent]
interval_s = 0.2
[topology]
az-a = ["{A}/32"]
az-b = ["{B}/32"]
"""


def promtool_check(text: str) -> tuple[int, str]:
    """(exit code, everything promtool printed) for `promtool check metrics < text`."""
    assert PROMTOOL.exists(), f"{PROMTOOL} missing: run `make setup` (Debian package prometheus)"
    result = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True,
                            timeout=60)
    return result.returncode, result.stdout + result.stderr


def families(text: str) -> dict[str, str]:
    """Family name (a counter's without `_total`) -> type, as a Prometheus client parses it."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def assert_clean(text: str) -> None:
    code, output = promtool_check(text)
    assert (code, output) == (0, ""), output
    defined = {f.name: f.kind for f in prom.defined_families()}
    scraped = families(text)
    undefined = {name: kind for name, kind in scraped.items() if defined.get(name) != kind}
    assert not undefined, f"not defined in azprobe.contracts.prom (or with another type): {undefined}"


def _value(text: str, series: str) -> float:
    """The sum of a series' samples (all label sets) in a scrape."""
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == series)


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("agent") / "agent.toml"
    path.write_text(CONFIG)
    return path


@contextlib.contextmanager
def _connections() -> Iterator[Callable[[], None]]:
    """exchange(): one more connect from az-a to az-b that exchanges data and stays open
    (the sock_diag collector sees srtt only on open sockets); all closed on exit."""
    listener = socket.create_server((B, 0))
    held: list[socket.socket] = []

    def exchange() -> None:
        client = socket.create_connection(listener.getsockname(), timeout=5, source_address=(A, 0))
        server, _ = listener.accept()
        held.extend((client, server))
        client.sendall(b"ping" * 64)
        assert server.recv(4096)
        server.sendall(b"pong")
        assert client.recv(16) == b"pong"

    try:
        yield exchange
    finally:
        for sock in held:
            sock.close()
        listener.close()


def _refused_connect() -> None:
    with refused_port(B) as port, socket.socket() as client:
        client.bind((A, 0))
        with pytest.raises(ConnectionRefusedError):
            client.connect((B, port))


@pytest.fixture(params=[pytest.param("bpf", marks=pytest.mark.kernel), "sockdiag"])
def agent_scrape(request, config_file) -> Iterator[str]:
    """A /metrics scrape of a real agent that counted connects and RTT samples on az-a -> az-b."""
    bpf = request.param == "bpf"
    collector = None if bpf else SockDiagCollector()
    try:
        with running_agent(config_file, probe=collector) as agent:
            wait_for(lambda: latest_seq(agent) >= 1, timeout=10, message="first window")

            def counted(field: str) -> int:
                return agent.path_totals().get(("az-a", "az-b"), {}).get(field, 0)

            def rtt_samples() -> int:
                hists = agent.path_histograms().get(("az-a", "az-b"))
                return sum(hists["rtt_us"].counts.values()) if hists else 0

            with _connections() as exchange:
                # One exchange per poll until the agent counted a connect and an RTT sample
                # (the BPF probe samples RTT in one kernel tick in rtt_sample_ticks).
                wait_for(lambda: exchange() or (counted("conn_ok") and rtt_samples()), timeout=30, interval=0.05,
                         message="a connect and an RTT sample counted on az-a -> az-b")
                if bpf:
                    _refused_connect()
                    wait_for(lambda: counted("conn_refused") >= 1, timeout=10, message="the refused connect")
                with urllib.request.urlopen(f"{agent.url}/metrics", timeout=5) as resp:
                    yield resp.read().decode()
    finally:
        if collector is not None:
            collector.close()


def test_a_running_agents_scrape_passes_promtool(agent_scrape):
    assert_clean(agent_scrape)
    # The scrape carries what promtool should judge: path counters, a filled histogram,
    # its hit counters, the node's identity and its scalars.
    assert _value(agent_scrape, prom.COUNTER_SERIES["conn_ok"]) >= 1
    assert _value(agent_scrape, f"{prom.HISTOGRAM_FAMILY['rtt_us']}_count") >= 1
    assert _value(agent_scrape, prom.HITS_SERIES["rtt_us"]) >= 1
    assert _value(agent_scrape, prom.INFO_SERIES) == 1
    scraped = families(agent_scrape)
    assert scraped[prom.LOST.name] == "counter" and prom.agent_scalar("window_seq").name in scraped
    assert prom.agent_scalar("untracked_connects_total").name in scraped


def test_a_running_controllers_scrape_passes_promtool(devconsul, tmp_path):
    server = FakeAgentServer(interval_s=0.2)
    sick = {"az-c": PathSpec(dst="az-c", conn_attempts=50, failures=10, rtt_ms=210.0)}
    for key, agent in zone_agents(["az-a", "az-b", "az-c"], 2, sick=sick).items():
        server.add(key, agent)
    with server, ControllerProcess.make(tmp_path, "ctl-1", devconsul.url, [server.url(k) for k in server.agents]) \
            as ctl:
        wait_for(lambda: (ctl.metric(prom.controller_total(prom.KV_PREFIX, "writes").series) or 0) >= 1,
                 timeout=30, message="a weights write")
        wait_for(lambda: (ctl.metric(f"{prom.CYCLE.name}_count") or 0) >= 5, timeout=30, message="five cycles")
        text = (ctl.get("/metrics") or b"").decode()
    assert_clean(text)
    assert _value(text, prom.ZONE_SHARE.series) == 100 and _value(text, prom.LEADER.series) == 1
    scraped = families(text)
    assert prom.controller_total(prom.TOPOLOGY_PREFIX, "paths_unknown_dst").name in scraped
    assert prom.ZONE_RTT_P95.name in scraped and prom.SPIKES.name in scraped
