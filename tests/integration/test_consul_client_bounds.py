"""The Consul client against a hostile or broken server on real loopback sockets: an
answer of the wrong shape is a one-line ConsulError and the watcher keeps watching; an
answer too large is refused without being read whole; an answer dripped byte by byte
fails at the read's time limit instead of holding the read forever.

And KeyWatch fails static: no exception from a call or a callback ends the watch. Those
calls are scripted (a KeyWatch whose poll replays a list), because once read_key refuses
every bad answer as a ConsulError no real server can make it raise anything else. (They
live here, not in tests/unit/: pytest imports test modules by basename, so a
tests/unit/test_consul_client_bounds.py would collide with this file.)"""

from __future__ import annotations

import base64
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from azprobe.clients.consul import (MAX_ANSWER_BYTES, ConsulError, ConsulSettings, KeyState, KeyWatch,
                                    make_client, read_key)
from azprobe.consumers.watch import FRESH, WeightWatcher
from tests.helpers import sample_weights_doc, wait_for

KEY = "azprobe/v1/weights"
HUGE = 128 << 20  # 32x the limit: reading it whole would be seen in the bytes sent


def head(status: str = "200 OK", length: int | None = None, extra: str = "") -> bytes:
    length_line = "" if length is None else f"Content-Length: {length}\r\n"
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nX-Consul-Index: 7\r\n"
            f"{length_line}{extra}\r\n").encode()


def answer(body: bytes, index: int = 7) -> bytes:
    return head(length=len(body)).replace(b"X-Consul-Index: 7", f"X-Consul-Index: {index}".encode()) + body


class RawConsul:
    """A loopback HTTP server answering each request with `handle(conn, n)` (n counts
    requests from 1), on one thread per connection; keep-alive as long as `handle`
    leaves the connection open."""

    def __init__(self, handle: Callable[[socket.socket, int], None]) -> None:
        self.handle = handle
        self.requests = 0
        self.stopping = threading.Event()
        self.handled = threading.Event()  # set when a handler has returned
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while not self.stopping.is_set():
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(65536)
                    if not data:
                        return
                    request += data
                self.requests += 1
                try:
                    self.handle(conn, self.requests)
                except OSError:  # the client hung up: what the bounded reads do
                    return
                finally:
                    self.handled.set()

    def close(self) -> None:
        self.stopping.set()
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[socket.socket, int], None]], RawConsul]]:
    servers: list[RawConsul] = []

    def start(handle: Callable[[socket.socket, int], None]) -> RawConsul:
        servers.append(RawConsul(handle))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def kv_answer(value: bytes, index: int) -> bytes:
    return answer(json.dumps([{"Key": KEY, "Value": base64.b64encode(value).decode(), "ModifyIndex": index,
                               "CreateIndex": 1, "LockIndex": 0, "Flags": 0}]).encode(), index)


# --- bug: one malformed answer killed the watcher thread for good -----------------------

@pytest.mark.parametrize("body, recurse", [
    (b'""', False),                        # "".get -> AttributeError
    (b"{}", False),                        # taken for an empty value
    (b'[{"Value": null}]', True),          # item["Key"] -> KeyError
    (b'[{"Key": 5, "Value": null}]', True),  # a key that is not a string
    (b'""', True),                         # taken for "no keys"
    (b"{}", True),                         # taken for "no keys"
])
def test_an_answer_of_the_wrong_shape_is_a_one_line_consul_error(serve, body, recurse):
    server = serve(lambda conn, n: conn.sendall(answer(body)))
    with pytest.raises(ConsulError) as exc:
        read_key(make_client(ConsulSettings(address=server.url)), KEY, recurse=recurse)
    message = str(exc.value)
    assert f"Consul's answer for {KEY!r}" in message and "expected" in message and "\n" not in message


def test_the_watcher_keeps_watching_after_a_malformed_answer(serve):
    def handle(conn: socket.socket, n: int) -> None:
        if n == 1:
            conn.sendall(answer(b'""'))
        else:  # a fresh document, then the same again after a short blocking wait
            conn.sendall(kv_answer(sample_weights_doc(1).dumps().encode(), 10))

    server = serve(handle)
    watcher = WeightWatcher(ConsulSettings(address=server.url), wait_s=1.0, backoff_base_s=0.01,
                            backoff_cap_s=0.05)
    with watcher:
        wait_for(lambda: watcher.snapshot() is not None, timeout=10, message="the document after the bad answer")
        status = watcher.status()
        assert status.state == FRESH and status.errors == 1
        assert watcher._thread is not None and watcher._thread.is_alive()


# --- bug: the whole answer was read into memory before its size was checked ------------

