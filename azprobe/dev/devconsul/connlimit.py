"""Consul's `limits.http_max_conns_per_client` (hashicorp/go-connlimit on the HTTP
listener): a cap on the TCP connections one client IP holds open, not on its requests.

A new connection from an IP that already holds the cap is answered at once with
Consul's raw `429 Too Many Requests` ("Your IP is issuing too many concurrent
connections, please rate limit your calls") and closed, before any request is read.
Connections already open are never touched: a client holding a keep-alive connection
(a controller renewing its session) keeps being served however many other clients on
its host park blocking queries; it is the newcomers that are refused. A connection's
slot is freed when it closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

DEFAULT_MAX_CONNS_PER_CLIENT = 200  # Consul's default
_MESSAGE = b"Your IP is issuing too many concurrent connections, please rate limit your calls\n"
TOO_MANY_CONNECTIONS = (b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain\r\n"
                        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(_MESSAGE)) + _MESSAGE


class ConnLimiter:
    """Open connections per client IP, and the protocol factory that enforces the cap."""

    def __init__(self, max_per_client: int) -> None:
        self.max_per_client = max_per_client
        self.open: dict[str, int] = {}

    def accept(self, ip: str) -> bool:
        if self.open.get(ip, 0) >= self.max_per_client:
            return False
        self.open[ip] = self.open.get(ip, 0) + 1
        return True

    def free(self, ip: str) -> None:
        left = self.open.get(ip, 0) - 1
        if left > 0:
            self.open[ip] = left
        else:
            self.open.pop(ip, None)

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for loop.create_server that admits a connection to `inner`
        (aiohttp's request handler) only within the cap."""
        return lambda: _Gate(self, inner)


class _Gate(asyncio.Protocol):
    """Stands in front of one connection's real protocol and passes every event on."""

    def __init__(self, limiter: ConnLimiter, inner: Callable[[], asyncio.Protocol]) -> None:
        self._limiter = limiter
        self._make_inner = inner
        self._inner: asyncio.Protocol | None = None
        self._ip: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        ip = peer[0] if isinstance(peer, tuple) else str(peer)
        if not self._limiter.accept(ip):
            assert isinstance(transport, asyncio.Transport)
            transport.write(TOO_MANY_CONNECTIONS)
            transport.close()
            return
        self._ip = ip
        self._inner = self._make_inner()
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ip is not None:
            self._limiter.free(self._ip)
            self._ip = None
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:  # a refused connection's request is never read
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()
