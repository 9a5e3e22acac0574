"""The one TLS context builder, with real handshakes on loopback (certificates from tests/pki.py)."""

from __future__ import annotations

import os
import socket
import ssl
import threading
from pathlib import Path

import pytest

from azprobe.errors import ConfigError
from azprobe.security.tls import RotatingContext, TlsFiles, client_context, parse_tls_files, peer_names, server_context
from tests.pki import TestCA


def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, server_name: str = "localhost"
              ) -> tuple[dict | None, dict | None]:
    """One handshake over a loopback socket pair: (server's view of the client cert,
    client's view of the server cert). Raises the client's ssl error."""
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    seen: dict[str, object] = {}

    def serve() -> None:
        conn, _ = lsock.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                seen["client"] = tls.getpeercert()
                tls.recv(1)
        except (ssl.SSLError, OSError) as exc:
            seen["error"] = exc

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with client_ctx.wrap_socket(raw, server_hostname=server_name) as tls:
                server_cert = tls.getpeercert()
                tls.sendall(b"x")
                tls.recv(1)  # a refused client certificate shows here under TLS 1.3
    finally:
        t.join(5)
        lsock.close()
    return seen.get("client"), server_cert  # type: ignore[return-value]


@pytest.fixture
def pki(tmp_path: Path):
    ca = TestCA.create(tmp_path / "ca", "lab-ca")
    server = ca.issue("node-a", dns=["localhost", "node-a.lab"], uri=["spiffe://lab/node/node-a"])
    client = ca.issue("controller", uri=["spiffe://lab/controller"])
    return ca, server, client


def test_mutual_tls_handshakes_and_names_the_peer(pki) -> None:
    ca, server, client = pki
    sctx = server_context(TlsFiles(server.cert_file, server.key_file, ca.cert_file), "agent.tls")
    cctx = client_context(TlsFiles(client.cert_file, client.key_file, ca.cert_file), "agents.tls")
    seen_client, seen_server = handshake(sctx, cctx)
    assert peer_names(seen_client) == ("spiffe://lab/controller",)
    assert peer_names(seen_server) == ("localhost", "node-a.lab", "spiffe://lab/node/node-a")


@pytest.mark.parametrize("case", ["no_client_cert", "other_ca", "expired"])
def test_refused_handshakes(pki, tmp_path: Path, case: str) -> None:
    ca, server, client = pki
    other = TestCA.create(tmp_path / "other", "other-ca")
    sctx = server_context(TlsFiles(server.cert_file, server.key_file, ca.cert_file), "agent.tls")
    if case == "no_client_cert":
        cctx = client_context(TlsFiles(ca_file=ca.cert_file), "agents.tls")
    elif case == "other_ca":
        stranger = other.issue("stranger", dns=["localhost"])
        cctx = client_context(TlsFiles(stranger.cert_file, stranger.key_file, ca.cert_file), "agents.tls")
    else:
        old = ca.issue("old", dns=["localhost"], expired=True)
        sctx = server_context(TlsFiles(old.cert_file, old.key_file, ca.cert_file), "agent.tls")
        cctx = client_context(TlsFiles(client.cert_file, client.key_file, ca.cert_file), "agents.tls")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        handshake(sctx, cctx)


def test_a_key_others_can_read_is_refused_with_the_fix(pki) -> None:
    ca, server, _ = pki
    os.chmod(server.key_file, 0o644)
    with pytest.raises(ConfigError) as err:
        server_context(TlsFiles(server.cert_file, server.key_file), "agent.tls")
    assert "agent.tls.key_file" in str(err.value) and "chmod 600" in str(err.value)
    assert "PRIVATE KEY" not in str(err.value)


def test_an_encrypted_key_is_a_config_error_not_a_pass_phrase_prompt(pki, tmp_path) -> None:
    """Without a password callable OpenSSL reads a pass phrase from the terminal: a daemon
    with a tty (a container run with -t) blocked on a rotation to an encrypted key."""
    import subprocess

    _, server, _ = pki
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", server.key_file, "-out", str(encrypted), "-aes256",
                    "-passout", "pass:secret"], check=True, capture_output=True)
    encrypted.chmod(0o600)
    with pytest.raises(ConfigError) as err:
        server_context(TlsFiles(server.cert_file, str(encrypted)), "agent.tls")
    assert str(err.value).startswith("agent.tls.key_file: ") and "is encrypted" in str(err.value), str(err.value)
    assert "secret" not in str(err.value) and "\n" not in str(err.value)


def test_a_path_with_a_nul_byte_is_a_config_error(pki) -> None:
    _, server, _ = pki
    for files, field in ((TlsFiles(server.cert_file + "\0x", server.key_file), "agent.tls.cert_file"),
                         (TlsFiles(server.cert_file, server.key_file + "\0x"), "agent.tls.key_file")):
        with pytest.raises(ConfigError, match=f"^{field}: .*contains a NUL byte"):
            server_context(files, "agent.tls")


