"""A small keep-alive HTTP/1.1 GET client for pulling agents, on asyncio protocols.

Bounded against a hostile agent (docs/scale.md): a body cap (1 MB by default), chunked
bodies parsed incrementally with a cap on the number of chunks, buffers dropped as soon
as a request ends either way, and no URL with port 0.

Why not aiohttp's client: the controller pulls every agent every second, and at 5,000
agents aiohttp's per-request machinery (request/response objects, URL building,
tracing hooks) costs ~300 µs of CPU each, i.e. more than the whole one-second cycle on
one core. Pulling windows needs one thing: GET a path, read a JSON body. This client
does exactly that (status line, headers, Content-Length or chunked bodies, keep-alive
reuse, http and https) for ~10x less CPU, and nothing else.

Idempotent GETs only: a kept-alive connection the server closed while idle is retried
once on a fresh connection.

A request past its deadline fails at once, but its connection is kept: the response
still on its way is read and dropped (for up to LINGER_S), and the connection goes back
to the pool, so the next request to that agent needs no new TLS handshake. Closing it
instead turns one slow cycle into a handshake per agent the next cycle, which on a busy
box makes the next cycle slow as well (a reconnect storm that never converges).

Rotation: an https connection remembers the context it was made with; once the context
callable hands out another (its files changed), idle connections of the old one are
closed and busy ones are closed when their response ends, so the next request
handshakes with the new material.
"""

from __future__ import annotations

import asyncio
import resource
import ssl
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from mypy_extensions import mypyc_attr

from azprobe.contracts.window import is_decimal
from azprobe.security.tls import TlsFiles, client_context, peer_fingerprint, peer_names

MAX_HEAD_BYTES = 64 * 1024
# A page of a few windows is a few KB (compact) to tens of KB (JSON); a whole ring of
# big windows read after an outage fits in 1 MB compact. Configurable: [agents] max_body_bytes.
MAX_BODY_BYTES = 1024 * 1024
MIN_MEAN_CHUNK_BYTES = 256  # chunks allowed per body: max(64, cap / this)
MAX_CHUNK_LINE_BYTES = 1024
REAP_EVERY_S = 0.02  # deadline sweep granularity
LINGER_S = 10.0  # a connect or a response past its request's deadline may finish for the next request this long
MAX_HANDSHAKES = 256  # TLS handshakes under way at once
_CHUNK_SIZE_LINE, _CHUNK_DATA_END, _CHUNK_TRAILERS = -1, 0, -2  # chunk parser states (else: bytes left)


class HttpError(ValueError):
    """A malformed or oversized response, or an unusable URL."""


REFUSED_AFTER_HANDSHAKE = ("the server closed the connection right after the TLS handshake, before answering: it "
                           "refuses this side's client certificate (none, or not signed by a CA it trusts)")


@mypyc_attr(native_class=False)
class ClosedAfterHandshake(ConnectionResetError):
    """A new TLS connection closed by the server before any answer to its first request.
    Under TLS 1.3 a server checks the client's certificate after the handshake, and the
    alert it sends is dropped by the event loop's TLS layer: this is how that refusal
    shows."""


@dataclass(frozen=True)
class PeerCertificate:
    """What a TLS server proved in its handshake: the SANs of its verified certificate
    (DNS and URI), its serial (hex) and its SHA-256 fingerprint."""

    names: tuple[str, ...]
    serial: str
    fingerprint: str


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes
    keep_alive: bool
    peer: PeerCertificate | None = None  # https: the certificate of the connection that answered


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    path: str  # base path without trailing slash, "" for the root

    @classmethod
    def parse(cls, url: str) -> "Endpoint":
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HttpError(f"{url!r} is not an http(s) URL")
        try:
            port = parts.port
        except ValueError:
            raise HttpError(f"{url!r} has a bad port") from None
        if port == 0:  # urlsplit gives 0 for ":0", which "or default" would turn into 80
            raise HttpError(f"{url!r} has port 0: give the server's real port")
        port = port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def key(self) -> tuple[str, str, int]:
        """The connection pool's key: endpoints that differ only in their path share connections."""
        return (self.scheme, self.host, self.port)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


