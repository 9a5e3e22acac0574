"""The IO loop: accept, read request heads, dispatch them, write responses; every
connection non-blocking on one thread."""

from __future__ import annotations

import logging
import selectors
import ssl
import threading
from collections.abc import Callable, Mapping
from time import monotonic

from azprobe.agent.httpserver.connections import (CLOSED, HEAD, IDLE, NO_DEADLINE, WORK, WOULD_BLOCK, WRITE,
                                                  Connection, ConnectionLimits, ConnectionTable)
from azprobe.agent.httpserver.listener import Listener
from azprobe.agent.httpserver.pools import Pool, Pools, Work, compute
from azprobe.agent.httpserver.wire import MAX_HEAD_BYTES, HeadError, Request, Response, encode_response, take_request

log = logging.getLogger(__name__)

RECV_BYTES = MAX_HEAD_BYTES + 4

Router = Callable[[Request], Response | Work]


class BoundedHTTPServer:
    """serve_forever / shutdown / server_close like socketserver's servers."""

    def __init__(self, address: tuple[str, int], router: Router, pools: Mapping[str, Pool],
                 limits: ConnectionLimits = ConnectionLimits()) -> None:
        if limits.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self._selector = selectors.DefaultSelector()
        try:
            self._listener = Listener(address, self._selector)
        except OSError:
            self._selector.close()
            raise
        self.server_address = self._listener.address
        self._router = router
        self._limits = limits
        self._pools = Pools(pools)
        self._selector.register(self._pools.wake_r, selectors.EVENT_READ, self._pools)
        self._connections = ConnectionTable()
        self._ready: list[Connection] = []  # a pipelined request already in the buffer
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self.evicted = 0  # connections closed to make room for a new one
        self.timed_out = 0  # connections closed at a deadline
        self.refused = 0  # new connections closed at once: every open one was being answered

    # -- what tests and metrics read
    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def in_flight(self, pool: str) -> int:
        return self._pools.in_flight(pool)

    def busy(self) -> dict[str, int]:
        """Requests answered 503 per pool, since start."""
        return self._pools.busy()

    # -- lifecycle
    def serve_forever(self) -> None:
        self._stopped.clear()
        try:
            if self._stop.is_set():  # shut down before this thread got here
                return
            while not self._stop.is_set():
                # Asleep until the next event or deadline: an idle agent does not poll.
                next_sweep = min(self._listener.resume_at, self._connections.next_deadline)
                timeout = None if next_sweep == NO_DEADLINE else max(0.0, next_sweep - monotonic())
                for key, mask in self._selector.select(0 if self._ready else timeout):
                    self._on_event(key.data, mask)
                self._take_answers()
                ready, self._ready = self._ready, []
                for conn in ready:
                    self._guarded(self._parse, conn)
                now = monotonic()
                if now >= min(self._listener.resume_at, self._connections.next_deadline):
                    self._sweep(now)
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        self._stop.set()
        self._pools.wake()
        self._stopped.wait()

    def server_close(self) -> None:
        for conn in self._connections:
            self._close(conn)
        self._pools.close()
        self._selector.close()
        self._listener.close()

    # -- the IO loop
    def _on_event(self, data: object, mask: int) -> None:
        if data is self._listener:
            self._accept()
        elif data is self._pools:
            self._pools.drain_wake()
        elif isinstance(data, Connection):
            if mask & selectors.EVENT_READ:
                self._guarded(self._read, data)
            if mask & selectors.EVENT_WRITE and data.phase == WRITE:
                self._guarded(self._write, data)

    def _guarded(self, step: Callable[[Connection], None], conn: Connection) -> None:
        """One connection's failure is its own: it is closed, the loop goes on."""
        if conn.phase == CLOSED:
            return
        try:
            step(conn)
        except Exception:
            log.exception("http: error serving %s", conn.peer)
            self._close(conn)

    def _accept(self) -> None:
        for sock, peer in self._listener.accept():
            if len(self._connections) >= self._limits.max_connections and not self._evict():
                self.refused += 1
                sock.close()
                continue
            conn = Connection(sock, peer)
            self._connections.add(conn)
            self._connections.enter(conn, HEAD, self._limits.head_timeout_s)
            self._watch(conn, selectors.EVENT_READ)

    def _evict(self) -> bool:
        victim = self._connections.oldest()
        if victim is None:
            return False
        log.debug("http: %s pushed out by a new connection (%d open)", victim.peer, len(self._connections))
        self.evicted += 1
        self._close(victim)
        return True

    def _read(self, conn: Connection) -> None:
        if conn.phase not in (HEAD, IDLE):
            return
        want = RECV_BYTES - len(conn.buf)
        if want <= 0:  # a pipelined request not parsed yet: that first
            self._parse(conn)
            return
        try:
            data = conn.sock.recv(want)
            while data and isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending() and len(data) < want:
                data += conn.sock.recv(want - len(data))  # decrypted already: the selector cannot tell
        except WOULD_BLOCK:
            return
        except OSError as exc:
            log.debug("http: client %s went away: %s", conn.peer, exc)
            self._close(conn)
            return
        if not data:
            self._close(conn)
            return
        if conn.phase == IDLE:
            self._connections.enter(conn, HEAD, self._limits.head_timeout_s)
        conn.buf += data
        self._parse(conn)

    def _parse(self, conn: Connection) -> None:
        """A complete request head in the buffer: parsed, checked, dispatched."""
        if conn.phase != HEAD:
            return
        try:
            request = take_request(conn.buf)
        except HeadError as exc:
            self._respond(conn, exc.response(), keep=False)
            return
        if request is not None:
            self._dispatch(conn, request)

    def _dispatch(self, conn: Connection, request: Request) -> None:
        """The router's answer at once, or a slot of its pool (503 and close when full)."""
        routed = self._router(request)
        if isinstance(routed, Response):
            self._respond(conn, routed, request.keep_alive)
            return
        conn.authenticated = conn.authenticated or routed.authenticated
        pool = self._pools.acquire(conn, routed.pool)
        if pool is None:
            self._respond(conn, Response(503, b"busy\n", "text/plain", (("Retry-After", "1"),)), keep=False)
            return
        if pool.executor is None:
            response, keep = compute(conn, routed.answer, request.keep_alive)
            self._respond(conn, response, keep)
            return
        self._connections.enter(conn, WORK, 0.0)
        self._watch(conn, 0)
        self._pools.submit(pool, conn, routed.answer, request.keep_alive)

    def _take_answers(self) -> None:
        for answered in self._pools.answered():
            conn = answered.conn
            if conn.phase == CLOSED:
                self._pools.release(conn)
            elif answered.sent < 0:
                self._close(conn)
            else:
                self._start_write(conn, memoryview(answered.data)[answered.sent:], not answered.keep_alive)

    def _respond(self, conn: Connection, response: Response, keep: bool) -> None:
        self._start_write(conn, encode_response(response, keep), not keep)

    def _start_write(self, conn: Connection, data: bytes | memoryview, close_after: bool) -> None:
        conn.out = memoryview(data)
        conn.close_after = close_after
        self._connections.enter(conn, WRITE, self._limits.write_timeout_s)
        self._guarded(self._write, conn)

    def _write(self, conn: Connection) -> None:
        assert conn.out is not None
        if conn.out:
            try:
                sent = conn.sock.send(conn.out)
            except WOULD_BLOCK:
                sent = 0
            except OSError as exc:
                log.debug("http: client %s went away: %s", conn.peer, exc)
                self._close(conn)
                return
            conn.out = conn.out[sent:]
        if conn.out:
            self._watch(conn, selectors.EVENT_WRITE)
            return
        conn.out = None
        self._pools.release(conn)
        if conn.close_after:
            self._close(conn)
            return
        if conn.buf:
            self._connections.enter(conn, HEAD, self._limits.head_timeout_s)
            self._ready.append(conn)
        else:
            self._connections.enter(conn, IDLE, self._limits.idle_timeout_s)
        self._watch(conn, selectors.EVENT_READ)

    def _sweep(self, now: float) -> None:
        self._listener.resume()
        for conn in self._connections.expired(now):
            log.debug("http: %s timed out (%s)", conn.peer, conn.phase)
            self.timed_out += 1
            self._close(conn)

    # -- connection state
    def _watch(self, conn: Connection, events: int) -> None:
        if events == conn.events:
            return
        if not conn.events:
            self._selector.register(conn.sock, events, conn)
        elif not events:
            self._selector.unregister(conn.sock)
        else:
            self._selector.modify(conn.sock, events, conn)
        conn.events = events

    def _close(self, conn: Connection) -> None:
        if conn.phase == CLOSED:
            return
        if conn.phase != WORK:  # a worker still holds the slot; _take_answers releases it
            self._pools.release(conn)
        self._watch(conn, 0)
        self._connections.remove(conn)
        conn.phase = CLOSED
        conn.buf = bytearray()
        conn.out = None
        try:
            conn.sock.close()
        except OSError:
            pass
