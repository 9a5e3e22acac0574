"""Mutual TLS for the pulls: a real Controller pulls fake agents over mutual TLS
(real handshakes on loopback, certificates from tests/pki.py) and publishes to a real
devconsul. A node speaks only as itself: every refusal below is one line naming its cause
and adds no vote; ten agents behind one certificate are at most one vantage point; an
agent's certificate replaced on disk is used by the next handshake, without a restart."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import consul
import pytest

from azprobe.controller.config import parse_config
from azprobe.controller.main import Controller
from azprobe.security.tls import TlsFiles, identity_client_context
from tests.controller_harness import drive_rounds, read_weights
from tests.fakeagent import FakeAgent, FakeAgentServer, PathSpec
from tests.pki import TestCA

AZS = ["az-a", "az-b", "az-c"]
IDENTITY = "spiffe://lab.test/azprobe/node/{node}"
DOWN = PathSpec(dst="az-b", conn_attempts=50, failures=50, rtt_ms=2000.0)


def _spiffe(node: str) -> str:
    return IDENTITY.replace("{node}", node)


class Fleet:
    """A test CA, the controller's client certificate, and agents each served over HTTPS
    by a FakeAgentServer of its own, with its own node certificate."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path / "pki"
        self.ca = TestCA.create(self.dir, "lab-ca")
        self.controller = self.ca.issue("controller", uri=["spiffe://lab.test/azprobe/controller"])
        self.servers: list[FakeAgentServer] = []
        self.agents: dict[str, FakeAgent] = {}
        self.urls: list[str] = []

    def serve(self, agents: dict[str, FakeAgent], cert_node: str, *, ca: TestCA | None = None,
              expired: bool = False, stem: str | None = None, also: tuple[str, ...] = ()) -> FakeAgentServer:
        """One server for `agents` (keys: URL paths), with the certificate of `cert_node`
        (and of the nodes `also` names: one certificate with several identities)."""
        leaf = (ca or self.ca).issue(cert_node, uri=[_spiffe(n) for n in (cert_node, *also)], expired=expired,
                                     file_stem=stem)
        server = FakeAgentServer(tls=TlsFiles(leaf.cert_file, leaf.key_file, self.ca.cert_file)).start()
        self.servers.append(server)
        for key, agent in agents.items():
            self.agents[key] = agent
            self.urls.append(server.add(key, agent))
        return server

    def close(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    try:
        yield f
    finally:
        f.close()


def _controller(devconsul, fleet: Fleet, *, client_cert: bool = True, **agents: object) -> Controller:
    tls = {"ca_file": fleet.ca.cert_file, "cert_file": fleet.controller.cert_file,
           "key_file": fleet.controller.key_file}
    config = parse_config({
        "controller": {"name": "ctl", "listen": "127.0.0.1:9", "interval_s": 0.2, "evaluation_window_s": 2.0,
                       "lock_delay_s": 0},
        "consul": {"address": devconsul.url, "prefix": f"azprobe/{uuid.uuid4().hex[:8]}/"},
        "agents": {"static": fleet.urls, "identity": IDENTITY, "tls": tls, **agents},
        "topology": {"azs": AZS},
        "safety": {"drain_dwell_s": 1.0},
    })
    ctl = Controller(config)
    if not client_cert:  # a controller that presents no certificate: the same CA, no chain
        ctl.collector._http._ssl = identity_client_context(TlsFiles(ca_file=fleet.ca.cert_file), "agents.tls")
    return ctl


def _rounds(devconsul, ctl: Controller, agents: dict[str, FakeAgent], rounds: int,
            between: Callable[[int], None] | None = None) -> list:
    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    key = ctl.config.consul.prefix + "weights"
    docs = drive_rounds(ctl, agents.values(), lambda: read_weights(client, key), rounds=rounds, before_pull=between)
    ctl.consul.election.release()
    return docs


def _honest(fleet: Fleet, per_az: int = 1) -> None:
    for az in AZS:
        for i in range(per_az):
            node = f"node-{az}-{i}"
            fleet.serve({node: FakeAgent(node, az, [PathSpec(dst=d, conn_attempts=50) for d in AZS])}, node)


def _voters(ctl: Controller) -> set[str]:
    return set(ctl.collector.store.node_input())


def test_three_agents_over_mutual_tls_publish_weights(devconsul, fleet):
    _honest(fleet)
    ctl = _controller(devconsul, fleet)
    docs = _rounds(devconsul, ctl, fleet.agents, 6)
    assert docs[-1] is not None and set(docs[-1].zones) == set(AZS)
    assert _voters(ctl) == {f"node-{az}-0" for az in AZS}
    assert all(u.startswith("https://") for u in fleet.urls)
    assert sum(ctl.collector.guard.refused.values()) == 0 and sum(ctl.collector.guard.handshake_failures.values()) == 0
    render = ctl.metrics.render().decode()
    assert 'azprobe_controller_agent_identity_refused_total{reason="mismatch"} 0.0' in render
    assert "BEGIN" not in render


@contextlib.contextmanager
def _warnings(caplog) -> Iterator[list[str]]:
    lines: list[str] = []
    with caplog.at_level(logging.WARNING, logger="azprobe.controller.agent_identity"):
        yield lines
    lines.extend(r.getMessage() for r in caplog.records if r.name == "azprobe.controller.agent_identity")


@pytest.mark.parametrize("case, reason, cause", [
    ("other_ca", "unknown_ca", "not signed by the configured CA"),
    ("expired", "expired", "certificate has expired"),
    ("node_a_as_node_b", "mismatch", "with the certificate of node 'node-a'"),
    ("no_client_certificate", "client_certificate_refused", "refuses this side's client certificate"),
])
def test_each_refusal_names_its_cause_and_adds_no_vote(devconsul, fleet, tmp_path, caplog, case, reason, cause):
    _honest(fleet)
    bad = FakeAgent("node-b", "az-a", [DOWN, PathSpec(dst="az-a"), PathSpec(dst="az-c")])
    if case == "other_ca":
        fleet.serve({"node-b": bad}, "node-b", ca=TestCA.create(tmp_path / "other", "other-ca"))
    elif case == "expired":
        fleet.serve({"node-b": bad}, "node-b", expired=True)
    elif case == "node_a_as_node_b":
        fleet.serve({"node-b": bad}, "node-a")
    ctl = _controller(devconsul, fleet, client_cert=case != "no_client_certificate")
    with _warnings(caplog) as lines:
        _rounds(devconsul, ctl, fleet.agents, 4)
    guard = ctl.collector.guard
    counted = guard.refused if reason in guard.refused else guard.handshake_failures
    assert counted[reason] >= 3, (guard.refused, guard.handshake_failures)
    assert "node-b" not in _voters(ctl)
    if case == "no_client_certificate":  # every agent refuses it: nothing at all is a vote
        assert _voters(ctl) == set()
    mine = [line for line in lines if cause in line]
    assert len(mine) >= 1 and all("\n" not in line and "BEGIN" not in line for line in lines), lines
    per_url: dict[str, int] = {}
    for line in lines:
        url = line.split(":", 3)[:3]
        per_url[":".join(url)] = per_url.get(":".join(url), 0) + 1
    assert max(per_url.values()) == 1, lines  # once a minute per agent, not once a pull
    if case == "node_a_as_node_b":
        assert "'node-b'" in mine[0] and "'node-a'" in mine[0]
    cursor = next(c for c in ctl.collector.cursors.values() if c.failures)
    assert cause in cursor.last_error


def test_ten_agents_sharing_one_certificate_are_at_most_one_vantage_point(devconsul, fleet):
    """9 honest nodes (3 per AZ) see every zone fine; 10 liars in az-a behind one
    certificate claim 10 node names and az-b down. Plain HTTP would count them as 10 nodes
    of 19, a majority of az-a's view; here at most the one the certificate names is heard."""
    _honest(fleet, per_az=3)
    liars = {f"liar-{i}": FakeAgent(f"liar-{i}", "az-a", [DOWN, PathSpec(dst="az-a"), PathSpec(dst="az-c")])
             for i in range(10)}
    fleet.serve(liars, "liar-0")
    ctl = _controller(devconsul, fleet)
    docs = _rounds(devconsul, ctl, fleet.agents, 16)
    heard = {n for n in _voters(ctl) if n.startswith("liar-")}
    assert len(heard) <= 1, heard
    assert ctl.collector.guard.refused["mismatch"] >= 9 * 12  # every liar but liar-0, (nearly) every round
    shares = {az: z.share for az, z in docs[-1].zones.items()}
    assert max(shares.values()) - min(shares.values()) <= 2, shares
    assert docs[-1].state == "ok"


def test_one_certificate_naming_two_nodes_is_one_vantage_point(devconsul, fleet):
    _honest(fleet)
    twins = {n: FakeAgent(n, "az-a", [DOWN, PathSpec(dst="az-a"), PathSpec(dst="az-c")]) for n in ("twin-x", "twin-y")}
    fleet.serve(twins, "twin-x", also=("twin-y",))
    ctl = _controller(devconsul, fleet)
    _rounds(devconsul, ctl, fleet.agents, 4)
    assert len({n for n in _voters(ctl) if n.startswith("twin-")}) == 1
    assert ctl.collector.guard.refused["shared_certificate"] >= 3


def test_an_agent_certificate_replaced_on_disk_is_used_by_the_next_handshake(devconsul, fleet, monkeypatch):
    monkeypatch.setattr("azprobe.security.tls.CHECK_EVERY_S", 0.0)
    _honest(fleet)
    ctl = _controller(devconsul, fleet)
    seen: list[str] = []  # the certificate node-az-a-0 answered each round with
    server = fleet.servers[0]

    def answered_with() -> str:
        (conn,) = [c for conns in ctl.collector._http._idle.values() for c in conns
                   if c.peer is not None and _spiffe("node-az-a-0") in c.peer.names]
        return conn.peer.serial

    def rotate(i: int) -> None:
        if i > 0:  # before round i: how round i - 1 was answered
            seen.append(answered_with())
        if i == 2:  # the rotation: the same paths, a new certificate and key
            fleet.ca.issue("node-az-a-0", uri=[_spiffe("node-az-a-0")], file_stem="node-az-a-0")

    # Six rounds for five answers: the collector closes its connections after the last one.
    docs = _rounds(devconsul, ctl, fleet.agents, 6, between=rotate)
    assert len(set(seen)) == 2, seen  # before, and from the first connection after the rotation on
    assert seen[:2] == [seen[0]] * 2 and seen[2:] == [seen[-1]] * 3
    assert server.tls is not None and server.tls.generation == 2
    assert "node-az-a-0" in _voters(ctl) and docs[-1] is not None
    assert sum(ctl.collector.guard.refused.values()) == 0


def test_agents_discovered_in_the_catalog_are_pulled_over_https(devconsul, fleet):
    """discover = "consul" with [agents.tls]: the catalog gives addresses, the controller
    builds https URLs, and the certificates, not the catalog, say which node answered."""
    import json

    agents = {}
    for az in AZS:
        node = f"node-{az}-0"
        agents[node] = FakeAgent(node, az, [PathSpec(dst=d, conn_attempts=50) for d in AZS])
        leaf = fleet.ca.issue(node, uri=[_spiffe(node)])
        server = FakeAgentServer(tls=TlsFiles(leaf.cert_file, leaf.key_file, fleet.ca.cert_file)).start()
        fleet.servers.append(server)
        server.add("", agents[node])
        body = {"Node": node, "Address": "127.0.0.1", "NodeMeta": {"az": az},
                "Service": {"Service": "azprobe-agent", "Port": server.port}}
        assert devconsul.request("PUT", "/v1/catalog/register", body=json.dumps(body)).status == 200
    ctl = _controller(devconsul, fleet, discover="consul")
    docs = _rounds(devconsul, ctl, agents, 6)
    assert {c.target.url for c in ctl.collector.cursors.values()} == {
        f"https://127.0.0.1:{s.port}" for s in fleet.servers}
    assert _voters(ctl) == set(agents) and docs[-1] is not None and set(docs[-1].zones) == set(AZS)
