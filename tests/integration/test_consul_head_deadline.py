"""The Consul client against a server that drips the response head (the status line and
headers, before any body) on real loopback sockets, plain and TLS: requests' timeout is
per socket read, so each dripped byte restarted it; the read's total time limit must end
the head as it ends a dripping body, with the same one-line ConsulError, in read_key, the
watcher and `azprobe weights`."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from azprobe.clients.consul import ConsulError, ConsulSettings, make_client, read_key
from azprobe.consumers.watch import WeightWatcher
from tests.helpers import wait_for
from tests.pki import TestCA

KEY = "azprobe/v1/weights"
DRIP_EVERY_S = 0.05  # well under the client's per-read timeout: each byte restarts it


class HeadDripper:
    """A loopback server that reads each request's head, sends `before` at once, then
    one byte of an endless header every DRIP_EVERY_S until it is closed; TLS when given
    a server context. Counts the requests it has read."""

    def __init__(self, before: bytes, context: ssl.SSLContext | None = None) -> None:
        self.before = before
        self.context = context
        self.requests = 0
        self.stopping = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    @property
    def url(self) -> str:
        return f"{'https' if self.context else 'http'}://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.context is not None:
                conn = self.context.wrap_socket(conn, server_side=True)
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(65536)
                    if not data:
                        return
                    request += data
                self.requests += 1
                conn.sendall(self.before)
                while not self.stopping.wait(DRIP_EVERY_S):  # the fault: a header that never ends
                    conn.sendall(b"a")
        except OSError:  # the client hung up (or refused the handshake): what the bound does
            return

    def close(self) -> None:
        self.stopping.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # close alone does not wake a blocked accept
        except OSError:
            pass
        self.sock.close()
        for thread in self.threads:
            thread.join(10)
        assert not any(t.is_alive() for t in self.threads), "a server thread did not end"


HEADERS_DRIP = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Drip: "
STATUS_DRIP = b"HTTP/1.1 2"  # not even a whole status line


@pytest.fixture
def serve() -> Iterator[Callable[..., HeadDripper]]:
    servers: list[HeadDripper] = []

    def start(before: bytes, context: ssl.SSLContext | None = None) -> HeadDripper:
        servers.append(HeadDripper(before, context))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _timed_read(settings: ConsulSettings, index: int = 0, wait_s: float | None = None,
                limit_s: float = 10.0) -> tuple[BaseException | object, float]:
    """read_key on its own thread (a hang fails the test at the deadline instead of
    hanging it): (what it returned or raised, seconds it took)."""
    outcome: list[BaseException | object] = []

    def read() -> None:
        try:
            outcome.append(read_key(make_client(settings), KEY, index=index, wait_s=wait_s))
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    wait_for(lambda: outcome, timeout=limit_s + 10, message="read_key to give up on the dripping head")
    elapsed = time.monotonic() - started
    thread.join(10)
    return outcome[0], elapsed


@pytest.mark.parametrize("before", [HEADERS_DRIP, STATUS_DRIP], ids=["headers", "status-line"])
@pytest.mark.parametrize("index, wait_s, limit_s", [(0, None, 1.0), (5, 1.0, 1.0 + 1.0 + 1.0 / 16)],
                         ids=["plain", "blocking"])
def test_a_dripping_head_fails_at_the_reads_time_limit(serve, before, index, wait_s, limit_s):
    server = serve(before)
    outcome, elapsed = _timed_read(ConsulSettings(address=server.url, timeout_s=1.0), index, wait_s, limit_s)
    assert isinstance(outcome, ConsulError), outcome
    # The very error a dripping body gets (test_consul_client_bounds): callers handle one kind.
    assert f"not complete within {limit_s:g} s (the read's time limit)" in str(outcome), outcome
    assert "\n" not in str(outcome)
    assert limit_s - 0.1 <= elapsed < limit_s + 3, elapsed  # a blocking query's wait is allowed, no more
    assert server.requests == 1


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca = TestCA.create(tmp_path_factory.mktemp("head-drip-pki"), "drip-ca")
    return ca, ca.issue("server", dns=["localhost"], ips=["127.0.0.1"])


def test_a_dripping_head_over_tls_fails_at_the_reads_time_limit(serve, pki):
    ca, leaf = pki
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(leaf.cert_file, leaf.key_file)
    server = serve(HEADERS_DRIP, context)
    outcome, elapsed = _timed_read(ConsulSettings(address=server.url, ca_file=ca.cert_file, timeout_s=1.0))
    assert isinstance(outcome, ConsulError), outcome
    assert "not complete within 1 s (the read's time limit)" in str(outcome), outcome
    assert 0.9 <= elapsed < 4, elapsed
    assert server.requests == 1  # the handshake succeeded: it is the head that was late


def test_the_watcher_fails_static_on_a_dripping_head(serve):
    server = serve(HEADERS_DRIP)
    with WeightWatcher(ConsulSettings(address=server.url, timeout_s=0.5), wait_s=1.0, backoff_base_s=0.01,
                       backoff_cap_s=0.05) as watcher:
        status = wait_for(lambda: watcher.status() if watcher.status().errors >= 2 else None, timeout=15,
                          message="two failed reads")
        assert watcher._thread is not None and watcher._thread.is_alive()
    assert status.state == "empty" and "not complete within 0.5 s" in status.last_error, status.last_error
    assert "\n" not in status.last_error


def test_azprobe_weights_fails_in_one_line_on_a_dripping_head(serve):
    server = serve(HEADERS_DRIP)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONSUL_")}
    started = time.monotonic()
    # Its Consul time limit is ConsulSettings' default, 10 s; before the bound it hung until killed.
    done = subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "weights", "--consul", server.url],
                          capture_output=True, text=True, timeout=40, env=clean)
    elapsed = time.monotonic() - started
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "not complete within 10 s" in line, line
    assert elapsed < 25, elapsed