class _Connection(asyncio.Protocol):
    """One TCP connection; one request in flight at a time.

    The response is parsed as it arrives and the bytes it consumed are dropped, so a
    body sent in many small chunks costs time linear in its size and at most the body
    cap (plus one read) is ever held. Every outcome goes through `_finish` or `_fail`,
    which drop the buffers: a failed pull keeps nothing alive, whatever holds its error.
    """

    def __init__(self, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.transport: asyncio.Transport | None = None
        self.max_body_bytes = max_body_bytes
        # Chunk framing costs CPU per chunk: a body in 1-byte chunks is refused early.
        self.max_chunks = max(64, max_body_bytes // MIN_MEAN_CHUNK_BYTES)
        self.waiter: asyncio.Future[Response] | None = None
        self.closed = False
        self.got_bytes = False
        self.peer: PeerCertificate | None = None
        self.requests = 0
        self.context: ssl.SSLContext | None = None  # https: the material it was made with
        self.key: tuple[str, str, int] | None = None  # the pool's key for it
        self.drained: asyncio.Future[None] | None = None  # an abandoned request's answer, read to drop
        self.answered = False  # the response to the last request has ended
        self._reset()

    def _reset(self) -> None:
        self.buf = bytearray()  # received, not yet consumed
        self.body = bytearray()  # chunked: the data so far
        self._head: tuple[int, str, int | None, bool, bool] | None = None  # status, type, length, chunked, keep
        self._chunk_left = _CHUNK_SIZE_LINE
        self._chunks = 0

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        extra = getattr(transport, "get_extra_info", None)  # absent on the tests' stand-in transports
        tls = extra("ssl_object") if extra is not None else None
        if tls is not None:  # once per connection: every answer on it carries the same peer
            cert = tls.getpeercert()
            self.peer = PeerCertificate(peer_names(cert), str((cert or {}).get("serialNumber", "")),
                                        peer_fingerprint(tls.getpeercert(binary_form=True)))

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        if self.waiter is None and self.drained is None:
            self.close()  # bytes nobody asked for: the connection is out of step
            return
        self.buf += data
        try:
            self._advance(eof=False)
        except HttpError as exc:
            self._fail(exc)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._end_drain()
        if self.waiter is not None:
            try:
                if not self._advance(eof=True):
                    # A TLS alert (the agent refused our certificate) says more than "closed".
                    self._fail(self._lost_why(exc))
            except HttpError as err:
                self._fail(err)
        if self.transport is not None:
            self.transport = None

    def _lost_why(self, exc: Exception | None) -> Exception:
        if isinstance(exc, ssl.SSLError):
            return exc
        if self.peer is not None and self.requests == 1 and not self.got_bytes:
            return ClosedAfterHandshake(REFUSED_AFTER_HANDSHAKE)
        return ConnectionResetError("connection closed before the response ended")

    # -- requests
    def request(self, raw: bytes, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Response]:
        """Send `raw`; the response comes in the future returned, made on the caller's
        `loop` (on Python 3.11 each get_running_loop() is a getpid() system call)."""
        if self.transport is None or self.closed:  # the agent hung up between connect and now
            if self.peer is not None and self.requests == 0:
                raise ClosedAfterHandshake(REFUSED_AFTER_HANDSHAKE)
            raise ConnectionResetError("connection closed before the request was sent")
        self._reset()
        self.got_bytes = False
        self.answered = False
        self.requests += 1
        self.waiter = loop.create_future()
        self.transport.write(raw)
        return self.waiter

    def close(self) -> None:
        self.closed = True
        self._reset()
        self._end_drain()
        if self.transport is not None:
            self.transport.close()

    def abandon(self, exc: BaseException) -> str:
        """End the request in flight with `exc` but read its response on, to drop it and
        keep the connection: "draining" (till `drained`), "ready" (the answer came before
        the cancellation reached its caller) or "closed"."""
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc.with_traceback(None))
        if self.closed or self.transport is None or self.requests == 0:
            self.close()
            return "closed"
        if self.answered:
            return "ready"
        if self.drained is None:
            self.drained = asyncio.get_running_loop().create_future()
        return "draining"

    def _end_drain(self) -> None:
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        self._reset()
        if waiter is not None and not waiter.done():
            # No traceback: its frames would reference this connection and its buffers.
            waiter.set_exception(exc.with_traceback(None))

    def _finish(self, response: Response) -> None:
        waiter, self.waiter = self.waiter, None
        self._reset()
        self.answered = True
        if waiter is not None and not waiter.done():
            waiter.set_result(response)
        else:  # an abandoned or cancelled request's response: dropped
            if not response.keep_alive:
                self.close()
            self._end_drain()

    def _parse_head(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_HEAD_BYTES:
                raise HttpError("response head too large")
            return False
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        status_line = lines[0].split(" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/1.") or not is_decimal(status_line[1], 3):
            raise HttpError(f"bad status line {lines[0][:60]!r}")
        length: int | None = None
        chunked = False
        ctype = ""
        keep = status_line[0] == "HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            value = value.strip()
            if name == "content-length":
                if not is_decimal(value, 18):
                    raise HttpError(f"bad Content-Length {value[:20]!r}")
                length = int(value)
                if length > self.max_body_bytes:
                    raise HttpError(f"body of {length} bytes exceeds the cap of {self.max_body_bytes}")
            elif name == "content-type":
                ctype = value[:200]
            elif name == "transfer-encoding":
                chunked = "chunked" in value.lower()
            elif name == "connection":
                keep = value.lower() == "keep-alive" or (keep and value.lower() != "close")
        self._head = (int(status_line[1]), ctype, length, chunked, keep)
        del self.buf[:end + 4]
        return True

    def _advance(self, eof: bool) -> bool:
        """Consume what arrived; True once the response is complete (and delivered)."""
        if self._head is None and not self._parse_head():
            return False
        assert self._head is not None
        status, ctype, length, chunked, keep = self._head
        if chunked:
            if not self._advance_chunks():
                return False
            body = bytes(self.body)
        elif length is not None:
            if len(self.buf) < length:
                return False
            body = bytes(self.buf[:length])
        else:  # delimited by the end of the connection
            if len(self.buf) > self.max_body_bytes:
                raise HttpError(f"body exceeds the cap of {self.max_body_bytes} bytes")
            if not eof:
                return False
            body, keep = bytes(self.buf), False
        self._finish(Response(status, ctype, body, keep, self.peer))
        return True

    def _advance_chunks(self) -> bool:
        """Chunked transfer coding, one step per chunk part; True at the end of the body.
        What it consumed leaves the buffer, so each byte is looked at once."""
        buf = self.buf
        pos = 0
        try:
            while True:
                left = self._chunk_left
                if left > 0:  # chunk data
                    take = min(left, len(buf) - pos)
                    if take <= 0:
                        return False
                    self.body += buf[pos:pos + take]
                    pos += take
                    self._chunk_left = left - take
                    if self._chunk_left == 0:
                        self._chunk_left = _CHUNK_DATA_END
                    continue
                if left == _CHUNK_DATA_END:
                    if len(buf) - pos < 2:
                        return False
                    if buf[pos:pos + 2] != b"\r\n":
                        raise HttpError("chunk data not followed by CRLF")
                    pos += 2
                    self._chunk_left = _CHUNK_SIZE_LINE
                    continue
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if len(buf) - pos > MAX_CHUNK_LINE_BYTES:
                        raise HttpError("chunk size or trailer line too long")
                    return False
                if left == _CHUNK_TRAILERS:  # trailers end with an empty line
                    if eol == pos:
                        pos += 2
                        return True
                    pos = eol + 2
                    continue
                size_text = bytes(buf[pos:eol]).split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16) if 0 < len(size_text) <= 15 else -1
                except ValueError:
                    size = -1
                if size < 0:
                    raise HttpError(f"bad chunk size {size_text[:20]!r}")
                pos = eol + 2
                self._chunks += 1
                if self._chunks > self.max_chunks:
                    raise HttpError(f"more than {self.max_chunks} chunks in one body")
                if size == 0:
                    self._chunk_left = _CHUNK_TRAILERS
                elif len(self.body) + size > self.max_body_bytes:
                    raise HttpError(f"body exceeds the cap of {self.max_body_bytes} bytes")
                else:
                    self._chunk_left = size
        finally:
            if pos and self._head is not None:
                del buf[:pos]


class AgentHttpClient:
    """Keep-alive connection pool keyed by (scheme, host, port)."""

    def __init__(self, max_idle_per_host: int = 256, max_idle_total: int | None = None,
                 ssl_context: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None,
                 max_body_bytes: int = MAX_BODY_BYTES, user_agent: str = "azprobe",
                 server_name: str | None = None) -> None:
        self.max_idle_per_host = max_idle_per_host
        self.max_body_bytes = max_body_bytes
        self._user_agent = user_agent
        # One idle connection per agent would be 5,000 open files: stay well inside the
        # process's file limit and close what does not fit (it is reopened next cycle).
        self.max_idle_total = max_idle_total if max_idle_total is not None else default_idle_limit()
        # A callable (RotatingContext.current) is asked at every new connection, so rotated
        # material is used from the next handshake on; connections already open finish.
        self._ssl = ssl_context
        self.server_name = server_name  # the name to verify instead of the URL's host
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._idle_count = 0
        self._inflight: dict[_Connection, float] = {}  # connection -> deadline (loop time)
        self._connecting: dict[tuple[str, str, int], asyncio.Task[_Connection]] = {}  # past their request's deadline
        self._handshakes: asyncio.Semaphore | None = None  # made on the loop that uses it
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop that uses it, while it runs
        self._reaper: asyncio.Task[None] | None = None
        self._draining: dict[_Connection, float] = {}  # -> the end of its LINGER_S
        self._draining_https: dict[tuple[str, str, int], _Connection] = {}  # the newest per https key
        self._context: ssl.SSLContext | None = None  # the https material of the connections kept
        # handshakes: TLS connections made; drained: connections kept after their request's
        # deadline; drain_closed: of those, closed after all; rotated: closed for old material.
        self.counters = {"handshakes": 0, "drained": 0, "drain_closed": 0, "rotated": 0}

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = client_context(TlsFiles(), "agents.tls")
        return self._ssl() if callable(self._ssl) else self._ssl

    async def _connect(self, ep: Endpoint) -> _Connection:
        loop = asyncio.get_running_loop()
        if ep.scheme == "https":
            context = self._ssl_context()
            _, conn = await loop.create_connection(self._protocol, ep.host, ep.port, ssl=context,
                                                   server_hostname=self.server_name or ep.host)
            conn.context = context
            self.counters["handshakes"] += 1
        else:
            _, conn = await loop.create_connection(self._protocol, ep.host, ep.port)
        conn.key = ep.key
        return conn

    async def _open(self, ep: Endpoint, key: tuple[str, str, int], deadline: float) -> _Connection:
        """A new connection by `deadline`. One still connecting then (a TLS handshake on a
        busy box: a new leader opens thousands at once) is not thrown away: it goes on for
        up to LINGER_S and the next request to that agent takes it, so a full
        reconnect converges instead of starting every handshake over each cycle."""
        loop = asyncio.get_running_loop()
        task = self._connecting.pop(key, None)
        if task is None:
            task = loop.create_task(self._connect_bounded(ep))
        try:
            return await asyncio.wait_for(asyncio.shield(task), max(deadline - loop.time(), 0.001))
        except BaseException as exc:
            if not task.done() or (not task.cancelled() and task.exception() is None):
                self._connecting[key] = task
                task.add_done_callback(_retrieved)
            if isinstance(exc, (OSError, asyncio.TimeoutError)):
                raise _detached(exc) from None
            raise

    async def _connect_bounded(self, ep: Endpoint) -> _Connection:
        """TLS handshakes MAX_HANDSHAKES at a time: thousands at once would fill every turn
        of the event loop with their steps, and the cycle's own deadlines would wait behind
        them for seconds. The rest queue, already past their requests' deadlines (_open),
        and each one's LINGER_S starts with its handshake, not in the queue: a reconnect of
        thousands drains the queue at the handshake rate, whatever its length, instead of
        timing out the back of the queue and queueing it again."""
        if ep.scheme != "https":
            return await asyncio.wait_for(self._connect(ep), LINGER_S)
        if self._handshakes is None:
            self._handshakes = asyncio.Semaphore(MAX_HANDSHAKES)
        async with self._handshakes:
            return await asyncio.wait_for(self._connect(ep), LINGER_S)

    def _protocol(self) -> _Connection:
        return _Connection(self.max_body_bytes)

    def _watch(self, conn: _Connection, deadline: float) -> None:
        self._inflight[conn] = deadline
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        """Fail requests past their deadline. One sweeping task instead of a timer per
        request: at 5,000 requests a second the timers alone cost ~5 % of the cycle."""
        loop = asyncio.get_running_loop()
        while self._inflight or self._draining:
            await asyncio.sleep(REAP_EVERY_S)
            now = loop.time()
            for conn, deadline in list(self._inflight.items()):
                if now >= deadline:
                    self._inflight.pop(conn, None)
                    self._abandon(conn, TimeoutError("agent did not answer in time"))
            for conn, deadline in list(self._draining.items()):
                if now >= deadline:
                    self.counters["drain_closed"] += 1
                    conn.close()  # ends its drain: _drained forgets it

    def _abandon(self, conn: _Connection, exc: BaseException) -> None:
        """A request given up: its connection reads the response to its end (LINGER_S at
        most) and goes back to the pool, instead of costing the next request a handshake."""
        state = conn.abandon(exc)
        if state == "ready" and conn.key is not None:
            self._keep(conn.key, conn)
        if state != "draining" or conn.key is None:
            return
        self._draining[conn] = asyncio.get_running_loop().time() + LINGER_S
        if self._reaper is None or self._reaper.done():  # its LINGER_S is kept even with nothing in flight
            self._reaper = asyncio.get_running_loop().create_task(self._reap())
        if conn.context is not None:
            self._draining_https[conn.key] = conn
        self.counters["drained"] += 1
        assert conn.drained is not None
        conn.drained.add_done_callback(lambda _: self._drained(conn))

    def _drained(self, conn: _Connection) -> None:
        if self._draining.pop(conn, None) is None or conn.key is None:
            return
        if self._draining_https.get(conn.key) is conn:
            del self._draining_https[conn.key]
        if not conn.closed:
            self._keep(conn.key, conn)

    def _keep(self, key: tuple[str, str, int], conn: _Connection) -> None:
        """Back to the idle pool, unless the pool is full or it was made with old material."""
        if conn.context is not None and conn.context is not self._context:
            self._follow_context()
        if conn.context is not None and conn.context is not self._context:
            self.counters["rotated"] += 1
            conn.close()
        elif len(self._idle.get(key, ())) < self.max_idle_per_host and self._idle_count < self.max_idle_total:
            self._idle.setdefault(key, []).append(conn)
            self._idle_count += 1
        else:
            conn.close()

    async def get(self, ep: Endpoint, path_and_query: str, timeout_s: float = 5.0,
                  headers: Mapping[str, str] | None = None) -> Response:
        """GET ep.path + path_and_query within timeout_s (connect included, plus at most
        REAP_EVERY_S of sweep granularity). Raises TimeoutError, OSError (refused,
        reset) or HttpError (malformed, or a body over the cap)."""
        loop = self._loop
        if loop is None or not loop.is_running():  # get_running_loop() is a getpid() call on 3.11: once per loop
            loop = self._loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        raw = _get_request(ep, path_and_query, headers or {}, self._user_agent)
        key = ep.key
        for attempt in (0, 1):
            conn, reused = await self._take(ep, key, deadline)
            self._watch(conn, deadline)
            retry = False
            try:
                response = await conn.request(raw, loop)
            except TimeoutError:
                raise  # the reaper abandoned the request: the connection drains
            except (ConnectionError, OSError) as exc:
                conn.close()
                # The server closed an idle kept-alive connection: retry once, fresh.
                if not (reused and attempt == 0 and not conn.got_bytes):
                    raise exc
                retry = True
            except asyncio.CancelledError:
                self._abandon(conn, TimeoutError("the request was cancelled"))
                raise
            except BaseException:
                conn.close()
                raise
            finally:
                self._inflight.pop(conn, None)
            if retry:
                continue
            if response.keep_alive and not conn.closed:
                self._keep(key, conn)
            else:
                conn.close()
            return response
        raise ConnectionResetError("unreachable")

    async def _take(self, ep: Endpoint, key: tuple[str, str, int], deadline: float) -> tuple[_Connection, bool]:
        """An idle connection to `key` (True), else a new one (False). Over https a
        connection still reading an abandoned response is waited for (within the
        request's deadline) rather than paying a handshake for another."""
        if ep.scheme == "https":
            self._follow_context()
        while True:
            # Only hosts with an idle connection have a list: however discovery churns through
            # new addresses, the pool holds at most max_idle_total of them.
            idle = self._idle.get(key)
            while idle:
                candidate = idle.pop()
                self._idle_count -= 1
                if not idle:
                    del self._idle[key]
                if not candidate.closed:
                    return candidate, True
            draining = self._draining_https.get(key)
            if draining is None or draining.drained is None:
                return await self._open(ep, key, deadline), False
            loop = asyncio.get_running_loop()
            try:
                await asyncio.wait_for(asyncio.shield(draining.drained), max(deadline - loop.time(), 0.001))
            except asyncio.TimeoutError:
                raise TimeoutError("agent did not answer in time") from None
            self._drained(draining)  # its callback may not have run yet

    def _follow_context(self) -> None:
        """Rotated client material: idle connections made with the old are closed (busy
        ones are, when their response ends: _keep)."""
        context = self._ssl_context()
        if context is self._context:
            return
        self._context = context
        for conns in self._idle.values():
            for conn in conns:
                if conn.context is not None and conn.context is not context:
                    self.counters["rotated"] += 1
                    conn.close()
        self._idle = {key: kept for key, conns in self._idle.items() if (kept := [c for c in conns if not c.closed])}
        self._idle_count = sum(len(c) for c in self._idle.values())

    def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for conn in list(self._inflight) + list(self._draining):
            conn.close()
        self._inflight.clear()
        self._draining.clear()
        self._draining_https.clear()
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
        for task in self._connecting.values():
            task.cancel()
            task.add_done_callback(_close_connected)
        self._connecting.clear()
        self._handshakes = None  # the next loop (a new leader's term) makes its own
        self._idle_count = 0


def _get_request(ep: Endpoint, path_and_query: str, headers: Mapping[str, str], user_agent: str) -> bytes:
    """The GET request's bytes; a header that is not one line is refused."""
    if any("\r" in f"{k}{v}" or "\n" in f"{k}{v}" for k, v in headers.items()):
        raise HttpError("a request header must be one line")
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (f"GET {ep.path}{path_and_query} HTTP/1.1\r\nHost: {ep.host_header}\r\n"
            f"User-Agent: {user_agent}\r\n{extra}\r\n").encode("latin-1")


def _close_connected(task: asyncio.Task[_Connection]) -> None:
    """A connect cancelled by close() that finished anyway: its connection is closed."""
    if not task.cancelled() and task.exception() is None:
        task.result().close()


def _retrieved(task: asyncio.Task[_Connection]) -> None:
    """A lingering connect's failure is nobody's to raise: read, so asyncio does not log it."""
    if not task.cancelled():
        task.exception()


def _detached(exc: BaseException) -> BaseException:
    """`exc` cut loose from the frames it was raised through. asyncio's connect keeps its
    exceptions in a local list, so a refused connect is an exception -> traceback ->
    frame -> list -> exception cycle (~45 objects) that only a full GC frees: at 5,000
    agents down that is 10^5 objects a second for a collector the controller runs
    rarely (docs/scale.md)."""
    exc.__traceback__ = None
    exc.__context__ = None
    exc.__cause__ = None
    return exc


def default_idle_limit() -> int:
    """Half of the soft RLIMIT_NOFILE left after a reserve for Consul, metrics and logs."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 8192
    return max(16, min(8192, (soft - 128) // 2))


def raise_file_limit(target: int = 65536) -> int:
    """Lift the soft RLIMIT_NOFILE towards the hard limit (systemd's default soft limit
    of 1024 is too small for thousands of agent connections). Returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            return wanted
        except (ValueError, OSError):
            return soft
    return soft
