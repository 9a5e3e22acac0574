"""The agent's HTTP side, over real sockets on 127.0.0.1 (issue 9 item 7, issue 23 items 6
and 12). Bounded connections, whole-request deadlines, slots the open endpoints and slow
unauthenticated clients cannot take, one send per response, quiet client disconnects,
the bearer token on /v1/* (sent by the controller), and /v1/events only with a token or
on loopback."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from azprobe.agent.config import parse_agent_config
from azprobe.clients.agent import AgentHttpStatus, WindowReader, pull_page
from azprobe.clients.transport import AgentHttpClient, Endpoint
from azprobe.agent.http import OPEN_POOL, make_server, serve_in_background
from azprobe.agent.httpserver import BoundedHTTPServer, ConnectionLimits, Pool
from azprobe.contracts.window import Window, parse_window
from azprobe.contracts.windowcodec import COMPACT_TYPE
from azprobe.controller.collect import Collector
from azprobe.controller.window_source import AgentTarget
from azprobe.controller.config import parse_config
from azprobe.errors import ConfigError
from tests.controller_harness import topology
from tests.fakeagent import FakeAgent, PathSpec
from tests.helpers import write_secret

TOKEN = "s3cret-token"


class State:
    """What the HTTP server reads from an agent, from a FakeAgent's ring."""

    def __init__(self, windows: int = 2) -> None:
        self.fake = FakeAgent("n1", "az-a", [PathSpec(dst="az-b", conn_attempts=10)])
        for _ in range(windows):
            self.fake.emit()

    def windows_page(self, after: int) -> tuple[dict, list[Window]]:
        doc = self.fake.body(after)
        return doc, [parse_window(w) for w in doc["windows"]]

    def events_doc(self, after: int) -> dict:
        return {"node": "n1", "az": "az-a", "boot_id": self.fake.boot_id,
                "events": [{"id": 1, "saddr": "198.18.1.2", "daddr": "198.18.2.2"}]}

    def healthy(self) -> tuple[bool, str]:
        return True, "ok"

    def path_totals(self) -> dict:
        return {}

    def path_histograms(self) -> dict:
        return {}

    def identity(self) -> dict[str, str]:
        return {"node": "n1", "az": "az-a", "boot_id": self.fake.boot_id}

    def latest_util(self) -> None:
        return None

    def event_totals(self) -> dict:
        return {}

    def gauges(self) -> dict:
        return {}

    def program_stats(self) -> dict:
        return {}


@contextmanager
def agent_server(host: str = "127.0.0.1", state: State | None = None, **kwargs) -> Iterator[tuple[BoundedHTTPServer, str]]:
    server = make_server(host, 0, state or State(), **kwargs)
    serve_in_background(server)
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def get(url: str, token: str | None = None, accept: str = "application/json") -> tuple[int, bytes, str]:
    headers = {"Accept": accept}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
            return resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read(), exc.headers.get("Content-Type", "")