def test_a_rotated_certificate_is_used_by_the_next_handshake_without_a_restart(pki, monkeypatch) -> None:
    ca, server, client = pki
    monkeypatch.setattr("azprobe.security.tls.CHECK_EVERY_S", 0.0)
    rotating = RotatingContext(TlsFiles(server.cert_file, server.key_file, ca.cert_file), "agent.tls", server_context)
    listening = rotating.serving_context()
    cctx = client_context(TlsFiles(client.cert_file, client.key_file, ca.cert_file), "agents.tls")
    _, first = handshake(listening, cctx)
    ca.issue("node-a-rotated", dns=["localhost"], uri=["spiffe://lab/node/node-a-v2"], file_stem="node-a")
    _, second = handshake(listening, cctx)
    assert peer_names(first)[-1] == "spiffe://lab/node/node-a"
    assert peer_names(second)[-1] == "spiffe://lab/node/node-a-v2"
    assert rotating.generation == 2


def test_a_half_written_rotation_keeps_the_current_material(pki, monkeypatch) -> None:
    ca, server, client = pki
    monkeypatch.setattr("azprobe.security.tls.CHECK_EVERY_S", 0.0)
    errors: list[ConfigError] = []
    rotating = RotatingContext(TlsFiles(server.cert_file, server.key_file, ca.cert_file), "agent.tls",
                               server_context, on_error=errors.append)
    listening = rotating.serving_context()
    Path(server.cert_file).write_text("-----BEGIN CERTIFICATE-----\ntruncated\n")
    cctx = client_context(TlsFiles(client.cert_file, client.key_file, ca.cert_file), "agents.tls")
    _, seen = handshake(listening, cctx)
    assert peer_names(seen)[-1] == "spiffe://lab/node/node-a"
    assert len(errors) == 1 and "agent.tls.cert_file" in str(errors[0])


@pytest.mark.parametrize("table, message", [
    ({"cert_file": "/x"}, "needs cert_file and key_file"),
    ({"cert_file": "/x", "key_file": "/y", "verify": False}, "verify: unknown key"),
    ({"cert_file": 3, "key_file": "/y"}, "cert_file: must be a non-empty path"),
])
def test_server_tables_are_checked_by_name(table, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_tls_files(table, "agent.tls", server=True)


def test_client_tables_take_server_name_and_verify() -> None:
    files = parse_tls_files({"ca_file": "/ca", "server_name": "consul.lab", "verify": True}, "consul.tls", server=False)
    assert files == TlsFiles(ca_file="/ca", server_name="consul.lab")


def test_server_pem_gives_grpc_the_bytes_after_the_server_checks(pki) -> None:
    from azprobe.security.tls import server_pem

    ca, server, _ = pki
    pem = server_pem(TlsFiles(server.cert_file, server.key_file, ca.cert_file), "xds.tls")
    assert pem.chain == Path(server.cert_file).read_bytes() and pem.key == Path(server.key_file).read_bytes()
    assert pem.client_ca == Path(ca.cert_file).read_bytes()
    assert "PRIVATE" not in repr(pem) and "BEGIN" not in repr(pem)  # nothing of the PEM in a log line
    assert server_pem(TlsFiles(server.cert_file, server.key_file), "xds.tls").client_ca is None
    os.chmod(server.key_file, 0o644)
    with pytest.raises(ConfigError, match="xds.tls.key_file") as refused:
        server_pem(TlsFiles(server.cert_file, server.key_file), "xds.tls")
    assert "BEGIN" not in str(refused.value)


def test_server_pem_refuses_a_key_that_does_not_fit_the_chain(pki, tmp_path) -> None:
    from azprobe.security.tls import server_pem

    ca, server, client = pki
    with pytest.raises(ConfigError, match="xds.tls.cert_file") as refused:
        server_pem(TlsFiles(server.cert_file, client.key_file), "xds.tls")
    assert "BEGIN" not in str(refused.value)


def _verify_error(code: int, message: str) -> ssl.SSLCertVerificationError:
    exc = ssl.SSLCertVerificationError(1, f"[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: {message}")
    exc.verify_code, exc.verify_message = code, message
    return exc


class _WrappingCertificateError(ssl.SSLCertVerificationError):
    """Like aiohttp's ClientConnectorCertificateError: ssl's class, without its fields, the real one inside."""

    def __init__(self, inner: BaseException) -> None:
        super().__init__(inner)
        self.os_error = inner


def test_one_classifier_names_every_handshake_failure() -> None:
    from azprobe.security import tls

    expired = tls.tls_failure(_verify_error(10, "certificate has expired"))
    assert expired is not None and (expired.cause, expired.reason, expired.verify) == (tls.EXPIRED, "expired", True)
    assert expired.line == "certificate verify failed: certificate has expired"
    unknown = tls.tls_failure(_WrappingCertificateError(_verify_error(20, "unable to get local issuer certificate")))
    assert unknown is not None and (unknown.cause, unknown.reason) == (tls.UNKNOWN_CA, "unknown_ca")
    assert unknown.line.endswith("(not signed by the configured CA)")
    alert = ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required")
    refused = tls.tls_failure(OSError("wrapped")) or tls.tls_failure(ConnectionError(alert))
    assert refused is not None and (refused.cause, refused.reason) == (tls.NO_CLIENT_CERT, "client_certificate_refused")
    other = tls.tls_failure(ssl.SSLError(1, "[SSL: SOMETHING_NEW] something new"))
    assert other is not None and (other.cause, other.reason) == (tls.HANDSHAKE_FAILED, "other")
    assert tls.tls_failure(ConnectionResetError("connection reset")) is None
