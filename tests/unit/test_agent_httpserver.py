"""The agent's HTTP server's request-head parser, response encoder and connection table,
fed by hand."""

from __future__ import annotations

import json
import socket

import pytest

from azprobe.agent.httpserver.connections import HEAD, IDLE, NO_DEADLINE, WORK, Connection, ConnectionTable
from azprobe.agent.httpserver.wire import (MAX_HEAD_BYTES, MAX_HEADERS, HeadError, Response, encode_response, has_body,
                                           parse_head, take_request)


def test_a_request_head():
    request = parse_head(b"GET /v1/windows?after=7&after=9 HTTP/1.1\r\nHost: x\r\nAuthorization:  Bearer t \r\n"
                         b"ACCEPT: a/b")
    assert (request.method, request.path, request.query["after"]) == ("GET", "/v1/windows", ["7", "9"])
    assert request.headers["authorization"] == "Bearer t" and request.headers["accept"] == "a/b"
    assert request.keep_alive and not has_body(request)


@pytest.mark.parametrize("head, keep_alive", [
    (b"GET / HTTP/1.1", True),
    (b"GET / HTTP/1.1\r\nConnection: close", False),
    (b"GET / HTTP/1.1\r\nConnection: TE, Close", False),
    (b"GET / HTTP/1.0", False),
    (b"GET / HTTP/1.0\r\nConnection: keep-alive", True),
])
def test_keep_alive_follows_the_version_and_connection_header(head, keep_alive):
    assert parse_head(head).keep_alive is keep_alive


@pytest.mark.parametrize("head, status, match", [
    (b"GET /", 400, "request line"),
    (b"GET  / HTTP/1.1", 400, "request line"),
    (b"GET / HTTP/2.0", 505, "version"),
    (b"GET / HTTP/1.1\r\nno colon here", 400, "header line"),
    (b"GET / HTTP/1.1\r\nHost: x\r\n folded: value", 400, "header line"),
    (b"GET / HTTP/1.1" + b"\r\nX: y" * (MAX_HEADERS + 1), 431, "headers"),
    # urlsplit's own ValueError ("Invalid IPv6 URL") must be an answer, not a traceback
    (b"GET //[::1/v1/windows HTTP/1.1", 400, r"bad request target '//\[::1/v1/windows'"),
    (b"GET http://[" + b"x" * 100 + b" HTTP/1.1", 400, r"bad request target 'http://\[x{52}'$"),
])
def test_bad_heads_name_their_problem(head, status, match):
    with pytest.raises(HeadError, match=match) as caught:
        parse_head(head)
    assert caught.value.status == status


@pytest.mark.parametrize("header", [b"Content-Length: 3", b"Transfer-Encoding: chunked"])
def test_a_request_with_a_body_is_recognised(header):
    assert has_body(parse_head(b"GET / HTTP/1.1\r\n" + header))
    assert not has_body(parse_head(b"GET / HTTP/1.1\r\nContent-Length: 0"))


def test_a_response_is_one_buffer_with_its_framing():
    data = encode_response(Response(401, b'{"e":1}', headers=(("WWW-Authenticate", "Bearer"),)), keep_alive=True)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 401 Unauthorized" and body == b'{"e":1}'
    assert {"Content-Type: application/json", "Content-Length: 7", "WWW-Authenticate: Bearer",
            "Connection: keep-alive"} <= set(lines)
    assert b"Connection: close" in encode_response(Response(503, b""), keep_alive=False)


def test_requests_are_taken_from_the_buffer_one_head_at_a_time():
    buf = bytearray(b"\r\nGET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\n")
    assert take_request(buf).path == "/a"
    assert buf == bytearray(b"GET /b HTTP/1.1\r\n")  # a pipelined head, not complete yet
    assert take_request(buf) is None and buf == bytearray(b"GET /b HTTP/1.1\r\n")
    buf += b"\r\n"
    assert take_request(buf).path == "/b" and not buf


@pytest.mark.parametrize("data, status, headers", [
    (b"GET / HTTP/1.1\r\nX: " + b"y" * MAX_HEAD_BYTES, 431, ()),
    (b"GET / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", 400, ()),
    (b"POST / HTTP/1.1\r\n\r\n", 405, (("Allow", "GET"),)),
    (b"GET / HTTP/2.0\r\n\r\n", 505, ()),
])
def test_a_request_not_served_is_an_answer_and_a_close(data, status, headers):
    with pytest.raises(HeadError) as caught:
        take_request(bytearray(data))
    response = caught.value.response()
    assert (response.status, response.headers) == (status, headers)
    assert json.loads(response.body)["error"]


def test_the_push_out_order_is_unauthenticated_oldest_first_and_never_a_request_being_computed():
    table = ConnectionTable()
    a, b, c = (Connection(socket.socket(), peer) for peer in "abc")
    try:
        b.authenticated = True
        for conn in (b, a, c):
            table.add(conn)
            table.enter(conn, HEAD, 5.0)
        assert table.oldest() is a  # older b proved the token: pushed out last
        table.enter(a, WORK, 0.0)
        assert table.oldest() is c
        table.enter(c, WORK, 0.0)
        assert table.oldest() is b
        table.enter(b, WORK, 0.0)
        assert table.oldest() is None and len(table) == 3
    finally:
        for conn in (a, b, c):
            conn.sock.close()


def test_expired_connections_and_the_next_sweep():
    table = ConnectionTable()
    late, fresh = Connection(socket.socket(), "late"), Connection(socket.socket(), "fresh")
    try:
        table.enter(late, HEAD, 0.0)
        table.enter(fresh, IDLE, 60.0)
        now = late.deadline + 0.001
        assert table.expired(now) == [late]
        assert table.next_deadline == fresh.deadline
        table.remove(late)
        table.remove(fresh)
        assert table.expired(now) == [] and table.next_deadline == NO_DEADLINE
    finally:
        late.sock.close()
        fresh.sock.close()