def half_sent_request(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /v1/windows?after=0 HTTP/1.1\r\nHost: x\r\n")  # never finished
    return sock


def served_in_order(url: str) -> None:
    """The server accepts in order: once a later connection is answered, every earlier
    one has been accepted (and taken a slot, been refused, or pushed one out)."""
    get(url + "/healthz")


def closed_by_server(sock: socket.socket) -> bool:
    """True when the server has closed (or reset) `sock`; waits up to the socket's timeout."""
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


class Trickle:
    """Slow clients: each sends one more header byte every `every_s` from a thread, as a
    slow-loris attack does, until stopped or its connection is closed."""

    def __init__(self, socks: list[socket.socket], every_s: float) -> None:
        self.socks, self.every_s = socks, every_s
        self.sent = dict.fromkeys(range(len(socks)), 0)
        self.cut: set[int] = set()  # clients whose connection the server closed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):  # the pace of the attack, not a synchronisation
            for i, sock in enumerate(self.socks):
                if i in self.cut:
                    continue
                try:
                    sock.send(b"X")
                    self.sent[i] += 1
                except OSError:
                    self.cut.add(i)

    def __enter__(self) -> "Trickle":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for sock in self.socks:
            sock.close()


def authorised_pulls(url: str, count: int) -> list[tuple[int, int]]:
    """`count` concurrent pulls with the controller's own client: (status, windows) each."""

    async def pulls() -> list[tuple[int, int]]:
        client, ep = AgentHttpClient(), Endpoint.parse(url)
        try:
            async def one() -> tuple[int, int]:
                try:
                    page = await pull_page(client, ep, 0, token=TOKEN, timeout_s=10.0)
                except AgentHttpStatus as exc:
                    return int(str(exc).split()[-1]), 0
                return 200, len(page.windows)
            return await asyncio.gather(*(one() for _ in range(count)))
        finally:
            client.close()

    return asyncio.run(pulls())


def test_slow_unauthenticated_clients_cannot_lock_out_authorised_pulls():
    """Issue 23 item 6: 64 slow connections (one header byte every few seconds) held every
    connection slot of the old server, and 40 of 40 authorised pulls got 503. Reading a
    request head now costs no thread and no slot: 100 such connections, trickling, and
    40 authorised pulls at once all get their windows."""
    with agent_server(token=TOKEN) as (server, url):
        slow = [half_sent_request(server.server_address[1]) for _ in range(100)]
        with Trickle(slow, every_s=0.2) as trickle:
            served_in_order(url)
            assert authorised_pulls(url, 40) == [(200, 2)] * 40
            assert not trickle.cut and server.open_connections >= 100  # none was pushed out to make room


def test_a_flood_of_slow_connections_pushes_out_itself_not_the_controller():
    """More slow connections than the server keeps open: each new connection closes the
    oldest unauthenticated one, so pulls still get in, and the kept-alive connections
    that proved the token outlast every later flood."""
    limits = ConnectionLimits(max_connections=32, head_timeout_s=30.0)
    with agent_server(token=TOKEN, limits=limits) as (server, url):
        port = server.server_address[1]
        first_wave = [half_sent_request(port) for _ in range(40)]
        served_in_order(url)
        assert server.open_connections <= 32
        assert authorised_pulls(url, 10) == [(200, 2)] * 10
        controller = []  # kept-alive connections that proved the token
        for _ in range(8):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(WINDOWS_REQUEST)
            assert read_response(sock).startswith(b"HTTP/1.1 200 ")
            controller.append(sock)
        second_wave = [half_sent_request(port) for _ in range(60)]
        served_in_order(url)
        for sock in controller:  # the same connections, after the flood
            sock.sendall(WINDOWS_REQUEST)
            assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        assert server.evicted >= 40 + 60 - 32
        metrics = get(url + "/metrics")[1].decode()
        assert f'azprobe_http_connections_closed_total{{reason="evicted"}} {server.evicted}.0' in metrics
        assert all(closed_by_server(sock) for sock in first_wave)  # the oldest went first
        for sock in first_wave + second_wave + controller:
            sock.close()


def test_a_slow_client_is_cut_at_the_whole_request_deadline():
    """The old server's timeout was per read: a client sending a byte every 0.1 s kept its
    connection (and its thread) as long as it liked. Now the whole head is due within
    head_timeout_s of the accept."""
    with agent_server(limits=ConnectionLimits(head_timeout_s=0.5)) as (server, url):
        sock = half_sent_request(server.server_address[1])
        with Trickle([sock], every_s=0.1) as trickle:
            wait_for(lambda: 0 in trickle.cut or closed_by_nonblocking(sock), "the server to cut the slow client")
            assert trickle.sent[0] < 60  # cut long before it finished (60 bytes would take 6 s)
        wait_for(lambda: server.open_connections == 0, "the connection to be gone")
        assert server.timed_out == 1


def closed_by_nonblocking(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_half_sent_requests_hold_no_thread_and_at_most_the_connection_cap():
    """Old server: a thread per connection (500 half-sent requests held 500 threads, then
    64 and 503 for the rest). Now connections waiting for a head hold no thread, and at
    most max_connections of them stay open."""
    threads_before = threading.active_count()
    with agent_server(limits=ConnectionLimits(max_connections=4, head_timeout_s=30.0)) as (server, url):
        port = server.server_address[1]
        held = [half_sent_request(port) for _ in range(24)]
        try:
            served_in_order(url)
            assert server.open_connections <= 4 and server.evicted >= 20
            assert sum(closed_by_server(sock) for sock in held[:20]) == 20  # the oldest pushed out
            assert threading.active_count() <= threads_before + 1 + OPEN_POOL.workers  # the IO loop + what answered /healthz
        finally:
            for sock in held:
                sock.close()
        wait_for(lambda: server.open_connections == 0, "the held connections to end")
        assert get(url + "/healthz")[0] == 200


def test_a_silent_connection_is_closed_after_the_head_timeout():
    with agent_server(limits=ConnectionLimits(head_timeout_s=0.3)) as (server, url):
        sock = half_sent_request(server.server_address[1])
        with sock:
            assert closed_by_server(sock)  # the agent hung up (the client waits up to 10 s)
        wait_for(lambda: server.open_connections == 0, "the connection to be freed")


def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout():
    with agent_server(limits=ConnectionLimits(idle_timeout_s=0.3)) as (server, url):
        sock = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
        with sock:
            sock.sendall(WINDOWS_REQUEST)
            assert read_response(sock).startswith(b"HTTP/1.1 200 ")
            assert closed_by_server(sock)
        assert server.timed_out == 1


class BlockingHealth(State):
    """/healthz answers only once released: holds the open pool's slots on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def healthy(self) -> tuple[bool, str]:
        self.release.wait(10)
        return True, "ok"


def test_the_open_endpoints_cannot_take_the_authorised_slots():
    state = BlockingHealth()
    with agent_server(state=state, token=TOKEN, open_pool=Pool(workers=1, slots=2)) as (server, url):
        port = server.server_address[1]
        held = []
        for _ in range(2):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append(sock)
        wait_for(lambda: server.in_flight("open") == 2, "both open slots taken")
        assert get(url + "/healthz")[0] == 503 and server.busy() == {"open": 1, "v1": 0}
        assert authorised_pulls(url, 5) == [(200, 2)] * 5  # the v1 pool is untouched
        state.release.set()
        for sock in held:
            assert read_response(sock).startswith(b"HTTP/1.1 200 ")
            sock.close()


WINDOWS_REQUEST = (f"GET /v1/windows?after=0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                   f"Accept: {COMPACT_TYPE}\r\n\r\n").encode()


def read_response(sock: socket.socket) -> bytes:
    """One whole response (Content-Length framed) from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    assert len(body) == length, "more bytes than one response: the connection is out of step"
    return head + b"\r\n\r\n" + body


def tcp_data_segments_received(sock: socket.socket) -> int:
    """tcpi_data_segs_in of struct tcp_info (Linux >= 4.6): segments with data this socket received."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    assert len(info) >= 156, "the kernel's tcp_info has no data_segs_in"
    return struct.unpack_from("I", info, 152)[0]


def test_each_response_leaves_in_one_segment():
    """Issue 23 item 12: the old handler wrote the head and the body in two sends, so on a
    kept-alive connection the body waited for the client's delayed ACK (Nagle): 44 ms a
    pull. Every response is one send now: N pulls on one connection arrive as N segments."""
    with agent_server(token=TOKEN) as (server, url):
        sock = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
        with sock:
            before = tcp_data_segments_received(sock)
            requests = [WINDOWS_REQUEST,
                        WINDOWS_REQUEST.replace(COMPACT_TYPE.encode(), b"application/json"),
                        b"GET /v1/windows?after=0 HTTP/1.1\r\nHost: x\r\n\r\n",  # 401
                        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
                        b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"] * 4
            statuses = []
            for request in requests:
                sock.sendall(request)
                statuses.append(read_response(sock).split(b" ", 2)[1])
            assert statuses == [b"200", b"200", b"401", b"200", b"404"] * 4
            assert tcp_data_segments_received(sock) - before == len(requests)


def test_a_client_that_goes_away_is_no_traceback(capfd, caplog):
    caplog.set_level(logging.DEBUG, logger="azprobe.agent.httpserver")
    state = State(windows=3000)  # a page far bigger than the socket buffers
    with agent_server(state=state) as (server, url):
        for _ in range(3):
            sock = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.sendall(b"GET /v1/windows?after=0 HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.recv(10)
            sock.close()  # reset mid-response
        wait_for(lambda: server.open_connections == 0, "the server to notice")
        assert get(url + "/healthz")[0] == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err
    assert any("went away" in r.getMessage() for r in caplog.records)  # the path was taken
    assert not any(r.exc_info for r in caplog.records)


def test_the_token_guards_v1_and_the_controller_sends_it():
    with agent_server(token=TOKEN) as (server, url):
        assert get(url + "/v1/windows?after=0")[0] == 401
        assert get(url + "/v1/windows?after=0", token="wrong")[0] == 401
        assert get(url + "/v1/events?after=0")[0] == 401
        status, body, ctype = get(url + "/v1/windows?after=0", token=TOKEN)
        assert status == 200 and ctype == "application/json" and b'"windows"' in body
        assert get(url + "/v1/windows?after=0", token=TOKEN, accept=COMPACT_TYPE)[2] == COMPACT_TYPE
        assert get(url + "/healthz")[0] == 200 and get(url + "/metrics")[0] == 200  # open for probes

        async def pull(token: str) -> tuple[int, int, str]:
            collector = Collector(evaluation_window_s=1e9, pull_timeout_s=5.0, stale_after_s=5.0, token=token,
                                  topology=topology())
            collector.set_targets([AgentTarget(url)])
            result = await collector.pull_all()
            await collector.close()
            return result.ingested, result.failed, collector.cursors[url].last_error

        assert asyncio.run(pull("")) == (0, 1, "HTTP 401")
        assert asyncio.run(pull(TOKEN)) == (2, 0, "")


def test_events_need_a_token_or_a_loopback_listener():
    with agent_server("0.0.0.0") as (server, url):  # reachable from other hosts, no token
        status, body, _ = get(url + "/v1/events?after=0")
        assert status == 403 and b"token_file" in body
        assert get(url + "/v1/windows?after=0")[0] == 200
    with agent_server("0.0.0.0", token=TOKEN) as (server, url):
        assert get(url + "/v1/events?after=0", token=TOKEN)[0] == 200
    with agent_server("127.0.0.1") as (server, url):
        assert get(url + "/v1/events?after=0")[0] == 200


def test_token_files_in_both_configs(tmp_path):
    token_file = write_secret(tmp_path / "token", TOKEN + "\n")
    agent = parse_agent_config({"node": {"name": "n1", "az": "az-a"}, "agent": {"token_file": str(token_file)},
                                "topology": {"az-a": ["198.18.1.0/24"]}})
    assert agent.token == TOKEN and TOKEN not in repr(agent)
    controller = parse_config({"controller": {"name": "c", "listen": "127.0.0.1:9741"},
                               "consul": {"address": "http://127.0.0.1:8500"},
                               "agents": {"static": ["http://127.0.0.1:9740"], "token_file": str(token_file)},
                               "topology": {"azs": ["az-a", "az-b", "az-c"]}})
    assert controller.agents.token == TOKEN and TOKEN not in repr(controller)
    write_secret(tmp_path / "empty", "\n")
    for bad in (tmp_path / "missing", tmp_path / "empty"):
        with pytest.raises(ConfigError, match="^agent.token_file: "):
            parse_agent_config({"node": {"name": "n1", "az": "az-a"}, "agent": {"token_file": str(bad)},
                                "topology": {"az-a": ["198.18.1.0/24"]}})
        with pytest.raises(ConfigError, match="^agents.token_file: "):
            parse_config({"controller": {"name": "c", "listen": "127.0.0.1:9741"},
                          "consul": {"address": "http://127.0.0.1:8500"},
                          "agents": {"static": ["http://127.0.0.1:9740"], "token_file": str(bad)},
                          "topology": {"azs": ["az-a", "az-b", "az-c"]}})


def test_the_blocking_reader_sends_the_token_too():
    """`azprobe top` and the demo read through WindowReader (compact encoding)."""
    with agent_server(token=TOKEN) as (server, url):
        with pytest.raises(AgentHttpStatus, match="HTTP 401"):
            WindowReader(url).pull()
        pulled = WindowReader(url, token=TOKEN).pull()
        assert [w.seq for w in pulled.windows] == [1, 2] and not pulled.errors


def test_pipelined_requests_are_answered_in_order_on_one_connection():
    with agent_server(token=TOKEN) as (server, url):
        sock = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
        with sock:
            sock.sendall(b"\r\n" + WINDOWS_REQUEST + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 300
                         + b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):  # until the server closes, after the last
                data += chunk
            statuses = []
            while data:
                head, _, data = data.partition(b"\r\n\r\n")
                statuses.append(head.split(b" ", 2)[1])
                data = data[int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]):]
            assert statuses == [b"200"] * 301 + [b"404"]


@pytest.mark.parametrize("request_bytes, status", [
    (b"POST /v1/windows HTTP/1.1\r\nHost: x\r\n\r\n", b"405"),
    (b"GET /healthz HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", b"400"),
    (b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n", b"431"),
    (b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 20_000, b"431"),  # too long before it ends, too
    (b"BREW /pot HTCPCP/1.0\r\n\r\n", b"505"),
    (b"GET //[::1/v1/windows HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),  # urlsplit: "Invalid IPv6 URL"
    (b"GET /healthz HTTP/1.0\r\n\r\n", b"200"),  # HTTP/1.0 without keep-alive: closed after
])
def test_requests_outside_the_protocol_are_answered_and_closed(request_bytes, status):
    with agent_server() as (server, url):
        sock = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
        with sock:
            sock.sendall(request_bytes)
            assert read_response(sock).split(b" ", 2)[1] == status
            assert closed_by_server(sock)


class BrokenMetrics(State):
    def healthy(self) -> tuple[bool, str]:
        raise RuntimeError("a bug in the agent")


def test_a_failing_answer_is_a_500_and_the_server_goes_on(caplog):
    with agent_server(state=BrokenMetrics()) as (server, url):
        assert get(url + "/healthz")[0] == 500
        assert get(url + "/v1/windows?after=0")[0] == 200
        assert server.in_flight("open") == 0
    assert any("error answering" in r.getMessage() for r in caplog.records)
