"""The binding of an agent's certificate to the node its answer names (controller/agent_identity.py):
the check on the names a verified handshake gave (the handshakes themselves are in
tests/integration/test_controller_mtls.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from azprobe.clients.transport import ClosedAfterHandshake, PeerCertificate
from azprobe.controller.agent_identity import CERTIFICATE_HOLD_S, AgentGuard, node_in
from azprobe.security.tls import TlsFiles
from tests.pki import TestCA

SPIFFE = "spiffe://cluster.local/azprobe/node/{node}"


@pytest.fixture
def clock() -> list[float]:
    """The guard's clock: moved by the test."""
    return [1000.0]


@pytest.fixture
def guard(tmp_path: Path, clock: list[float]) -> AgentGuard:
    ca = TestCA.create(tmp_path, "ca")
    me = ca.issue("controller", uri=["spiffe://cluster.local/azprobe/controller"])
    return AgentGuard(TlsFiles(me.cert_file, me.key_file, ca.cert_file), SPIFFE, clock=lambda: clock[0])


def peer(*names: str, fingerprint: str = "f1") -> PeerCertificate:
    return PeerCertificate(names, "0A1B", fingerprint)


@pytest.mark.parametrize("template, name, node", [
    (SPIFFE, "spiffe://cluster.local/azprobe/node/node-a", "node-a"),
    (SPIFFE, "spiffe://cluster.local/azprobe/node/", None),
    (SPIFFE, "spiffe://other.domain/azprobe/node/node-a", None),
    ("{node}.agents.example", "node-a.agents.example", "node-a"),
    ("{node}.agents.example", "agents.example", None),
])
def test_the_node_a_san_names(template, name, node):
    assert node_in(template, name) == node


def test_exact_san_passes_and_anything_else_is_refused_with_both_names(guard, caplog):
    assert guard.check("https://a", peer("node-a.lab", SPIFFE.format(node="node-a")), "node-a") == ""
    why = guard.check("https://b", peer(SPIFFE.format(node="node-a"), fingerprint="f2"), "node-b\x1b[2J")
    assert "'node-a'" in why and "node-b" in why and "\x1b" not in why + caplog.text
    assert "no SAN" in guard.check("https://c", peer("node-c.lab", fingerprint="f3"), "node-c")
    assert guard.check("https://d", None, "node-d").startswith("identity refused")
    assert guard.refused == {"mismatch": 1, "no_identity": 1, "shared_certificate": 0, "not_tls": 1}


def test_one_url_per_certificate_until_it_is_silent(guard, clock):
    both = peer(SPIFFE.format(node="x"), SPIFFE.format(node="y"))
    assert guard.check("https://x", both, "x") == ""
    assert "one URL per certificate" in guard.check("https://y", both, "y")
    clock[0] += CERTIFICATE_HOLD_S
    guard.new_cycle()
    assert guard.check("https://y", both, "y") == ""
    assert guard.refused["shared_certificate"] == 1


def test_failures_are_counted_every_time_and_logged_once_a_minute(guard, caplog):
    caplog.set_level(logging.WARNING, logger="azprobe.controller.agent_identity")
    for _ in range(5):
        assert "refuses this side's client certificate" in guard.describe("https://a", ClosedAfterHandshake("x refuses this side's client certificate"))
    assert guard.handshake_failures["client_certificate_refused"] == 5
    assert len(caplog.records) == 1
    assert guard.describe("https://a", ConnectionRefusedError(111, "refused")) == "[Errno 111] refused"


def test_without_tls_everything_passes():
    g = AgentGuard(None, "")
    assert not g.enabled and g.check("http://a", None, "node-a") == "" and g.context() is g.context()


def test_the_controllers_own_certificate_rotates_and_a_reload_rereads_it(tmp_path, monkeypatch):
    monkeypatch.setattr("azprobe.security.tls.CHECK_EVERY_S", 0.0)
    ca = TestCA.create(tmp_path, "ca")
    me = ca.issue("controller", uri=["spiffe://cluster.local/azprobe/controller"])
    files = TlsFiles(me.cert_file, me.key_file, ca.cert_file)
    g = AgentGuard(files, SPIFFE)
    first = g.context()
    ca.issue("controller", uri=["spiffe://cluster.local/azprobe/controller"])  # the same paths, new material
    assert g.context() is not first and g.rotating is not None and g.rotating.generation == 2
    g.apply(files, SPIFFE)  # SIGHUP with the same files: read again
    assert g.rotating.generation == 3
    Path(me.cert_file).write_text("-----BEGIN CERTIFICATE-----\ntruncated\n")
    kept = g.context()  # a half-written file keeps the running material
    assert g.context() is kept and g.rotating.generation == 3
