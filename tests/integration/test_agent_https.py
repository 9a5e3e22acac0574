"""The agent's own HTTP server over mutual TLS ([agent.tls]), with real handshakes on
127.0.0.1: the controller's collector pulls it and binds its certificate to the node;
clients without a certificate of the CA, or without the required identity, and plain
HTTP are closed and counted; a certificate replaced on disk is used by the next
handshake, the listening socket unchanged."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from azprobe.agent.config import parse_agent_config
from azprobe.agent.http import make_server, serve_in_background
from azprobe.agent.httpserver.tlsserve import ServerTls, TlsHTTPServer
from azprobe.contracts.window import Window, parse_window
from azprobe.controller.agent_identity import AgentGuard
from azprobe.controller.collect import Collector
from azprobe.controller.window_source import AgentTarget
from azprobe.errors import ConfigError
from azprobe.security.tls import TlsFiles, identity_client_context
from tests.controller_harness import topology
from tests.fakeagent import FakeAgent, PathSpec
from tests.helpers import wait_for
from tests.pki import TestCA

IDENTITY = "spiffe://lab.test/azprobe/node/{node}"
CONTROLLER_ID = "spiffe://lab.test/azprobe/controller"


class Node:
    """What the server reads from an agent: one FakeAgent's ring."""

    def __init__(self, name: str) -> None:
        self.fake = FakeAgent(name, "az-a", [PathSpec(dst="az-b", conn_attempts=10)])
        self.fake.emit()

    def windows_page(self, after: int) -> tuple[dict, list[Window]]:
        doc = self.fake.body(after)
        return doc, [parse_window(w) for w in doc["windows"]]

    def events_doc(self, after: int) -> dict:
        return {"node": self.fake.node, "az": "az-a", "boot_id": self.fake.boot_id, "events": []}

    def healthy(self) -> tuple[bool, str]:
        return True, "ok"

    def identity(self) -> dict[str, str]:
        return {"node": self.fake.node, "az": "az-a", "boot_id": self.fake.boot_id}

    def path_totals(self) -> dict:
        return {}

    path_histograms = event_totals = gauges = program_stats = path_totals

    def latest_util(self) -> None:
        return None


@pytest.fixture
def pki(tmp_path: Path) -> TestCA:
    ca = TestCA.create(tmp_path / "pki", "lab-ca")
    ca.issue("node-a", uri=[IDENTITY.replace("{node}", "node-a")])
    ca.issue("controller", uri=[CONTROLLER_ID])
    ca.issue("stranger", uri=["spiffe://lab.test/someone-else"])
    return ca


def _files(ca: TestCA, stem: str, with_ca: bool = True) -> TlsFiles:
    return TlsFiles(str(ca.directory / f"{stem}.crt"), str(ca.directory / f"{stem}.key"),
                    ca.cert_file if with_ca else None)


@contextmanager
def https_agent(ca: TestCA, client_identity: str = CONTROLLER_ID) -> Iterator[tuple[TlsHTTPServer, str]]:
    tls = ServerTls(_files(ca, "node-a"), client_identity)
    server = make_server("127.0.0.1", 0, Node("node-a"), tls=tls)  # type: ignore[arg-type]
    assert isinstance(server, TlsHTTPServer)
    serve_in_background(server)
    try:
        yield server, f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _collector(ca: TestCA, url: str, client: str = "controller") -> Collector:
    guard = AgentGuard(_files(ca, client), IDENTITY)
    collector = Collector(evaluation_window_s=60, pull_timeout_s=2.0, stale_after_s=10, topology=topology(),
                          guard=guard)
    collector.set_targets([AgentTarget(url)])
    return collector


def _pull(collector: Collector, between: Callable[[], None] | None = None, times: int = 1) -> list:
    async def run() -> list:
        results = []
        for _ in range(times):
            results.append(await collector.pull_all())
            if between:
                between()
        await collector.close()
        return results
    return asyncio.run(run())


def _answering_serial(collector: Collector) -> str:
    """The serial of the certificate the one agent answered the last pull with: that of
    the connection the pull kept alive."""
    (conn,) = [c for conns in collector._http._idle.values() for c in conns]
    assert conn.peer is not None
    return conn.peer.serial


def test_the_controller_pulls_an_https_agent_and_binds_its_node(pki):
    with https_agent(pki) as (server, url):
        collector = _collector(pki, url)
        (result,) = _pull(collector)
        assert result.failed == 0 and result.ingested == 1
        assert collector.store.node_input().keys() == {"node-a"}
        assert sum(collector.guard.refused.values()) == 0 and server.tls.refused == 0


