"""`azprobe scheduler-extender` as a process, over real HTTP, against a real devconsul:
the documents' incident (the weights key deleted, then Consul stopped, then a stale
document served) never fails a pod or empties a filter; the HTTP bounds answer 400, 408
and 413, never 500; /metrics and /healthz say which weights the answers follow; HTTPS
with real handshakes (certificates from tests/pki.py), mutual TLS refusing a client
without a certificate of the configured CA, and certificates rotated on disk and on
SIGHUP without a restart."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509

from azprobe.clients.consul import ConsulSettings, make_client
from azprobe.security.tls import TlsFiles, client_context
from azprobe.contracts.weights import WeightsDoc, ZoneWeights
from azprobe.daemon.address_file import wait_for_address_file
from azprobe.dev.kube import extender_body, node_object, pod_object
from tests.helpers import stop_process, wait_for
from tests.pki import Leaf, TestCA

KEY = "azprobe/v1/weights"
NODES = [node_object(f"n-{az}-{i}", az) for az in ("az-a", "az-b", "az-c") for i in range(2)]
DRAINED = {"n-az-c-0", "n-az-c-1"}


def drained_doc(generation: int, ttl_s: float, now: float | None = None) -> WeightsDoc:
    now = time.time() if now is None else now
    zones = {"az-a": ZoneWeights(1.0, 50, 0.98, 0.999, 2.0, 0.3, 500, "ok", ()),
             "az-b": ZoneWeights(1.0, 49, 0.98, 0.999, 2.0, 0.3, 500, "ok", ()),
             "az-c": ZoneWeights(0.14, 1, 0.1, 0.6, 900.0, 0.3, 500, "degraded", ("drill",))}
    return WeightsDoc(generation, now, now + ttl_s, "ctl-test", "default", "degraded", zones)


@dataclass
class ExtenderProcess:
    proc: subprocess.Popen[bytes]
    host: str
    port: int
    log: Path

    def request(self, method: str, path: str, body: bytes | None = None, timeout: float = 10.0,
                tls: ssl.SSLContext | None = None) -> tuple[int, bytes]:
        conn = (http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=tls) if tls
                else http.client.HTTPConnection(self.host, self.port, timeout=timeout))
        try:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def post(self, verb: str, body: bytes) -> tuple[int, object]:
        status, out = self.request("POST", f"/{verb}", body)
        return status, json.loads(out)

    def filter_names(self) -> set[str]:
        status, result = self.post("filter", extender_body(pod_object(), NODES))
        assert status == 200 and result["Error"] == ""  # type: ignore[index]
        kept = {n["metadata"]["name"] for n in result["Nodes"]["items"]}  # type: ignore[index]
        assert kept, "a filter left no node"
        return kept

    def health(self) -> dict:
        status, out = self.request("GET", "/healthz")
        assert status == 200
        return json.loads(out)


def start_extender(tmp_path: Path, consul_url: str, extra: str = "") -> Iterator[ExtenderProcess]:
    config = tmp_path / "extender.toml"
    config.write_text(f'[extender]\nlisten = "127.0.0.1:0"\n{extra}\n[consul]\naddress = "{consul_url}"\n')
    address_file, log = tmp_path / "extender.address", tmp_path / "extender.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "azprobe.commands.cli", "scheduler-extender",
                                 "--config", str(config), "--address-file", str(address_file)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        address = wait_for_address_file(address_file, alive=lambda: proc.poll() is None, timeout_s=20)
        assert address is not None, log.read_text()
        yield ExtenderProcess(proc, address[0], address[1], log)
    finally:
        stop_process(proc)


@pytest.fixture
def extender(tmp_path: Path, devconsul) -> Iterator[ExtenderProcess]:
    yield from start_extender(tmp_path, devconsul.url)


def put(url: str, value: str | bytes) -> None:
    assert make_client(ConsulSettings(address=url)).kv.put(KEY, value) is True


def delete(url: str) -> None:
    make_client(ConsulSettings(address=url)).kv.delete(KEY)


def test_the_incident_key_deleted_consul_stopped_stale_document(extender: ExtenderProcess, devconsul) -> None:
    everyone = {n["metadata"]["name"] for n in NODES}
    # No key yet: neutral.
    wait_for(lambda: extender.health()["weights"] == "absent", timeout=20, message="absent weights")
    assert extender.filter_names() == everyone
    # A fresh document drains az-c: its nodes are filtered and score 0.
    put(devconsul.url, drained_doc(1, ttl_s=3).dumps())
    wait_for(lambda: extender.filter_names() == everyone - DRAINED, timeout=20, message="az-c filtered")
    status, scores = extender.post("prioritize", extender_body(pod_object(), node_names=sorted(everyone)))
    assert status == 200 and {s["Host"]: s["Score"] for s in scores}["n-az-c-0"] == 0  # type: ignore[index]

    # 1. The key is deleted: neutral (no answer fails, no filter empties).
    delete(devconsul.url)
    wait_for(lambda: extender.health()["weights"] == "absent", timeout=20, message="neutral after the delete")
    assert extender.filter_names() == everyone

    # 2. A fresh document again, then Consul stops: the held document until it expires, then neutral.
    put(devconsul.url, drained_doc(2, ttl_s=3).dumps())
    wait_for(lambda: extender.filter_names() == everyone - DRAINED, timeout=20, message="az-c filtered again")
    devconsul.kill()
    wait_for(lambda: extender.health()["weights"] == "stale", timeout=20, message="neutral once expired")
    assert extender.filter_names() == everyone
    status, scores = extender.post("prioritize", extender_body(pod_object(), NODES))
    assert status == 200 and {s["Score"] for s in scores} == {5}  # type: ignore[union-attr]

    # 3. Consul is back, serving a stale document (newer, already expired): still neutral.
    devconsul.start()
    now = time.time()
    put(devconsul.url, WeightsDoc(3, now - 0.5, now - 0.2, "ctl-test", "default", "degraded",
                                  drained_doc(3, 1).zones).dumps())
    wait_for(lambda: extender.health()["generation"] is None and "generation 3" in extender.health()["detail"],
             timeout=20, message="the stale generation 3 held")
    assert extender.filter_names() == everyone

    status, metrics = extender.request("GET", "/metrics")
    text = metrics.decode()
    assert status == 200
    assert 'azprobe_extender_neutral_answers_total{reason="absent",verb="filter"}' in text
    assert 'azprobe_extender_neutral_answers_total{reason="stale",verb="filter"}' in text
    assert 'azprobe_extender_weights_state{state="stale"} 1.0' in text
    filtered = re.search(r"^azprobe_extender_filtered_nodes_total (\S+)$", text, re.M)
    assert filtered and float(filtered[1]) >= 2 * len(DRAINED)
    log = extender.log.read_text()
    # One line per change of state, not one per request.
    assert log.count("neutral answers") <= 4, log
    assert "no weights at azprobe/v1/weights" in log


def test_an_unparseable_document_is_neutral(extender: ExtenderProcess, devconsul) -> None:
    put(devconsul.url, b'{"schema": 1, "zones": {}}')
    wait_for(lambda: extender.health()["weights"] == "rejected", timeout=20, message="rejected weights")
    assert extender.filter_names() == {n["metadata"]["name"] for n in NODES}


def test_http_bounds_answer_4xx_never_500(tmp_path: Path, devconsul) -> None:
    for ext in start_extender(tmp_path, devconsul.url, "max_body_bytes = 4096\nrequest_timeout_s = 0.5\n"):
        status, result = ext.post("filter", b'{"NodeNames": [7]}')
        assert status == 400 and "$.NodeNames[0]" in result["Error"]  # type: ignore[index]
        big = extender_body(pod_object(), node_names=[f"node-{i}" for i in range(1000)])
        status, out = ext.request("POST", "/prioritize", big)
        assert status == 413 and b"4096" in out
        # A body that never arrives: 408 at the deadline, not a held connection.
        with socket.create_connection((ext.host, ext.port), timeout=10) as sock:
            sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{")
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
        status, _ = ext.request("GET", "/filter")
        assert status == 405
        status, result = ext.post("prioritize", extender_body(pod_object(), node_names=["a", "b"]))
        assert status == 200 and [r["Score"] for r in result] == [5, 5]  # type: ignore[union-attr]


def test_a_config_error_is_one_line_and_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[nodes]\nname_patterns = ["no-group-.*"]\n')
    result = subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "scheduler-extender", "--config",
                             str(config)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "nodes.name_patterns[0]" in result.stderr and "(?P<zone>...)" in result.stderr


# --- HTTPS ----------------------------------------------------------------------------

@pytest.fixture
def pki(tmp_path: Path) -> tuple[TestCA, Leaf, Leaf]:
    ca = TestCA.create(tmp_path / "pki", "scheduler-ca")
    server = ca.issue("extender", dns=["azprobe-scheduler-extender.azprobe.svc"], ips=["127.0.0.1"])
    scheduler = ca.issue("kube-scheduler")
    return ca, server, scheduler


def tls_lines(server: Leaf, ca_file: str = "") -> str:
    lines = f'tls_cert_file = "{server.cert_file}"\ntls_key_file = "{server.key_file}"\n'
    return lines + (f'tls_ca_file = "{ca_file}"\n' if ca_file else "")


def https_filter(ext: ExtenderProcess, tls: ssl.SSLContext) -> set[str]:
    status, out = ext.request("POST", "/filter", extender_body(pod_object(), NODES), tls=tls)
    assert status == 200, out[:200]
    return {n["metadata"]["name"] for n in json.loads(out)["Nodes"]["items"]}


def test_https_answers_a_client_that_trusts_the_ca(tmp_path: Path, devconsul, pki) -> None:
    ca, server, _ = pki
    for ext in start_extender(tmp_path, devconsul.url, tls_lines(server)):
        trusting = client_context(TlsFiles(ca_file=ca.cert_file), "test")
        assert https_filter(ext, trusting) == {n["metadata"]["name"] for n in NODES}
        status, out = ext.request("GET", "/healthz", tls=trusting)
        assert status == 200 and json.loads(out)["ok"] is True
        # The system's trust store does not know the test CA: the handshake fails.
        with pytest.raises(ssl.SSLCertVerificationError):
            ext.request("GET", "/healthz", tls=client_context(TlsFiles(), "test"))
        # Plain HTTP to the HTTPS port gets no answer.
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            ext.request("GET", "/healthz")
        assert "(https)" in ext.log.read_text()


def test_with_a_client_ca_a_client_without_a_certificate_is_refused(tmp_path: Path, devconsul, pki) -> None:
    ca, server, scheduler = pki
    stranger = TestCA.create(tmp_path / "other", "other-ca").issue("stranger")
    for ext in start_extender(tmp_path, devconsul.url, tls_lines(server, ca.cert_file)):
        with_cert = client_context(TlsFiles(scheduler.cert_file, scheduler.key_file, ca.cert_file), "test")
        assert len(https_filter(ext, with_cert)) == len(NODES)
        for refused in (client_context(TlsFiles(ca_file=ca.cert_file), "test"),
                        client_context(TlsFiles(stranger.cert_file, stranger.key_file, ca.cert_file), "test")):
            # TLS 1.3: the server's refusal arrives as an alert on the first read.
            with pytest.raises((ssl.SSLError, ConnectionError)):
                ext.request("GET", "/healthz", tls=refused)
        assert len(https_filter(ext, with_cert)) == len(NODES)  # the refusals left the server serving


def test_a_client_ca_without_https_or_an_unloadable_key_is_exit_2(tmp_path: Path, pki) -> None:
    ca, server, _ = pki
    os.chmod(server.key_file, 0o644)
    for extra, field in ((f'tls_ca_file = "{ca.cert_file}"\n', "extender.tls_ca_file: asks clients for "
                                                                 "certificates, which needs HTTPS"),
                         (tls_lines(server), "extender.tls.key_file")):
        config = tmp_path / "tls.toml"
        config.write_text(f"[extender]\n{extra}")
        result = subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "scheduler-extender", "--config",
                                 str(config)], capture_output=True, text=True, timeout=30)
        assert result.returncode == 2, result.stderr
        assert field in result.stderr and "PRIVATE KEY" not in result.stderr


def served_serial(ext: ExtenderProcess, tls: ssl.SSLContext) -> int:
    """The serial of the certificate a new TLS connection is handed."""
    with socket.create_connection((ext.host, ext.port), timeout=10) as raw:
        with tls.wrap_socket(raw, server_hostname=ext.host) as sock:
            der = sock.getpeercert(binary_form=True)
    assert der
    return x509.load_der_x509_certificate(der).serial_number


def file_serial(leaf: Leaf) -> int:
    return x509.load_pem_x509_certificate(Path(leaf.cert_file).read_bytes()).serial_number


def test_a_rotated_certificate_is_served_to_new_connections_without_a_restart(tmp_path: Path, devconsul,
                                                                               pki) -> None:
    ca, server, scheduler = pki
    for ext in start_extender(tmp_path, devconsul.url, tls_lines(server, ca.cert_file)):
        client = client_context(TlsFiles(scheduler.cert_file, scheduler.key_file, ca.cert_file), "test")
        first = served_serial(ext, client)
        assert first == file_serial(server)
        # On disk: the next connection gets it (the files are checked at most once a second).
        rotated = ca.issue("extender-2", dns=["azprobe-scheduler-extender.azprobe.svc"], ips=["127.0.0.1"],
                           file_stem="extender")
        second = file_serial(rotated)
        wait_for(lambda: served_serial(ext, client) == second, timeout=20, message="the rotated certificate")
        assert len(https_filter(ext, client)) == len(NODES)
        # SIGHUP takes the files at once.
        ca.issue("extender-3", ips=["127.0.0.1"], file_stem="extender")
        ext.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP: 1 rotated file(s) taken" in ext.log.read_text(), timeout=20, message="SIGHUP")
        assert served_serial(ext, client) == file_serial(server) != second
        assert ext.proc.poll() is None and first != second


def test_a_rotation_to_a_bad_key_keeps_the_old_certificate_and_logs_one_line(tmp_path: Path, devconsul,
                                                                            pki) -> None:
    ca, server, scheduler = pki
    for ext in start_extender(tmp_path, devconsul.url, tls_lines(server)):
        client = client_context(TlsFiles(ca_file=ca.cert_file), "test")
        serving = served_serial(ext, client)
        broken = "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n"
        Path(server.key_file).write_text(broken)
        os.chmod(server.key_file, 0o600)

        def failures() -> list[str]:
            served_serial(ext, client)  # a handshake makes the listener look at its files
            return [line for line in ext.log.read_text().splitlines() if "do not load" in line]

        wait_for(lambda: failures(), timeout=20, message="the failed rotation logged")
        ext.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP: 0 rotated file(s) taken" in ext.log.read_text(), timeout=20, message="SIGHUP")
        deadline = time.monotonic() + 2.5  # past two checks of the unchanged, still broken files
        while time.monotonic() < deadline:
            assert served_serial(ext, client) == serving
        lines = failures()
        assert len(lines) == 1, lines
        assert server.key_file in lines[0] and "PRIVATE KEY" not in lines[0] and "bm90" not in lines[0]
        assert len(https_filter(ext, client)) == len(NODES)
