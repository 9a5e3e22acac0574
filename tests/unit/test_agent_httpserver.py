"""The agent's HTTP server's request-head parser and response encoder, fed by hand."""

from __future__ import annotations

import pytest

from azprobe.agent.httpserver import MAX_HEADERS, HeadError, Response, encode_response, has_body, parse_head


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