@pytest.mark.parametrize("client", ["none", "stranger"])
def test_clients_without_the_ca_or_the_identity_are_closed(pki, client):
    with https_agent(pki) as (server, url):
        collector = _collector(pki, url, client="controller" if client == "none" else "stranger")
        if client == "none":  # the CA, but no certificate to present
            collector._http._ssl = identity_client_context(TlsFiles(ca_file=pki.cert_file), "agents.tls")
        (result,) = _pull(collector)
        assert result.failed == 1 and not collector.store.node_input()
        cursor = next(iter(collector.cursors.values()))
        assert "refuses this side's client certificate" in cursor.last_error
        assert collector.guard.handshake_failures["client_certificate_refused"] == 1
        # TLS 1.3: the client reads the server's alert before the server's handshake call
        # returns, so the server's count can trail the client's failure by a moment.
        wait_for(lambda: server.tls.refused == 1, timeout=5, message="the server to count the refusal")


def test_plain_http_to_the_https_port_is_not_served(pki):
    with https_agent(pki) as (server, url):
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as sock:
            sock.sendall(b"GET /v1/windows HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    chunk = sock.recv(4096)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                got += chunk
        assert b"HTTP/1.1 200" not in got and b"windows" not in got
        wait_for(lambda: server.tls.refused == 1, timeout=5, message="the server to count the refusal")


def test_a_certificate_replaced_on_disk_is_used_by_the_next_handshake(pki, monkeypatch):
    monkeypatch.setattr("azprobe.security.tls.CHECK_EVERY_S", 0.0)
    with https_agent(pki) as (server, url):
        port = server.server_address[1]
        collector = _collector(pki, url)
        serials: list[str] = []

        def rotate() -> None:
            serials.append(_answering_serial(collector))
            if len(serials) == 2:
                pki.issue("node-a", uri=[IDENTITY.replace("{node}", "node-a")])

        results = _pull(collector, between=rotate, times=4)
        assert all(r.failed == 0 for r in results)
        assert len(set(serials)) == 2 and serials[:2] == [serials[0]] * 2 and serials[2:] == [serials[-1]] * 2
        assert server.server_address[1] == port and server.tls.rotating.generation == 2
        assert server.rotated == 1 and collector._http.counters["handshakes"] == 2
        from azprobe.agent.http import HttpServerCollector  # the count is on the agent's /metrics
        closed = next(m for m in HttpServerCollector(server).collect() if m.name == "azprobe_http_connections_closed")
        assert {s.labels["reason"]: s.value for s in closed.samples if s.name.endswith("_total")}["rotated"] == 1


def test_agent_tls_config_needs_the_client_ca(pki):
    base = {"node": {"az": "az-a"}, "topology": {"az-a": ["198.18.1.0/24"]}}
    files = _files(pki, "node-a", with_ca=False)
    with pytest.raises(ConfigError, match="agent.tls.ca_file: is required"):
        parse_agent_config({**base, "agent": {"tls": {"cert_file": files.cert_file, "key_file": files.key_file}}})
    config = parse_agent_config({**base, "agent": {"tls": {"cert_file": files.cert_file, "key_file": files.key_file,
                                                           "ca_file": pki.cert_file, "client_identity": CONTROLLER_ID}}})
    assert config.tls == _files(pki, "node-a") and config.client_identity == CONTROLLER_ID
    Path(files.key_file).chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600") as err:
        ServerTls(config.tls)  # type: ignore[arg-type]
    assert "PRIVATE KEY" not in str(err.value)
    assert ssl.HAS_TLSv1_3


async def _late_then_pulls(guard: AgentGuard, ep, then: int) -> tuple[BaseException | None, list[str], dict[str, int]]:
    """One pull with a 0.1 s deadline (what it raised), then `then` pulls with 5 s (the
    nodes they name), on one client; and the client's counters."""
    from azprobe.clients.agent import pull_answer
    from azprobe.clients.transport import AgentHttpClient

    http = AgentHttpClient(ssl_context=guard.context)
    try:
        first: BaseException | None = None
        try:
            await pull_answer(http, ep, 0, timeout_s=0.1)
        except TimeoutError as exc:
            first = exc
        nodes = [(await pull_answer(http, ep, 0, timeout_s=5.0))[0].node for _ in range(then)]
        return first, nodes, dict(http.counters)
    finally:
        http.close()


def test_a_handshake_slower_than_the_pull_timeout_is_finished_for_the_next_pull(pki):
    """A new leader opens every connection at once: a handshake not done by the pull's
    deadline goes on, and the next pull takes that connection instead of starting over."""
    import threading

    from azprobe.clients.transport import Endpoint
    from azprobe.security.tls import server_context

    context = server_context(_files(pki, "node-a"), "agent.tls")
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    body = Node("node-a").fake.encoded_body(0, None)[0]

    def serve() -> None:
        raw, _ = listener.accept()
        accepted.append(raw)
        time.sleep(0.4)  # the handshake starts late: past the first pull's deadline
        with context.wrap_socket(raw, server_side=True) as tls:
            while True:
                head = tls.recv(65536)
                if not head:
                    return
                tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                            + str(len(body)).encode() + b"\r\n\r\n" + body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    guard = AgentGuard(_files(pki, "controller"), IDENTITY)
    ep = Endpoint.parse(f"https://127.0.0.1:{listener.getsockname()[1]}")

    try:
        first, nodes, _ = asyncio.run(_late_then_pulls(guard, ep, 1))
    finally:
        listener.close()
    assert isinstance(first, TimeoutError) and nodes == ["node-a"]
    assert len(accepted) == 1  # one connection, one handshake


def test_a_response_slower_than_the_pull_timeout_keeps_its_connection_for_the_next_pull(pki):
    """A pull that times out on an open connection is failed, but the answer still on
    its way is read and dropped, and the next pull reuses the connection: a slow cycle
    costs no handshake (closing it would cost one per agent the next cycle)."""
    import threading

    from azprobe.clients.transport import Endpoint
    from azprobe.security.tls import server_context

    context = server_context(_files(pki, "node-a"), "agent.tls")
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    body = Node("node-a").fake.encoded_body(0, None)[0]
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)

    def serve() -> None:
        while True:
            try:
                raw, _ = listener.accept()
            except OSError:
                return
            accepted.append(raw)
            with context.wrap_socket(raw, server_side=True) as tls:
                for n in range(1000):
                    if not tls.recv(65536):
                        break
                    if n == 0:
                        time.sleep(0.4)  # the first answer comes after the pull's deadline
                    tls.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    guard = AgentGuard(_files(pki, "controller"), IDENTITY)
    ep = Endpoint.parse(f"https://127.0.0.1:{listener.getsockname()[1]}")

    try:
        first, nodes, counters = asyncio.run(_late_then_pulls(guard, ep, 3))
    finally:
        listener.close()
    assert isinstance(first, TimeoutError) and nodes == ["node-a"] * 3
    assert len(accepted) == 1 and counters["handshakes"] == 1  # one connection, one handshake
    assert counters["drained"] == 1 and counters["drain_closed"] == 0


