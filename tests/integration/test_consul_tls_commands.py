"""Every other part that reads Consul, run as the operator runs it (a subprocess) against
devconsul with verify_incoming (real handshakes, certificates from tests/pki.py):
`azprobe explain` and `azprobe envoy-eds` with --ca-file/--client-cert/--client-key,
and without a client certificate one line on stderr naming the cause, no traceback;
`azprobe xds serve` and `azprobe scheduler-extender` with a [consul] table carrying
ca_file/cert_file/key_file read the weights."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from azprobe.clients.consul import ConsulSettings, make_client
from azprobe.daemon.address_file import wait_for_address_file
from azprobe.dev.devconsul.testing import DevConsul, DevConsulTls
from tests import xds_harness as h
from tests.helpers import sample_weights_doc, stop_process, wait_for
from tests.pki import Leaf, TestCA

ROOT = Path(__file__).resolve().parents[2]
SHARES = {"az-a": 60, "az-b": 30, "az-c": 10}
GENERATION = 7


@pytest.fixture(scope="module")
def mtls_consul(tmp_path_factory) -> Iterator[tuple[DevConsul, TestCA, Leaf]]:
    """devconsul with verify_incoming, holding a weights document; its CA and a client leaf."""
    base = tmp_path_factory.mktemp("consul-mtls")
    ca = TestCA.create(base / "ca", "commands-ca")
    server = ca.issue("server", dns=["server.dc1.consul"], ips=["127.0.0.1"])
    client = ca.issue("client")
    tls = DevConsulTls(server.cert_file, server.key_file, ca.cert_file, verify_incoming=True,
                       client_cert_file=client.cert_file, client_key_file=client.key_file)
    with DevConsul(tls=tls) as dc:
        admin = make_client(ConsulSettings(address=dc.url, ca_file=ca.cert_file, cert_file=client.cert_file,
                                           key_file=client.key_file))
        assert admin.kv.put("azprobe/v1/weights", sample_weights_doc(GENERATION, SHARES, ttl_s=600).dumps())
        yield dc, ca, client


def _azprobe(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSUL_")}
    return subprocess.run([sys.executable, "-m", "azprobe.commands.cli", *args], capture_output=True, text=True,
                          timeout=15, env=env, cwd=ROOT)


def _assert_one_line_refusal(result: subprocess.CompletedProcess) -> None:
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "refused our TLS handshake" in line and "CONSUL_CLIENT_CERT" in line, line


def _flags(dc: DevConsul, ca: TestCA, client: Leaf | None) -> list[str]:
    flags = ["--consul", dc.url, "--ca-file", ca.cert_file]
    return flags + (["--client-cert", client.cert_file, "--client-key", client.key_file] if client else [])


def test_explain_reads_with_the_flags_and_without_a_client_cert_says_why(mtls_consul):
    dc, ca, client = mtls_consul
    ok = _azprobe("explain", "--json", *_flags(dc, ca, client))
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["generation"] == GENERATION and doc["zones"]["az-a"]["share"] == 60
    _assert_one_line_refusal(_azprobe("explain", *_flags(dc, ca, None)))


def test_envoy_eds_once_writes_the_weights_and_without_a_client_cert_says_why(mtls_consul, tmp_path):
    dc, ca, client = mtls_consul
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps(h.ENDPOINTS))
    out = tmp_path / "eds.json"
    args = ("envoy-eds", "--cluster", "backend", "--endpoints", str(endpoints), "--out", str(out))
    ok = _azprobe(*args, *_flags(dc, ca, client))
    assert ok.returncode == 0 and f"generation {GENERATION}" in ok.stderr, ok.stderr
    written = json.loads(out.read_text())
    assert written and "backend" in out.read_text()
    out.unlink()
    bare = _azprobe(*args, *_flags(dc, ca, None))
    # Without a file Envoy has no endpoints at all: equal weights are written, as --watch
    # does, said on a line of their own before the refusal (and the exit is still 1)
    written, refusal = bare.stderr.strip().splitlines()
    assert "wrote equal weights" in written and "backend" in out.read_text(), written
    _assert_one_line_refusal(subprocess.CompletedProcess(bare.args, bare.returncode, bare.stdout, refusal))


def _consul_table(ca: TestCA, client: Leaf) -> dict[str, str]:
    return {"ca_file": ca.cert_file, "cert_file": client.cert_file, "key_file": client.key_file}


def test_the_xds_server_serves_the_weights_read_through_verify_incoming(mtls_consul, tmp_path):
    dc, ca, client = mtls_consul
    xds = h.XdsProcess(h.write_config(tmp_path, dc.url, consul=_consul_table(ca, client)), tmp_path,
                       env={k: "" for k in os.environ if k.startswith("CONSUL_")})
    try:
        xds.start(timeout_s=10)
        wait_for(lambda: xds.status()["views"]["global"].get("generation") == GENERATION, timeout=5,
                 message="the xDS server's global view at the document's generation")

        async def fetch():
            import grpc

            async with grpc.aio.insecure_channel(xds.address) as ch:
                stream = h.Stream(h.ads_stub(ch).StreamAggregatedResources())
                await stream.send(h.sotw(h.CLA, ["backend"], zone="az-a"))
                response = await stream.recv(5)
                stream.cancel()
                return h.assignment(response.resources[0])

        cla = asyncio.run(fetch())
        h.assert_never_empty(cla)
        weights = {zone: weight for zone, weight, _, _ in h.localities(cla)}
        assert weights["az-a"] > weights["az-b"] > weights["az-c"], weights
        # SIGHUP re-reads the rotated files (certificates, token file) and ends nothing.
        xds.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "rotated file(s) taken" in xds.log.read_text(), timeout=5, message="SIGHUP's log line")
        assert xds.proc.poll() is None and xds.status()["views"]["global"]["generation"] == GENERATION
    finally:
        xds.stop()


def test_the_scheduler_extender_reads_fresh_weights_through_verify_incoming(mtls_consul, tmp_path):
    dc, ca, client = mtls_consul
    table = "".join(f'{k} = "{v}"\n' for k, v in {"address": dc.url, **_consul_table(ca, client)}.items())
    config = tmp_path / "extender.toml"
    config.write_text(f'[extender]\nlisten = "127.0.0.1:0"\n\n[consul]\n{table}')
    address_file, log = tmp_path / "extender.address", tmp_path / "extender.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSUL_")}
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "azprobe.commands.cli", "scheduler-extender", "--config",
                                 str(config), "--address-file", str(address_file)], stdout=sink,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=ROOT)
    try:
        address = wait_for_address_file(address_file, alive=lambda: proc.poll() is None, timeout_s=10)
        assert address is not None, log.read_text()

        def health() -> dict:
            conn = http.client.HTTPConnection(*address, timeout=5)
            try:
                conn.request("GET", "/healthz")
                return json.loads(conn.getresponse().read())
            finally:
                conn.close()

        state = wait_for(lambda: (lambda doc: doc if doc["weights"] == "fresh" else None)(health()), timeout=5,
                         message=f"fresh weights: {log.read_text()[-500:]}")
        assert str(GENERATION) in json.dumps(state), state
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "rotated file(s) taken" in log.read_text(), timeout=5, message="SIGHUP's log line")
        assert proc.poll() is None and health()["weights"] == "fresh"
    finally:
        stop_process(proc)
