"""sd_notify over a real AF_UNIX datagram socket (path and abstract), and the watchdog's
rule that pings come only from the loop's progress."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from azprobe.daemon import sdnotify


class Receiver:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def messages(self, timeout: float = 1.0) -> list[dict[str, str]]:
        """Every datagram queued now (waiting up to `timeout` for the first)."""
        out = []
        self.sock.settimeout(timeout)
        while True:
            try:
                data = self.sock.recv(4096)
            except (TimeoutError, BlockingIOError):
                return out
            out.append(dict(line.split("=", 1) for line in data.decode().split("\n")))
            self.sock.settimeout(0)


@pytest.fixture
def receiver(tmp_path, monkeypatch) -> Iterator[Receiver]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    try:
        yield Receiver(sock)
    finally:
        sock.close()


def test_no_socket_is_a_quiet_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.ready("up") is False
    assert sdnotify.watchdog_ping() is False


def test_ready_with_status_is_one_datagram(receiver):
    assert sdnotify.ready("serving on\n127.0.0.1:9740")
    [msg] = receiver.messages()
    # A newline inside STATUS would have become a bogus second field.
    assert msg == {"READY": "1", "STATUS": "serving on 127.0.0.1:9740"}


def test_abstract_socket_address(monkeypatch):
    name = f"azprobe-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    try:
        assert sdnotify.watchdog_ping()
        sock.settimeout(1.0)
        assert sock.recv(100) == b"WATCHDOG=1"
    finally:
        sock.close()


def test_stopping_and_reloading_fields(receiver):
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    sdnotify.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    sdnotify.stopping("bye")
    reload_msg, stop_msg = receiver.messages()
    assert reload_msg["RELOADING"] == "1"
    assert before <= int(reload_msg["MONOTONIC_USEC"]) <= after
    assert stop_msg == {"STOPPING": "1", "STATUS": "bye"}


def test_send_failure_is_reported_not_raised(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert sdnotify.status("x") is False


@pytest.mark.parametrize(("env", "expected"), [
    ({}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "abc"}, None),
    ({"WATCHDOG_USEC": "30000000"}, 30.0),
    ({"WATCHDOG_USEC": "2500000", "WATCHDOG_PID": str(os.getpid())}, 2.5),
    ({"WATCHDOG_USEC": "2500000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),  # meant for another process
    ({"WATCHDOG_USEC": "2500000", "WATCHDOG_PID": "x"}, None),
])
def test_watchdog_interval(env, expected):
    assert sdnotify.watchdog_interval(env) == expected


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_watchdog_pings_at_most_every_half_interval():
    clock, sent = FakeClock(), []
    dog = sdnotify.Watchdog(10.0, clock=clock, send=lambda: sent.append(clock.now) or True)
    for _ in range(40):  # a 1 s loop for 40 s
        dog.progress()
        clock.now += 1.0
    assert sent == [100.0 + 5 * i for i in range(8)]


def test_watchdog_pings_every_iteration_of_a_slow_loop():
    clock, sent = FakeClock(), []
    dog = sdnotify.Watchdog(10.0, clock=clock, send=lambda: sent.append(clock.now) or True)
    for _ in range(3):
        dog.progress()
        clock.now += 7.0
    assert len(sent) == 3


def test_no_progress_no_pings_and_no_thread():
    """The whole point: time passing alone never pings, and nothing runs behind the loop."""
    clock, sent = FakeClock(), []
    threads_before = threading.active_count()
    notifier = sdnotify.LoopNotifier(lambda: "s", watchdog=sdnotify.Watchdog(
        1.0, clock=clock, send=lambda: sent.append(clock.now) or True), clock=clock)
    notifier.started()
    clock.now += 3600.0
    assert len(sent) == 1  # only the ping sent with READY
    assert threading.active_count() == threads_before
    notifier.tick()
    assert len(sent) == 2


def test_disabled_watchdog_never_sends():
    sent = []
    dog = sdnotify.Watchdog(None, send=lambda: sent.append(1) or True)
    assert not dog.enabled
    assert dog.progress() is False
    assert sent == []


def test_loop_notifier_rate_limits_status_and_survives_a_broken_status_fn(receiver):
    clock = FakeClock()
    calls = []

    def status_fn() -> str:
        calls.append(clock.now)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return f"tick {len(calls)}"

    notifier = sdnotify.LoopNotifier(status_fn, status_every_s=5.0, watchdog=sdnotify.Watchdog(None), clock=clock)
    notifier.started()
    for _ in range(10):
        clock.now += 1.0
        notifier.tick()
    messages = receiver.messages()
    assert messages[0] == {"READY": "1", "STATUS": "tick 1"}
    assert [m["STATUS"] for m in messages[1:]] == ["status unavailable: boom", "tick 3"]


def test_loop_interval_too_long_for_watchdog_is_warned(caplog):
    sdnotify.LoopNotifier(lambda: "", loop_interval_s=20.0, watchdog=sdnotify.Watchdog(30.0))
    assert "too long for WatchdogSec" in caplog.text