def _flood(sent: list[int], announce: bool) -> Callable[[socket.socket, int], None]:
    def handle(conn: socket.socket, n: int) -> None:
        extra = "" if announce else "Connection: close\r\n"  # no length: the body ends at close
        conn.sendall(head(length=HUGE if announce else None, extra=extra))
        piece = b" " * (1 << 20)
        for _ in range(HUGE // len(piece)):
            conn.sendall(piece)
            sent[0] += len(piece)
        conn.close()
    return handle


@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "no-length"])
def test_an_answer_over_the_limit_is_refused_without_reading_it_whole(serve, announce):
    sent = [0]
    server = serve(_flood(sent, announce))
    with pytest.raises(ConsulError, match=f"exceeds the limit of {MAX_ANSWER_BYTES}"):
        read_key(make_client(ConsulSettings(address=server.url)), KEY)
    wait_for(server.handled.is_set, timeout=10, message="the server to see the client hang up")
    # The server got as far as the limit plus what the loopback's socket buffers hold.
    assert sent[0] < MAX_ANSWER_BYTES + (24 << 20), f"{sent[0]} bytes sent"


# --- bug: a read had no total time limit -------------------------------------------------

@pytest.mark.parametrize("index, wait_s, limit_s", [(0, None, 1.0), (5, 1.0, 1.0 + 1.0 + 1.0 / 16)],
                         ids=["plain", "blocking"])
def test_a_dripping_answer_fails_at_the_reads_time_limit(serve, index, wait_s, limit_s):
    def drip(conn: socket.socket, n: int) -> None:
        conn.sendall(head(length=1_000_000))
        while not server.stopping.wait(0.05):  # the fault: a byte every 50 ms, forever
            conn.sendall(b" ")

    server = serve(drip)
    client = make_client(ConsulSettings(address=server.url, timeout_s=1.0))
    outcome: list[BaseException | object] = []

    def read() -> None:
        try:
            outcome.append(read_key(client, KEY, index=index, wait_s=wait_s))
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    started = time.monotonic()
    threading.Thread(target=read, daemon=True).start()
    wait_for(lambda: outcome, timeout=limit_s + 10, message="read_key to give up on the drip")
    elapsed = time.monotonic() - started
    assert isinstance(outcome[0], ConsulError), outcome[0]
    assert f"not complete within {limit_s:g} s" in str(outcome[0])
    assert limit_s - 0.1 <= elapsed < limit_s + 3  # the blocking query's wait is allowed, no more


# --- KeyWatch: nothing a call or a callback raises ends the watch ------------------------

FINAL = KeyState(index=99, value=b"final")


class ScriptedWatch(KeyWatch):
    """A KeyWatch whose calls return (or raise) the script's steps in order, then FINAL."""

    def __init__(self, script: list[KeyState | Exception]) -> None:
        # The client is never used to connect: poll is scripted; run names its address.
        super().__init__(make_client(ConsulSettings(address="http://127.0.0.1:1")), "azprobe/v1/weights",
                         min_interval_s=0.0, backoff_base_s=0.001, backoff_cap_s=0.002)
        self.script = list(script)

    def poll(self) -> KeyState:
        step = self.script.pop(0) if self.script else FINAL
        if isinstance(step, Exception):
            raise step
        return step


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def start(watch: KeyWatch, stop: threading.Event, on_change, on_error=None) -> threading.Thread:
    thread = threading.Thread(target=watch.run, args=(on_change, stop, on_error), daemon=True)
    thread.start()
    return thread


def test_an_unexpected_exception_is_a_failed_call_not_the_end_of_the_watch(stop, caplog):
    watch = ScriptedWatch([RuntimeError("boom\nsecond line"), RuntimeError("again")])
    values: list[bytes | None] = []
    errors: list[ConsulError] = []
    with caplog.at_level(logging.DEBUG, logger="azprobe.clients.consul"):
        thread = start(watch, stop, lambda state: values.append(state.value), errors.append)
        wait_for(lambda: values == [b"final"], timeout=5, message="the value after the failures")
    assert thread.is_alive()
    assert watch.errors == 2 and watch.consecutive_errors == 0
    assert [type(e) for e in errors] == [ConsulError, ConsulError]
    assert "RuntimeError: boom second line" in str(errors[0]) and "\n" not in str(errors[0])
    # the traceback once, at error level; a repeat only at debug, so a loop cannot flood the log
    tracebacks = [r for r in caplog.records if r.exc_info and "unexpected RuntimeError" in r.getMessage()]
    assert [r.levelno for r in tracebacks] == [logging.ERROR, logging.DEBUG]


def test_a_failing_on_change_does_not_end_the_watch(stop):
    watch = ScriptedWatch([KeyState(index=1, value=b"first")])
    values: list[bytes | None] = []

    def on_change(state: KeyState) -> None:
        values.append(state.value)
        if state.value == b"first":
            raise ValueError("the caller's bug")

    thread = start(watch, stop, on_change)
    wait_for(lambda: values == [b"first", b"final"], timeout=5, message="the change after the failing callback")
    assert thread.is_alive() and watch.errors == 0
