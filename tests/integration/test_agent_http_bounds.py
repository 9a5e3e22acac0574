"""Issue 9 item 7: the agent's HTTP side, over real sockets on 127.0.0.1. Bounded
connections and per-connection timeouts, quiet client disconnects, the bearer token on
/v1/* (sent by the controller), and /v1/events only with a token or on loopback."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from azprobe.agent.config import parse_agent_config
from azprobe.agentclient import AgentHttpStatus, WindowReader
from azprobe.agent.http import BoundedHTTPServer, make_server, serve_in_background
from azprobe.contracts.window import Window, parse_window
from azprobe.contracts.windowcodec import COMPACT_TYPE
from azprobe.controller.collect import AgentTarget, Collector
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


def test_half_sent_requests_hold_at_most_the_connection_cap():
    """Old server: a thread per connection, no limit (500 half-sent requests held 500
    threads). Now the cap is served and the rest get a prompt 503."""
    threads_before = threading.active_count()
    with agent_server(max_connections=4, timeout_s=30.0) as (server, url):
        port = server.server_address[1]
        held = [half_sent_request(port) for _ in range(4)]
        try:
            wait_for(lambda: server.active == 4, "four connections in service")
            extra = [half_sent_request(port) for _ in range(20)]
            for sock in extra:
                assert sock.recv(200).startswith(b"HTTP/1.1 503 ")
                sock.close()
            assert server.rejected == 20
            assert threading.active_count() <= threads_before + 1 + 4  # serve_forever + the cap
        finally:
            for sock in held:
                sock.close()
        wait_for(lambda: server.active == 0, "the held connections to end")
        assert get(url + "/healthz")[0] == 200  # slots free again


def test_a_silent_connection_is_closed_after_the_timeout():
    with agent_server(timeout_s=0.3) as (server, url):
        sock = half_sent_request(server.server_address[1])
        with sock:
            assert sock.recv(100) == b""  # the agent hung up (the client waits up to 10 s)
        wait_for(lambda: server.active == 0, "the connection slot to be freed")


def test_a_client_that_goes_away_is_no_traceback(capfd, caplog):
    caplog.set_level(logging.DEBUG, logger="azprobe.agent.http")
    state = State(windows=3000)  # a page far bigger than the socket buffers
    with agent_server(state=state) as (server, url):
        for _ in range(3):
            sock = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.sendall(b"GET /v1/windows?after=0 HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.recv(10)
            sock.close()  # reset mid-response
        wait_for(lambda: server.active == 0, "the server to notice")
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
