"""systemd's notify protocol (sd_notify(3)) with the standard library only.

A `Type=notify` service tells systemd it is ready, what it is doing and that it is
still alive by sending newline-separated `KEY=VALUE` datagrams to the AF_UNIX socket
named in $NOTIFY_SOCKET. Outside systemd the variable is unset and every call here is
a cheap no-op, so the daemons call these functions unconditionally.

The watchdog pings are driven by the daemon's main loop, never by a timer thread: a
loop that stops making progress stops pinging, and systemd restarts the service. A
background pinger would keep a wedged daemon looking alive, which is the failure the
watchdog exists to catch.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# Tests only: while the file named here exists, LoopNotifier.tick() blocks the calling
# loop, so a test can wedge the real main loop of a running daemon without stopping the
# whole process (SIGSTOP would also freeze a background pinger and so prove nothing).
STALL_FILE_ENV = "AZPROBE_TEST_STALL_FILE"


def _socket_address(raw: str) -> str | bytes | None:
    """$NOTIFY_SOCKET -> an address for sendto; '@name' is Linux's abstract namespace."""
    if raw.startswith("@"):
        return b"\0" + raw[1:].encode()
    if raw.startswith("/"):
        return raw
    return None  # vsock and other schemes: not used by the units azprobe ships


def notify(*fields: str, environ: dict[str, str] | None = None) -> bool:
    """Send one notification made of `KEY=VALUE` fields. True when a datagram went out.

    A send failure is logged and swallowed: a daemon must not die because its
    supervisor went away, and systemd notices a silent service through the watchdog.
    """
    env = os.environ if environ is None else environ
    address = _socket_address(env.get("NOTIFY_SOCKET", ""))
    if address is None or not fields:
        return False
    message = "\n".join(fields).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message, address)
    except OSError as exc:
        log.warning("sd_notify to %r failed: %s", env.get("NOTIFY_SOCKET"), exc)
        return False
    return True


def _status_field(text: str) -> str:
    # One datagram is a list of lines, so a newline inside STATUS would start a new field.
    return "STATUS=" + " ".join(text.split())


def ready(status: str = "") -> bool:
    """READY=1: startup is complete (for the agent: the probe is loaded and serving)."""
    return notify("READY=1", *([_status_field(status)] if status else []))


def status(text: str) -> bool:
    """STATUS=...: one line shown by `systemctl status`."""
    return notify(_status_field(text))


def watchdog_ping() -> bool:
    """WATCHDOG=1: the main loop made progress."""
    return notify("WATCHDOG=1")


def stopping(status: str = "") -> bool:
    """STOPPING=1: shutdown began, so systemd does not count slow exits as hangs."""
    return notify("STOPPING=1", *([_status_field(status)] if status else []))


def reloading(status: str = "") -> bool:
    """RELOADING=1 with MONOTONIC_USEC, as Type=notify-reload requires; send ready() when done."""
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify("RELOADING=1", f"MONOTONIC_USEC={usec}", *([_status_field(status)] if status else []))


def watchdog_interval(environ: dict[str, str] | None = None) -> float | None:
    """Seconds within which systemd expects a WATCHDOG=1, or None when not watched.

    Like sd_watchdog_enabled(3): $WATCHDOG_USEC must be a positive integer and
    $WATCHDOG_PID, when set, must be this process (a child that inherited the
    environment must not ping on its parent's behalf).
    """
    env = os.environ if environ is None else environ
    raw_usec = env.get("WATCHDOG_USEC", "")
    if not (raw_usec.isascii() and raw_usec.isdigit()) or int(raw_usec) == 0:
        return None
    raw_pid = env.get("WATCHDOG_PID", "")
    if raw_pid and (not (raw_pid.isascii() and raw_pid.isdigit()) or int(raw_pid) != os.getpid()):
        return None
    return int(raw_usec) / 1e6


class Watchdog:
    """Rate-limited WATCHDOG=1 pings, sent only when the owner reports progress.

    Call `progress()` once per main-loop iteration. It pings at most every half
    interval (sd_watchdog_enabled(3) recommends pinging at half the timeout), so a
    fast loop does not flood systemd, and a loop slower than the interval pings on
    every iteration.
    """

    def __init__(self, interval_s: float | None, *, clock: Callable[[], float] = time.monotonic,
                 send: Callable[[], bool] = watchdog_ping) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._send = send
        self._last_ping: float | None = None

    @classmethod
    def from_environment(cls) -> "Watchdog":
        return cls(watchdog_interval())

    @property
    def enabled(self) -> bool:
        return self.interval_s is not None

    def progress(self) -> bool:
        """The loop advanced; ping if due. True when a ping was sent."""
        if self.interval_s is None:
            return False
        now = self._clock()
        if self._last_ping is not None and now - self._last_ping < self.interval_s / 2:
            return False
        self._last_ping = now
        return self._send()


class LoopNotifier:
    """Everything a daemon's main loop tells systemd, in three calls.

    `started()` once the daemon really serves (READY=1), `tick()` after every
    completed loop iteration (watchdog ping plus a STATUS line from `status_fn`, at
    most every `status_every_s`), `stopping()` on shutdown, `reloading()`/`reloaded()`
    around a SIGHUP reload.
    """

    def __init__(self, status_fn: Callable[[], str], *, loop_interval_s: float | None = None,
                 status_every_s: float = 5.0, watchdog: Watchdog | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._status_fn = status_fn
        self.watchdog = watchdog if watchdog is not None else Watchdog.from_environment()
        self._status_every_s = status_every_s
        self._clock = clock
        self._last_status: float | None = None
        if (loop_interval_s is not None and self.watchdog.interval_s is not None
                and loop_interval_s >= self.watchdog.interval_s / 2):
            # The loop pings once per iteration, so it must iterate well within the timeout.
            log.warning("loop interval %.1fs is too long for WatchdogSec=%.1fs: systemd will "
                        "restart the service; raise WatchdogSec above %.0fs",
                        loop_interval_s, self.watchdog.interval_s, 2 * loop_interval_s + 1)

    def _safe_status(self) -> str:
        try:
            return self._status_fn()
        except Exception as exc:  # a status line must never take the daemon down
            return f"status unavailable: {exc}"

    def started(self) -> None:
        ready(self._safe_status())
        self._last_status = self._clock()
        self.watchdog.progress()

    def tick(self) -> None:
        _stall_while_test_file_exists()
        self.watchdog.progress()
        now = self._clock()
        if self._last_status is None or now - self._last_status >= self._status_every_s:
            self._last_status = now
            status(self._safe_status())

    def reloading(self) -> None:
        reloading("reloading configuration")

    def reloaded(self) -> None:
        ready(self._safe_status())

    def stopping(self) -> None:
        stopping("shutting down")


def _stall_while_test_file_exists() -> None:
    path = os.environ.get(STALL_FILE_ENV)
    while path and os.path.exists(path):
        time.sleep(0.05)
