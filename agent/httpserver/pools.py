"""Requests in flight per pool, and the worker threads that answer them."""

from __future__ import annotations

import logging
import socket
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from azprobe.agent.httpserver.connections import WOULD_BLOCK, Connection
from azprobe.agent.httpserver.wire import Response, encode_response, error_response

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pool:
    workers: int  # threads computing answers; 0: the IO loop computes them itself
    slots: int  # requests in flight (computed or being written); beyond, 503


@dataclass(frozen=True)
class Work:
    """A request for a pool: `answer` runs on one of its worker threads."""

    pool: str
    answer: Callable[[], Response]
    authenticated: bool = False  # the request proved the token: its connection is pushed out last


@dataclass(eq=False)
class PoolState:
    name: str
    slots: int
    executor: ThreadPoolExecutor | None
    in_flight: int = 0
    busy: int = 0  # requests answered 503: every slot was taken


@dataclass(frozen=True)
class Answered:
    """A worker's answer handed back to the IO loop, which writes any rest."""

    conn: Connection
    data: bytes
    sent: int  # bytes of it already sent; -1: the peer is gone
    keep_alive: bool


def compute(conn: Connection, answer: Callable[[], Response], keep: bool) -> tuple[Response, bool]:
    """The answer, or a 500 (and close) when computing it failed."""
    try:
        return answer(), keep
    except Exception:
        log.exception("http: error answering %s", conn.peer)
        return error_response(500, "internal error (the agent's log has it)"), False


class Pools:
    """The pools' slots and workers. A worker hands its connection back through a queue
    and wakes the IO loop through a socket pair the loop's selector watches."""

    def __init__(self, pools: Mapping[str, Pool]) -> None:
        self._pools = {name: PoolState(name, p.slots, ThreadPoolExecutor(p.workers, f"agent-http-{name}")
                                       if p.workers else None) for name, p in pools.items()}
        self.wake_r, self._wake_w = socket.socketpair()
        for sock in (self.wake_r, self._wake_w):
            sock.setblocking(False)
        self._answered: deque[Answered] = deque()

    def in_flight(self, pool: str) -> int:
        return self._pools[pool].in_flight

    def busy(self) -> dict[str, int]:
        """Requests answered 503 per pool, since start."""
        return {name: pool.busy for name, pool in self._pools.items()}

    def acquire(self, conn: Connection, pool_name: str) -> PoolState | None:
        """A slot of the pool for `conn`'s request; None (counted busy) when all are taken."""
        pool = self._pools[pool_name]
        if pool.in_flight >= pool.slots:
            pool.busy += 1
            return None
        pool.in_flight += 1
        conn.pool = pool
        return pool

    @staticmethod
    def release(conn: Connection) -> None:
        if conn.pool is not None:
            conn.pool.in_flight -= 1
            conn.pool = None

    def submit(self, pool: PoolState, conn: Connection, answer: Callable[[], Response], keep: bool) -> None:
        assert pool.executor is not None
        pool.executor.submit(self._answer, conn, answer, keep)

    def _answer(self, conn: Connection, answer: Callable[[], Response], keep: bool) -> None:
        """On a worker thread: compute, encode, send what the socket takes at once (all of
        it, as a rule: the response leaves without waiting for the IO loop), and hand the
        connection back to the IO loop, which writes any rest. The IO loop does not touch
        a connection while it is being answered."""
        response, keep = compute(conn, answer, keep)
        data = encode_response(response, keep)
        try:
            sent = conn.sock.send(data)
        except WOULD_BLOCK:
            sent = 0
        except OSError as exc:
            log.debug("http: client %s went away: %s", conn.peer, exc)
            sent = -1
        self._answered.append(Answered(conn, data, sent, keep))
        self.wake()

    def answered(self) -> Iterator[Answered]:
        """On the IO loop: the answers the workers handed back, oldest first."""
        while self._answered:
            yield self._answered.popleft()

    def wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # already woken, or closed at shutdown

    def drain_wake(self) -> None:
        try:
            while self.wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def close(self) -> None:
        for pool in self._pools.values():
            if pool.executor is not None:
                pool.executor.shutdown(wait=False, cancel_futures=True)
        for sock in (self.wake_r, self._wake_w):
            sock.close()
