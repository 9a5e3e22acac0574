"""The listening socket: new connections in batches, and a pause when accepting fails."""

from __future__ import annotations

import logging
import selectors
import socket
from collections.abc import Callable, Iterator
from time import monotonic

from azprobe.agent.httpserver.connections import NO_DEADLINE, SWEEP_S

log = logging.getLogger(__name__)

ACCEPTS_PER_WAKE = 64  # so a connect flood cannot starve the connections already open
LISTEN_BACKLOG = 128
ACCEPT_WARN_EVERY_S = 10.0


class Listener:
    def __init__(self, address: tuple[str, int], selector: selectors.BaseSelector) -> None:
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._sock = socket.create_server(address, family=family, backlog=LISTEN_BACKLOG)
        self._sock.setblocking(False)
        self.address = self._sock.getsockname()
        self._selector = selector
        self._selector.register(self._sock, selectors.EVENT_READ, self)
        self.resume_at = NO_DEADLINE  # paused: watched again at the first sweep from then on
        self._warned_at = -ACCEPT_WARN_EVERY_S
        self.wrap: Callable[[socket.socket], socket.socket] | None = None  # HTTPS: a TLS socket per connection

    def accept(self) -> Iterator[tuple[socket.socket, str]]:
        """Up to ACCEPTS_PER_WAKE new connections (non-blocking, TCP_NODELAY) and their peers."""
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                sock, peer = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except (ConnectionAbortedError, PermissionError):  # gone before accepted; a firewall
                continue
            except OSError as exc:
                self._pause(exc)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            yield (self.wrap(sock) if self.wrap is not None else sock), str(peer[0])

    def _pause(self, exc: OSError) -> None:
        """Out of descriptors or memory: the listener stays readable, so stop watching it
        until the next sweep instead of spinning on it."""
        if monotonic() >= self._warned_at + ACCEPT_WARN_EVERY_S:
            self._warned_at = monotonic()
            log.warning("http: accept failed, new connections wait: %s", exc)
        self._selector.unregister(self._sock)
        self.resume_at = monotonic() + SWEEP_S

    def resume(self) -> None:
        """At a sweep: watch the listener again if accepting was paused."""
        if self.resume_at < NO_DEADLINE:
            self.resume_at = NO_DEADLINE
            self._selector.register(self._sock, selectors.EVENT_READ, self)

    def close(self) -> None:
        self._sock.close()
