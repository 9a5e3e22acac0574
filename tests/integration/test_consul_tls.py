"""Consul over TLS with verify_incoming (devconsul serving HTTPS, certificates from
tests/pki.py, real handshakes): the controller publishes, `azprobe weights` reads and the
watcher watches with a client certificate; without one each fails with one line naming
the cause and the fix, and no traceback."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from azprobe.clients.consul import ConsulError, ConsulSettings, make_client, read_key
from azprobe.consumers.watch import WeightWatcher
from azprobe.controller.config import parse_config
from azprobe.controller.main import Controller
from azprobe.dev.devconsul.testing import DevConsul, DevConsulTls
from azprobe.security import reloadable
from tests.controller_harness import drive_rounds, read_weights
from tests.fakeagent import FakeAgentServer, zone_agents
from tests.helpers import sample_weights_doc, wait_for
from tests.pki import TestCA

AZS = ["az-a", "az-b", "az-c"]


@pytest.fixture(scope="module")
def tls_consul(tmp_path_factory):
    """(devconsul with verify_incoming, its CA, a client leaf of that CA, a leaf of another CA)."""
    base = tmp_path_factory.mktemp("consul-tls")
    ca, other = TestCA.create(base / "ca", "consul-ca"), TestCA.create(base / "other", "other-ca")
    server = ca.issue("server", dns=["server.dc1.consul", "localhost"], ips=["127.0.0.1"])
    client, stranger = ca.issue("client"), other.issue("stranger")
    tls = DevConsulTls(server.cert_file, server.key_file, ca.cert_file, verify_incoming=True,
                       client_cert_file=client.cert_file, client_key_file=client.key_file)
    with DevConsul(tls=tls) as dc:
        yield dc, ca, client, stranger


def _settings(dc, ca, leaf=None, **kw) -> ConsulSettings:
    return ConsulSettings(address=dc.url, ca_file=ca.cert_file, cert_file=leaf.cert_file if leaf else None,
                          key_file=leaf.key_file if leaf else None, **kw)


def _put_weights(dc, ca, client) -> None:
    assert make_client(_settings(dc, ca, client)).kv.put("azprobe/v1/weights", sample_weights_doc().dumps())


def test_devconsul_refuses_a_handshake_without_a_client_certificate(tls_consul):
    dc, ca, client, stranger = tls_consul
    assert read_key(make_client(_settings(dc, ca, client)), "nothing").value is None
    with pytest.raises(ConsulError) as no_cert:
        read_key(make_client(_settings(dc, ca)), "nothing")
    assert "refused our TLS handshake" in str(no_cert.value) and "CONSUL_CLIENT_CERT" in str(no_cert.value)
    with pytest.raises(ConsulError) as other_ca:
        read_key(make_client(_settings(dc, ca, stranger)), "nothing")
    assert "refused our TLS handshake" in str(other_ca.value), other_ca.value


@pytest.mark.parametrize("case,words", [
    ("no_ca", "not signed by a CA we trust (set CONSUL_CACERT"),
    ("bad_name", "does not name the host we asked for (set CONSUL_TLS_SERVER_NAME"),
    ("plain_http", "closed the connection without an answer"),
])
def test_each_tls_mistake_is_one_line_naming_the_fix(tls_consul, case, words):
    dc, ca, client, _ = tls_consul
    settings = {"no_ca": ConsulSettings(address=dc.url, cert_file=client.cert_file, key_file=client.key_file),
                "bad_name": _settings(dc, ca, client, server_name="other.dc1.consul"),
                "plain_http": ConsulSettings(address=dc.url.replace("https:", "http:"))}[case]
    with pytest.raises(ConsulError) as err:
        read_key(make_client(settings), "nothing")
    assert words in str(err.value) and "\n" not in str(err.value), err.value


def test_the_server_name_is_verified_instead_of_the_address(tls_consul):
    dc, ca, client, _ = tls_consul
    assert read_key(make_client(_settings(dc, ca, client, server_name="server.dc1.consul")), "x").value is None


def _controller(dc, ca, server: FakeAgentServer, leaf) -> Controller:
    consul = {"address": dc.url, "ca_file": ca.cert_file}
    if leaf is not None:
        consul.update(cert_file=leaf.cert_file, key_file=leaf.key_file)
    return Controller(parse_config({
        "controller": {"name": "ctl", "listen": "127.0.0.1:9", "interval_s": 0.2, "evaluation_window_s": 2.0,
                       "lock_delay_s": 0},
        "consul": consul, "agents": {"static": [server.url(k) for k in server.agents]},
        "safety": {"drain_dwell_s": 0}, "topology": {"azs": AZS}}))


def test_a_controller_publishes_through_verify_incoming_and_without_a_cert_says_why(tls_consul, caplog):
    dc, ca, client, _ = tls_consul
    with FakeAgentServer() as server:
        for key, agent in zone_agents(AZS, 1).items():
            server.add(key, agent)
        ctl = _controller(dc, ca, server, client)
        drive_rounds(ctl, server.agents.values(), rounds=3, simulated_clock=False)
        doc = read_weights(make_client(_settings(dc, ca, client)))
        assert doc is not None and sorted(z.share for z in doc.zones.values()) == [33, 33, 34]
        assert ctl.consul.consul_up is True
        ctl.consul.election.release()

        bare = _controller(dc, ca, server, None)
        with caplog.at_level(logging.INFO, logger="azprobe.controller"):
            drive_rounds(bare, server.agents.values(), rounds=1, simulated_clock=False)
    assert bare.consul.consul_up is False and not bare.consul.election.is_leader
    (line,) = [r.getMessage() for r in caplog.records if "consul lost" in r.getMessage()]
    assert "refused our TLS handshake" in line and "consul.cert_file/key_file" in line, line


def test_a_rotated_client_certificate_is_used_by_the_next_connection(tls_consul, tmp_path):
    """The files are replaced on disk; after SIGHUP's reload (or the next check of the
    files) a new connection presents the new certificate: here one Consul refuses."""
    dc, ca, client, stranger = tls_consul
    cert, key = tmp_path / "client.crt", tmp_path / "client.key"
    for src, dst in ((client.cert_file, cert), (client.key_file, key)):
        dst.write_bytes(Path(src).read_bytes())
        dst.chmod(0o600)
    c = make_client(ConsulSettings(address=dc.url, ca_file=ca.cert_file, cert_file=str(cert), key_file=str(key)))
    assert read_key(c, "x").value is None
    for src, dst in ((stranger.cert_file, cert), (stranger.key_file, key)):
        staged = dst.with_suffix(".new")
        staged.write_bytes(Path(src).read_bytes())
        staged.chmod(0o600)
        os.replace(staged, dst)
    assert reloadable.reload_all() >= 1
    with pytest.raises(ConsulError, match="refused our TLS handshake"):
        read_key(c, "x")


def _azprobe(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONSUL_")}
    return subprocess.run([sys.executable, "-m", "azprobe.commands.cli", *args], capture_output=True, text=True,
                          timeout=30, env={**clean, **env})


def test_azprobe_weights_reads_with_consul_env_vars_and_without_a_cert_fails_in_one_line(tls_consul):
    dc, ca, client, stranger = tls_consul
    _put_weights(dc, ca, client)
    env = {"CONSUL_HTTP_ADDR": dc.url, "CONSUL_CACERT": ca.cert_file}
    ok = _azprobe("weights", "--json", env={**env, "CONSUL_CLIENT_CERT": client.cert_file,
                                             "CONSUL_CLIENT_KEY": client.key_file})
    assert ok.returncode == 0 and '"az-a"' in ok.stdout, ok.stderr
    # A flag beats its environment variable, as in Consul's CLI.
    flagged = _azprobe("weights", "--json", "--client-cert", client.cert_file, "--client-key", client.key_file,
                       env={**env, "CONSUL_CLIENT_CERT": stranger.cert_file, "CONSUL_CLIENT_KEY": stranger.key_file})
    assert flagged.returncode == 0, flagged.stderr
    bare = _azprobe("weights", env=env)
    assert bare.returncode == 1 and "Traceback" not in bare.stderr, bare.stderr
    (line,) = bare.stderr.strip().splitlines()
    assert "refused our TLS handshake" in line and "CONSUL_CLIENT_CERT" in line, line


def test_the_watcher_watches_with_a_cert_and_says_why_without(tls_consul):
    dc, ca, client, _ = tls_consul
    _put_weights(dc, ca, client)
    with WeightWatcher(_settings(dc, ca, client), wait_s=1.0) as watcher:
        assert watcher.wait_answered(10) and watcher.snapshot() is not None
    with WeightWatcher(_settings(dc, ca), wait_s=1.0, backoff_cap_s=0.2) as bare:
        status = wait_for(lambda: bare.status() if bare.status().errors else None, message="a failed read")
    assert status.state == "empty" and "refused our TLS handshake" in status.last_error, status.last_error
    assert "CONSUL_CLIENT_CERT" in status.last_error
