"""The agent's HTTP/1.1 server: GET only, every resource a network peer can take bounded.

One thread (the IO loop) accepts, reads request heads and writes responses, non-blocking,
for every connection. So a connection costs a file descriptor and at most MAX_HEAD_BYTES
of buffer, never a thread, however slowly it sends or reads (docs/scale.md, "The agent's
HTTP side"):

- **Whole-request deadlines.** A request head must be complete within `head_timeout_s`
  of the connection's accept, or of the first byte of the next request on a kept-alive
  connection; a response must be taken within `write_timeout_s`; a kept-alive connection
  silent for `idle_timeout_s` is closed. Requests carry no body (GET only).
- **Connections.** At most `max_connections` are open. Beyond, a new connection closes
  the one waiting longest (reading a head, idle, or being written), those whose last
  request did not prove the token first: a flood of slow clients pushes out itself, not
  the controller.
- **Pools.** The router sends each request either an answer made at once (401, 404, 400:
  cheap) or a `Work` for a named pool, whose requests in flight (being computed or
  written) are capped at `slots`; beyond, 503 and close. Pools do not share slots. A
  pool's answers are computed on its own worker threads, or with `workers=0` on the IO
  loop itself: no thread handoff, for short answers that should leave at once (a handoff
  there and back cost a pull more CPU than the answer itself).
- **One send per response.** The head and body leave in one buffer, on sockets with
  TCP_NODELAY: a head and a body in two sends meet Nagle's algorithm and the client's
  delayed ACK (~40 ms per request when requests follow each other at once).
"""

from __future__ import annotations

import json
import logging
import selectors
import socket
import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from time import monotonic
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024  # a request line and headers; the bearer token alone may be 4 KiB
MAX_HEADERS = 100
RECV_BYTES = MAX_HEAD_BYTES + 4
SWEEP_S = 0.1  # deadline sweep granularity: sweeps are at least this far apart
ACCEPTS_PER_WAKE = 64  # so a connect flood cannot starve the connections already open
LISTEN_BACKLOG = 128
ACCEPT_WARN_EVERY_S = 10.0


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 512  # each a descriptor and <= MAX_HEAD_BYTES, no thread
    head_timeout_s: float = 5.0  # the whole request head; a client sends it in one write
    idle_timeout_s: float = 65.0  # between requests: above the controller's longest interval_s (60 s)
    write_timeout_s: float = 10.0  # the whole response


@dataclass(frozen=True)
class Pool:
    workers: int  # threads computing answers; 0: the IO loop computes them itself
    slots: int  # requests in flight (computed or being written); beyond, 503


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


@dataclass(frozen=True)
class Work:
    """A request for a pool: `answer` runs on one of its worker threads."""

    pool: str
    answer: Callable[[], Response]
    authenticated: bool = False  # the request proved the token: its connection is pushed out last


Router = Callable[[Request], Response | Work]


