"""What is on the wire: a request head parsed and bounded, a response encoded in one buffer."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

MAX_HEAD_BYTES = 16 * 1024  # a request line and headers; the bearer token alone may be 4 KiB
MAX_HEADERS = 100


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Mapping[str, str]  # lower-case names
    keep_alive: bool


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


class HeadError(ValueError):
    """A request this server does not serve: answered with `response()`, then closed."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers

    def response(self) -> Response:
        return Response(self.status, error_body(str(self)), headers=self.headers)


def parse_head(head: bytes) -> Request:
    """A request line and headers (without the blank line). Raises HeadError."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise HeadError(400, f"bad request line {lines[0][:60]!r}")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HeadError(505, f"HTTP version {version[:20]!r} is not served (HTTP/1.1 is)")
    if len(lines) - 1 > MAX_HEADERS:
        raise HeadError(431, f"more than {MAX_HEADERS} headers")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HeadError(400, f"bad header line {line[:60]!r}")
        headers[name.lower()] = value.strip()
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    keep_alive = "keep-alive" in tokens if version == "HTTP/1.0" else "close" not in tokens
    try:
        url = urlsplit(target)
    except ValueError:
        # urlsplit raises a bare ValueError for a bracket it cannot close ("//[::1/x",
        # "Invalid IPv6 URL"); unanswered, that is a traceback per request and a close
        # with no response, so the client gets a 400 naming the target instead.
        raise HeadError(400, f"bad request target {target[:60]!r}") from None
    return Request(method, url.path, parse_qs(url.query), headers, keep_alive)


def take_request(buf: bytearray) -> Request | None:
    """The next request in `buf`, its head consumed from it; None until the head is
    complete. Raises HeadError for a head over MAX_HEAD_BYTES, one that does not parse,
    a request with a body (never read) or a method but GET."""
    while buf.startswith(b"\r\n"):  # blank lines before a request line are allowed
        del buf[:2]
    end = buf.find(b"\r\n\r\n")
    if end < 0 or end > MAX_HEAD_BYTES:
        if len(buf) > MAX_HEAD_BYTES:
            raise HeadError(431, f"request head over {MAX_HEAD_BYTES} bytes")
        return None
    head = bytes(buf[:end])
    del buf[:end + 4]
    request = parse_head(head)
    if has_body(request):
        raise HeadError(400, "requests have no body here (GET only)")
    if request.method != "GET":
        raise HeadError(405, "GET only", headers=(("Allow", "GET"),))
    return request


def has_body(request: Request) -> bool:
    return "transfer-encoding" in request.headers or request.headers.get("content-length", "0") != "0"


def encode_response(response: Response, keep_alive: bool) -> bytes:
    """The whole response, head and body, as one buffer (one send)."""
    status = HTTPStatus(response.status)
    head = [f"HTTP/1.1 {status.value} {status.phrase}", f"Date: {formatdate(usegmt=True)}",
            f"Content-Type: {response.content_type}", f"Content-Length: {len(response.body)}",
            *(f"{name}: {value}" for name, value in response.headers),
            "Connection: keep-alive" if keep_alive else "Connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + response.body


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}, separators=(",", ":")).encode()


def error_response(status: int, message: str) -> Response:
    return Response(status, error_body(message))
