"""The open connections: each one's phase and deadline, and the order in which they are
pushed out when a new connection needs room."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from time import monotonic
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from azprobe.agent.httpserver.pools import PoolState

HEAD, IDLE, WORK, WRITE, CLOSED = "head", "idle", "work", "write", "closed"
NO_DEADLINE = float("inf")
SWEEP_S = 0.1  # deadline sweep granularity: sweeps are at least this far apart
# A non-blocking socket that cannot go on now; a TLS socket says so with its own errors.
WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 512  # each a descriptor and <= MAX_HEAD_BYTES, no thread
    head_timeout_s: float = 5.0  # the whole request head; a client sends it in one write
    idle_timeout_s: float = 65.0  # between requests: above the controller's longest interval_s (60 s)
    write_timeout_s: float = 10.0  # the whole response


@dataclass(eq=False)
class Connection:
    sock: socket.socket
    peer: str
    phase: str = HEAD
    deadline: float = 0.0
    buf: bytearray = field(default_factory=bytearray)
    out: memoryview | None = None
    close_after: bool = False
    authenticated: bool = False
    pool: PoolState | None = None  # the pool whose slot this connection's request holds
    events: int = 0  # what the selector watches for
    tls_pending: bool = False  # a TLS socket whose handshake is not done (agent/httpserver/tlsserve.py)
    tls_generation: int = 0  # the build of the TLS material its handshake used

    def __post_init__(self) -> None:
        self.tls_pending = isinstance(self.sock, ssl.SSLSocket)


class ConnectionTable:
    """Every open connection, and those that may be pushed out (all but the ones being
    computed), oldest first: the unauthenticated ones before those that proved the token."""

    def __init__(self) -> None:
        self._open: dict[Connection, None] = {}
        self._waiting: tuple[dict[Connection, None], dict[Connection, None]] = ({}, {})
        self.next_deadline = NO_DEADLINE  # the next sweep: no connection's deadline is before it

    def __len__(self) -> int:
        return len(self._open)

    def __iter__(self) -> Iterator[Connection]:
        return iter(list(self._open))

    def add(self, conn: Connection) -> None:
        self._open[conn] = None

    def enter(self, conn: Connection, phase: str, timeout_s: float) -> None:
        """`conn` is now in `phase`, due within `timeout_s` (and last in the push-out order)."""
        conn.phase = phase
        conn.deadline = monotonic() + timeout_s
        for waiting in self._waiting:
            waiting.pop(conn, None)
        if phase != WORK:  # a request being computed is bounded by its pool, not pushed out
            self._waiting[conn.authenticated][conn] = None
            self.next_deadline = min(self.next_deadline, conn.deadline)

    def oldest(self) -> Connection | None:
        """The connection to push out for a new one; None if every one is being computed."""
        for waiting in self._waiting:
            for conn in waiting:
                return conn
        return None

    def expired(self, now: float) -> list[Connection]:
        """The connections past their deadline. The next sweep is at the earliest deadline
        of the rest, and at least SWEEP_S away."""
        late, earliest = [], NO_DEADLINE
        for waiting in self._waiting:
            for conn in waiting:
                if now >= conn.deadline:
                    late.append(conn)
                else:
                    earliest = min(earliest, conn.deadline)
        self.next_deadline = max(earliest, now + SWEEP_S) if earliest < NO_DEADLINE else earliest
        return late

    def remove(self, conn: Connection) -> None:
        for waiting in self._waiting:
            waiting.pop(conn, None)
        self._open.pop(conn, None)