class HeadError(ValueError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


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
    url = urlsplit(target)
    return Request(method, url.path, parse_qs(url.query), headers, keep_alive)


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


def error_response(status: int, message: str) -> Response:
    return Response(status, json.dumps({"error": message}, separators=(",", ":")).encode())


HEAD, IDLE, WORK, WRITE, CLOSED = "head", "idle", "work", "write", "closed"


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    peer: str
    phase: str = HEAD
    deadline: float = 0.0
    buf: bytearray = field(default_factory=bytearray)
    out: memoryview | None = None
    close_after: bool = False
    authenticated: bool = False
    pool: "_PoolState | None" = None  # the pool whose slot this connection's request holds
    events: int = 0  # what the selector watches for


@dataclass(eq=False)
class _PoolState:
    name: str
    slots: int
    executor: ThreadPoolExecutor | None
    in_flight: int = 0
    busy: int = 0  # requests answered 503: every slot was taken


class BoundedHTTPServer:
    """serve_forever / shutdown / server_close like socketserver's servers."""

    def __init__(self, address: tuple[str, int], router: Router, pools: Mapping[str, Pool],
                 limits: ConnectionLimits = ConnectionLimits()) -> None:
        if limits.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._listener = socket.create_server(address, family=family, backlog=LISTEN_BACKLOG)
        self._listener.setblocking(False)
        self.server_address = self._listener.getsockname()
        self._router = router
        self._limits = limits
        self._pools = {name: _PoolState(name, p.slots, ThreadPoolExecutor(p.workers, f"agent-http-{name}")
                                        if p.workers else None) for name, p in pools.items()}
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        for sock in (self._wake_r, self._wake_w):
            sock.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._connections: dict[_Connection, None] = {}
        # Connections that may be pushed out, oldest first: [unauthenticated, authenticated].
        self._waiting: tuple[dict[_Connection, None], dict[_Connection, None]] = ({}, {})
        # From the workers: (connection, response, bytes of it already sent or -1: peer gone, keep-alive).
        self._answered: deque[tuple[_Connection, bytes, int, bool]] = deque()
        self._ready: list[_Connection] = []  # a pipelined request already in the buffer
        self._next_sweep = float("inf")  # no deadline before it
        self._accept_paused = False
        self._accept_warned_at = -ACCEPT_WARN_EVERY_S
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
        return self._pools[pool].in_flight

    def busy(self) -> dict[str, int]:
        """Requests answered 503 per pool, since start."""
        return {name: pool.busy for name, pool in self._pools.items()}

    # -- lifecycle
    def serve_forever(self) -> None:
        self._stopped.clear()
        try:
            if self._stop.is_set():  # shut down before this thread got here
                return
            while not self._stop.is_set():
                # Asleep until the next event or deadline: an idle agent does not poll.
                timeout = None if self._next_sweep == float("inf") else max(0.0, self._next_sweep - monotonic())
                for key, mask in self._selector.select(0 if self._ready else timeout):
                    self._on_event(key.data, mask)
                self._take_answers()
                ready, self._ready = self._ready, []
                for conn in ready:
                    self._guarded(self._parse, conn)
                now = monotonic()
                if now >= self._next_sweep:
                    self._sweep(now)
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake()
        self._stopped.wait()

    def server_close(self) -> None:
        for conn in list(self._connections):
            self._close(conn)
        for pool in self._pools.values():
            if pool.executor is not None:
                pool.executor.shutdown(wait=False, cancel_futures=True)
        self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()

    # -- the IO loop
    def _on_event(self, data: object, mask: int) -> None:
        if data == "listener":
            self._accept()
        elif data == "wake":
            try:
                while self._wake_r.recv(4096):
                    pass
            except (BlockingIOError, InterruptedError):
                pass
        elif isinstance(data, _Connection):
            if mask & selectors.EVENT_READ:
                self._guarded(self._read, data)
            if mask & selectors.EVENT_WRITE and data.phase == WRITE:
                self._guarded(self._write, data)

    def _guarded(self, step: Callable[[_Connection], None], conn: _Connection) -> None:
        """One connection's failure is its own: it is closed, the loop goes on."""
        if conn.phase == CLOSED:
            return
        try:
            step(conn)
        except Exception:
            log.exception("http: error serving %s", conn.peer)
            self._close(conn)

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except (ConnectionAbortedError, PermissionError):  # gone before accepted; a firewall
                continue
            except OSError as exc:
                # Out of descriptors or memory: the listener stays readable, so stop
                # watching it until the next sweep instead of spinning on it.
                if monotonic() >= self._accept_warned_at + ACCEPT_WARN_EVERY_S:
                    self._accept_warned_at = monotonic()
                    log.warning("http: accept failed, new connections wait: %s", exc)
                self._accept_paused = True
                self._selector.unregister(self._listener)
                self._next_sweep = min(self._next_sweep, monotonic() + SWEEP_S)  # to watch it again
                return
            if len(self._connections) >= self._limits.max_connections and not self._evict():
                self.refused += 1
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(sock, str(peer[0]))
            self._connections[conn] = None
            self._enter(conn, HEAD, self._limits.head_timeout_s)
            self._watch(conn, selectors.EVENT_READ)

    def _evict(self) -> bool:
        for waiting in self._waiting:
            for victim in waiting:
                log.debug("http: %s pushed out by a new connection (%d open)", victim.peer, len(self._connections))
                self.evicted += 1
                self._close(victim)
                return True
        return False

    def _read(self, conn: _Connection) -> None:
        if conn.phase not in (HEAD, IDLE):
            return
        want = RECV_BYTES - len(conn.buf)
        if want <= 0:  # a pipelined request not parsed yet: that first
            self._parse(conn)
            return
        try:
            data = conn.sock.recv(want)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.debug("http: client %s went away: %s", conn.peer, exc)
            self._close(conn)
            return
        if not data:
            self._close(conn)
            return
        if conn.phase == IDLE:
            self._enter(conn, HEAD, self._limits.head_timeout_s)
        conn.buf += data
        self._parse(conn)

    def _parse(self, conn: _Connection) -> None:
        if conn.phase != HEAD:
            return
        buf = conn.buf
        while buf.startswith(b"\r\n"):  # blank lines before a request line are allowed
            del buf[:2]
        end = buf.find(b"\r\n\r\n")
        if end < 0 or end > MAX_HEAD_BYTES:
            if len(buf) > MAX_HEAD_BYTES:
                self._respond(conn, error_response(431, f"request head over {MAX_HEAD_BYTES} bytes"), keep=False)
            return
        head = bytes(buf[:end])
        del buf[:end + 4]
        try:
            request = parse_head(head)
        except HeadError as exc:
            self._respond(conn, error_response(exc.status, str(exc)), keep=False)
            return
        if has_body(request):  # never read: the connection closes after the answer
            self._respond(conn, error_response(400, "requests have no body here (GET only)"), keep=False)
            return
        if request.method != "GET":
            self._respond(conn, Response(405, b'{"error":"GET only"}', headers=(("Allow", "GET"),)), keep=False)
            return
        routed = self._router(request)
        if isinstance(routed, Response):
            self._respond(conn, routed, request.keep_alive)
            return
        conn.authenticated = conn.authenticated or routed.authenticated
        pool = self._pools[routed.pool]
        if pool.in_flight >= pool.slots:
            pool.busy += 1
            self._respond(conn, Response(503, b"busy\n", "text/plain", (("Retry-After", "1"),)), keep=False)
            return
        pool.in_flight += 1
        conn.pool = pool
        if pool.executor is None:
            response, keep = self._compute(conn, routed.answer, request.keep_alive)
            self._respond(conn, response, keep)
            return
        self._enter(conn, WORK, 0.0)
        self._watch(conn, 0)
        pool.executor.submit(self._answer, conn, routed.answer, request.keep_alive)

    @staticmethod
    def _compute(conn: _Connection, answer: Callable[[], Response], keep: bool) -> tuple[Response, bool]:
        try:
            return answer(), keep
        except Exception:
            log.exception("http: error answering %s", conn.peer)
            return error_response(500, "internal error (the agent's log has it)"), False

    def _answer(self, conn: _Connection, answer: Callable[[], Response], keep: bool) -> None:
        """On a worker thread: compute, encode, send what the socket takes at once (all of
        it, as a rule: the response leaves without waiting for the IO loop), and hand the
        connection back to the IO loop, which writes any rest. The IO loop does not touch
        a connection while it is being answered."""
        response, keep = self._compute(conn, answer, keep)
        data = encode_response(response, keep)
        try:
            sent = conn.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            log.debug("http: client %s went away: %s", conn.peer, exc)
            sent = -1
        self._answered.append((conn, data, sent, keep))
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # already woken, or closed at shutdown

    def _take_answers(self) -> None:
        while self._answered:
            conn, data, sent, keep = self._answered.popleft()
            if conn.phase == CLOSED:
                self._release(conn)
            elif sent < 0:
                self._close(conn)
            else:
                self._start_write(conn, memoryview(data)[sent:], not keep)

    def _respond(self, conn: _Connection, response: Response, keep: bool) -> None:
        self._start_write(conn, encode_response(response, keep), not keep)

    def _start_write(self, conn: _Connection, data: bytes | memoryview, close_after: bool) -> None:
        conn.out = memoryview(data)
        conn.close_after = close_after
        self._enter(conn, WRITE, self._limits.write_timeout_s)
        self._guarded(self._write, conn)

    def _write(self, conn: _Connection) -> None:
        assert conn.out is not None
        if conn.out:
            try:
                sent = conn.sock.send(conn.out)
            except (BlockingIOError, InterruptedError):
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
        self._release(conn)
        if conn.close_after:
            self._close(conn)
            return
        if conn.buf:
            self._enter(conn, HEAD, self._limits.head_timeout_s)
            self._ready.append(conn)
        else:
            self._enter(conn, IDLE, self._limits.idle_timeout_s)
        self._watch(conn, selectors.EVENT_READ)

    def _sweep(self, now: float) -> None:
        if self._accept_paused:
            self._accept_paused = False
            self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        next_deadline = float("inf")
        for waiting in self._waiting:
            for conn in list(waiting):
                if now >= conn.deadline:
                    log.debug("http: %s timed out (%s)", conn.peer, conn.phase)
                    self.timed_out += 1
                    self._close(conn)
                else:
                    next_deadline = min(next_deadline, conn.deadline)
        self._next_sweep = max(next_deadline, now + SWEEP_S) if next_deadline < float("inf") else next_deadline

    # -- connection state
    def _enter(self, conn: _Connection, phase: str, timeout_s: float) -> None:
        conn.phase = phase
        conn.deadline = monotonic() + timeout_s
        for waiting in self._waiting:
            waiting.pop(conn, None)
        if phase != WORK:  # a request being computed is bounded by its pool, not pushed out
            self._waiting[conn.authenticated][conn] = None
            self._next_sweep = min(self._next_sweep, conn.deadline)

    def _watch(self, conn: _Connection, events: int) -> None:
        if events == conn.events:
            return
        if not conn.events:
            self._selector.register(conn.sock, events, conn)
        elif not events:
            self._selector.unregister(conn.sock)
        else:
            self._selector.modify(conn.sock, events, conn)
        conn.events = events

    def _release(self, conn: _Connection) -> None:
        if conn.pool is not None:
            conn.pool.in_flight -= 1
            conn.pool = None

    def _close(self, conn: _Connection) -> None:
        if conn.phase == CLOSED:
            return
        if conn.phase != WORK:  # a worker still holds the slot; _take_answers releases it
            self._release(conn)
        self._watch(conn, 0)
        for waiting in self._waiting:
            waiting.pop(conn, None)
        self._connections.pop(conn, None)
        conn.phase = CLOSED
        conn.buf = bytearray()
        conn.out = None
        try:
            conn.sock.close()
        except OSError:
            pass
