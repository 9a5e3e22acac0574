"""The pull client's response parser, fed by hand (no sockets): chunked bodies parsed
incrementally, the body cap, the chunk-count cap, and buffers dropped on every outcome."""

from __future__ import annotations

import asyncio

import pytest

from azprobe.clients.transport import Endpoint, HttpError, Response, _Connection


class Transport:
    def __init__(self) -> None:
        self.closed = False

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def feed(parts: list[bytes], *, max_body_bytes: int = 1 << 20, eof: bool = False,
         watch=None) -> Response:
    """Feed `parts` to one request's connection; returns the response or raises its error."""

    async def run() -> Response:
        conn = _Connection(max_body_bytes)
        conn.connection_made(Transport())  # type: ignore[arg-type]
        future = conn.request(b"GET / HTTP/1.1\r\n\r\n", asyncio.get_running_loop())
        for part in parts:
            conn.data_received(part)
            if watch:
                watch(conn)
            if future.done():
                break
        if eof and not future.done():
            conn.connection_lost(None)
        assert future.done(), "the response did not complete"
        return future.result()

    return asyncio.run(run())


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_chunked_body_with_extensions_and_trailers():
    body = b"4\r\nWiki\r\n5;ext=1\r\npedia\r\n0\r\nX-Trailer: 1\r\n\r\n"
    response = feed([HEAD + body])
    assert (response.status, response.body, response.content_type) == (200, b"Wikipedia", "application/json")
    # The same bytes one at a time: the parser resumes wherever a read ended.
    assert feed([HEAD] + [bytes([b]) for b in body]).body == b"Wikipedia"


def test_chunked_body_is_consumed_as_it_arrives():
    """Old parser: every read re-scanned the whole body from its start (1.2 MB of 1-byte
    chunks cost 1.8 s of CPU). Now what a read consumed leaves the buffer at once."""
    held: list[int] = []
    parts = [HEAD] + [b"1\r\nx\r\n"] * 3000 + [b"0\r\n\r\n"]
    response = feed(parts, watch=lambda conn: held.append(len(conn.buf)))
    assert response.body == b"x" * 3000
    assert max(held) < 16  # never more than one chunk's framing pending


def test_a_body_in_tiny_chunks_is_refused_early():
    parts = [HEAD] + [b"1\r\nx\r\n"] * 200_000
    with pytest.raises(HttpError, match="chunks"):
        feed(parts, max_body_bytes=64 * 1024)


@pytest.mark.parametrize("head, parts, match", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n", [], "exceeds the cap"),
    (HEAD, [b"200000\r\n" + b"x" * 10], "exceeds the cap"),
    (HEAD, [b"zz\r\n"], "bad chunk size"),
    (HEAD, [b"-1\r\n"], "bad chunk size"),
    (HEAD, [b"2\r\nxxyy"], "CRLF"),
    (HEAD, [b"1" * 2000], "too long"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1e3\r\n\r\n", [], "Content-Length"),
    (b"SMTP 220 hello\r\n\r\n", [], "status line"),
])
def test_malformed_or_oversized_responses(head, parts, match):
    with pytest.raises(HttpError, match=match):
        feed([head, *parts], max_body_bytes=1 << 20)


def test_body_until_close_is_capped():
    head = b"HTTP/1.0 200 OK\r\n\r\n"
    assert feed([head, b"abc"], eof=True).body == b"abc"
    with pytest.raises(HttpError, match="exceeds the cap"):
        feed([head, b"x" * 70_000], max_body_bytes=65_536)


def test_failure_and_success_both_drop_the_buffers():
    async def run() -> tuple[_Connection, _Connection]:
        ok, bad = _Connection(), _Connection()
        for conn in (ok, bad):
            conn.connection_made(Transport())  # type: ignore[arg-type]
        done = ok.request(b"GET /", asyncio.get_running_loop())
        ok.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc")
        failed = bad.request(b"GET /", asyncio.get_running_loop())
        bad.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 900000\r\n\r\n" + b"x" * 500_000)
        bad.connection_lost(None)  # the agent went away mid-body
        assert (await done).body == b"abc"
        with pytest.raises(ConnectionResetError):
            await failed
        return ok, bad

    ok, bad = asyncio.run(run())
    for conn in (ok, bad):
        assert len(conn.buf) == 0 and len(conn.body) == 0 and conn.waiter is None


@pytest.mark.parametrize("url", ["http://127.0.0.1:0", "http://127.0.0.1:0/a/1", "https://[::1]:0",
                                 "http://127.0.0.1:99999", "ftp://127.0.0.1:9740", "http://:9740"])
def test_unusable_agent_urls_are_refused(url):
    with pytest.raises(HttpError):
        Endpoint.parse(url)


def test_default_ports_and_paths():
    assert Endpoint.parse("http://10.0.0.1/a/7/") == Endpoint("http", "10.0.0.1", 80, "/a/7")
    assert Endpoint.parse("https://[::1]:9740").host_header == "[::1]:9740"


def test_a_connection_closed_before_the_request_is_a_connection_error():
    """An agent that accepts and hangs up at once (a full server answering 503 and closing)
    is a ConnectionError the pull handles, not an AssertionError from inside the client."""

    async def run() -> None:
        conn = _Connection()
        conn.connection_made(Transport())  # type: ignore[arg-type]
        conn.connection_lost(None)
        with pytest.raises(ConnectionResetError, match="before the request"):
            conn.request(b"GET / HTTP/1.1\r\n\r\n", asyncio.get_running_loop())

    asyncio.run(run())