def test_the_controllers_certificate_replaced_on_disk_is_used_by_its_next_handshake(pki, monkeypatch):
    """The controller's own client certificate rotates: its pool stops reusing the
    connection made with the old one, and the agent sees the new certificate."""
    monkeypatch.setattr("azprobe.security.tls.CHECK_EVERY_S", 0.0)
    with https_agent(pki) as (server, url):
        clients: list[str] = []
        step = server.tls.step

        def spy(conn):  # type: ignore[no-untyped-def]
            done = step(conn)
            if done == 0:
                clients.append(conn.sock.getpeercert()["serialNumber"])
            return done

        server.tls.step = spy  # type: ignore[method-assign]
        collector = _collector(pki, url)

        def rotate() -> None:
            if collector._http.counters["handshakes"] == 1 and len(clients) == 1:
                pki.issue("controller", uri=[CONTROLLER_ID])

        results = _pull(collector, between=rotate, times=4)
        assert all(r.failed == 0 for r in results)
        assert len(clients) == 2 and clients[0] != clients[1]
        assert collector._http.counters["rotated"] == 1 and collector._http.counters["handshakes"] == 2
        assert collector.guard.rotating is not None and collector.guard.rotating.generation == 2


def test_a_pull_cancelled_after_its_answer_arrived_leaves_its_connection_ready(pki):
    """The cycle budget cancels a pull whose answer came in the same turn of the loop
    (before the cancellation reached it): the connection goes back to the pool at once,
    not into a drain waiting for an answer already read."""
    from azprobe.clients.agent import pull_answer
    from azprobe.clients.transport import AgentHttpClient, Endpoint

    with https_agent(pki) as (server, url):
        guard = AgentGuard(_files(pki, "controller"), IDENTITY)
        ep = Endpoint.parse(url)

        async def run() -> tuple[bool, str, dict[str, int]]:
            http = AgentHttpClient(ssl_context=guard.context)
            try:
                await pull_answer(http, ep, 0, timeout_s=5.0)
                (conn,) = http._idle[("https", ep.host, ep.port)]
                task = asyncio.ensure_future(pull_answer(http, ep, 0, timeout_s=5.0))
                receive = conn.data_received  # what the TLS transport calls, looked up each time

                def receive_then_cancel(data: bytes) -> None:
                    receive(data)
                    if conn.answered:
                        task.cancel()

                conn.data_received = receive_then_cancel  # type: ignore[method-assign]
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                conn.data_received = receive  # type: ignore[method-assign]
                page, _ = await pull_answer(http, ep, 0, timeout_s=2.0)
                return task.cancelled(), page.node, dict(http.counters)
            finally:
                http.close()

        cancelled, node, counters = asyncio.run(run())
    assert cancelled and node == "node-a"
    assert counters["handshakes"] == 1 and counters["drain_closed"] == 0
