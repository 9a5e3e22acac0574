"""Issue 9 item 6: one agent cannot make the controller's pulls burn CPU or memory.
Real sockets on 127.0.0.1: a hostile agent is a raw asyncio server sending exactly the
bytes each test needs."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Callable

import msgspec
import pytest

from azprobe.contracts.windowcodec import COMPACT_TYPE, JSON_TYPE
from azprobe.controller.collect import Collector
from azprobe.controller.window_source import AgentTarget
from azprobe.controller.config import parse_config
from azprobe.errors import ConfigError
from tests.controller_harness import topology
from tests.fakeagent import FakeAgent, FakeAgentServer, PathSpec


async def _hostile_agent(answer: Callable[[asyncio.StreamWriter], object]) -> tuple[asyncio.AbstractServer, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        result = answer(writer)
        if asyncio.iscoroutine(result):
            await result
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def _collector(url: str, **kwargs) -> Collector:
    collector = Collector(evaluation_window_s=30.0, pull_timeout_s=kwargs.pop("pull_timeout_s", 10.0),
                          stale_after_s=5.0, topology=topology(), **kwargs)
    collector.set_targets([AgentTarget(url)])
    return collector


def test_a_failed_big_pull_leaves_no_buffer_behind():
    """Old client: a 32 MB body cut short stayed alive in an exception -> traceback ->
    frame -> connection cycle until a full GC (~33 MB per cycle). Now nothing is held."""
    size = 30 * 1024 * 1024

    def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % (size + 1024))
        writer.write(b" " * size)  # then the agent hangs up, 1 KB short

    async def scenario() -> int:
        server, url = await _hostile_agent(answer)
        collector = _collector(url, max_body_bytes=64 * 1024 * 1024)
        gc.collect()
        gc.disable()  # what a cycle leaks must show, not be swept by chance
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            result = await collector.pull_all()
            assert result.failed == 1
            assert "closed before the response ended" in collector.cursors[url].last_error
            return tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
            gc.enable()
            await collector.close()
            server.close()

    held = asyncio.run(scenario())
    assert held < 2 * 1024 * 1024, f"{held} bytes still held after the failed pull"


def _failed_pull(answer: Callable[[asyncio.StreamWriter], object]) -> str:
    """Pull one hostile agent once with the default caps; the pull must fail: its error."""
    async def scenario() -> str:
        server, url = await _hostile_agent(answer)
        collector = _collector(url)
        try:
            result = await collector.pull_all()
            assert (result.ingested, result.failed) == (0, 1)
            return collector.cursors[url].last_error
        finally:
            await collector.close()
            server.close()

    return asyncio.run(scenario())


async def _keep_writing(writer: asyncio.StreamWriter, head: bytes, part: bytes, times: int, tail: bytes = b"") -> None:
    writer.write(head)
    try:
        for _ in range(times):
            writer.write(part)
            await writer.drain()
        writer.write(tail)
    except ConnectionError:
        pass  # the controller hung up: what these tests want


def test_a_body_over_the_cap_is_refused_without_reading_it():
    error = _failed_pull(lambda w: _keep_writing(w, b"HTTP/1.1 200 OK\r\nContent-Length: 5000000\r\n\r\n",
                                                 b"x" * 100_000, 50))
    assert "exceeds the cap of 1048576" in error


@pytest.mark.parametrize("head, problem", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n", "bad Content-Length"),
    (b"HTTP/1.1 2\xb20 OK\r\nContent-Length: 0\r\n\r\n", "bad status line"),
], ids=["content-length", "status"])
def test_a_head_with_latin1_digits_is_a_bad_answer_at_once(head, problem):
    # str.isdigit() takes "\xb2" (²), which int() refuses: a ValueError out of the
    # protocol's data_received, and the pull ended only by its timeout
    error = _failed_pull(lambda w: w.write(head))
    assert problem in error and "timeout" not in error, error


def test_a_flood_of_one_byte_chunks_is_cut_short():
    """1.2 MB of 1-byte chunks: the old client parsed them all (1.8 s of CPU, the whole
    body re-scanned per read); now the chunk cap ends the pull after a few thousand."""
    error = _failed_pull(lambda w: _keep_writing(w, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                                                 b"1\r\nx\r\n" * 10_000, 120, b"0\r\n\r\n"))
    assert "chunks in one body" in error


def test_a_chunked_page_within_the_caps_is_read():
    agent = FakeAgent("n1", "az-a", [PathSpec(dst="az-b", conn_attempts=10)])
    with FakeAgentServer() as server:
        url = server.add("a1", agent)
        for _ in range(3):
            agent.emit()
        collector = _collector(url)

        async def scenario() -> None:
            result = await collector.pull_all()
            assert (result.ingested, result.failed) == (3, 0)
            await collector.close()

        asyncio.run(scenario())


@pytest.mark.parametrize("url", ["http://127.0.0.1:0", "http://198.18.1.2:0/a/1"])
def test_an_agent_url_with_port_0_is_a_config_error(url):
    with pytest.raises(ConfigError, match="^agents.static: .*port 0"):
        parse_config({"controller": {"name": "c", "listen": "127.0.0.1:9741"},
                      "consul": {"address": "http://127.0.0.1:8500"}, "agents": {"static": [url]},
                      "topology": {"azs": ["az-a", "az-b", "az-c"]}})


def _nested_msgpack_page(depth: int) -> bytes:
    """[node, az, boot_id, [[[...]]]]: a 4-array header, the names, then `depth` arrays of one."""
    names = b"".join(msgspec.msgpack.encode(s) for s in ("n-x", "az-a", "boot"))
    return b"\x94" + names + b"\x91" * depth + b"\x90"


@pytest.mark.parametrize("body, media", [
    (b'{"node": "n-x", "az": "az-a", "boot_id": "b", "windows": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
     JSON_TYPE),
    (_nested_msgpack_page(200_000), COMPACT_TYPE),
], ids=["json", "msgpack"])
def test_a_deeply_nested_page_is_one_failed_pull_and_the_others_are_pulled(body, media):
    """200 KB of [[[...]]] as the answer: a failed pull of that agent, counted and named,
    while the one worker goes on to pull the agents after it, this cycle and the next."""
    hostile = FakeAgent("n-x", "az-a", [PathSpec(dst="az-b")])
    hostile.raw_answer = (body, media)
    honest = [FakeAgent(f"n{i}", "az-a", [PathSpec(dst="az-b", conn_attempts=10)]) for i in range(2)]
    with FakeAgentServer() as server:
        urls = [server.add("x", hostile)] + [server.add(f"h{i}", a) for i, a in enumerate(honest)]
        collector = Collector(evaluation_window_s=30.0, pull_timeout_s=10.0, stale_after_s=5.0, concurrency=1,
                              topology=topology())
        collector.set_targets(AgentTarget(u) for u in urls)

        async def scenario() -> None:
            try:
                for cycle in range(2):
                    for agent in honest:
                        agent.emit()
                    result = await collector.pull_all()
                    assert (result.ingested, result.failed) == (2, 1)
                    assert collector.counters.pull_errors == cycle + 1
            finally:
                await collector.close()

        asyncio.run(scenario())
    error = collector.cursors[urls[0]].last_error
    assert "nested" in error and "\n" not in error, error
    assert all(collector.cursors[u].failures == 0 for u in urls[1:])


def test_the_per_url_state_is_that_of_the_current_targets_however_discovery_churns():
    """A new agent address every cycle (pods rescheduled, nodes re-registered): the parsed
    endpoints and the pool's per-host lists held one entry per address ever pulled."""
    import socket

    def closed_port() -> int:  # refused at once: the pull fails fast, after the pool made its entry
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    collector = _collector(f"http://127.0.0.1:{closed_port()}", pull_timeout_s=2.0)

    async def scenario() -> None:
        try:
            for _ in range(30):
                collector.set_targets([AgentTarget(f"http://127.0.0.1:{closed_port()}/a")])
                result = await collector.pull_all()
                assert result.failed == 1
            assert len(collector._endpoints) == 1 and len(collector._http._idle) <= 1, \
                (len(collector._endpoints), len(collector._http._idle))
        finally:
            await collector.close()

    asyncio.run(scenario())
