"""HTTPS for the agent's server: every accepted socket is a non-blocking TLS socket whose
handshake the IO loop drives step by step, like a request head, within the same
whole-request deadline (head_timeout_s from the accept): a client that stalls the
handshake costs a descriptor until then, never a thread.

Mutual TLS: the context (azprobe/security/tls.py) requires a client certificate signed
by [agent.tls] ca_file, and with `client_identity` one of its SANs must be exactly that
name (e.g. the controller's SPIFFE ID); a client without it is closed after the
handshake. The certificate is the agent's own node certificate: the controller binds
its SAN to the node every answer names.

Rotation: the listening context hands each handshake the RotatingContext's current
material (SNI callback), so a certificate replaced on disk is used from the next
connection on, and a reload (SIGHUP) re-reads the files at once. A kept-alive connection
made with older material is not used for another request: a request under way is
answered with `Connection: close`, and an idle one is closed when its next request
arrives (the controller retries a GET on a kept-alive connection closed unanswered), so
the next pull handshakes with the new certificate.
"""

from __future__ import annotations

import dataclasses
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Mapping

from azprobe.agent.httpserver.connections import IDLE, Connection, ConnectionLimits
from azprobe.agent.httpserver.pools import Pool
from azprobe.agent.httpserver.server import BoundedHTTPServer, Router
from azprobe.agent.httpserver.wire import Request
from azprobe.contracts.window import printable
from azprobe.errors import ConfigError
from azprobe.security.tls import RotatingContext, TlsFiles, peer_names, server_context, tls_failure

log = logging.getLogger(__name__)

REFUSED_LOG_EVERY_S = 60.0  # a scanner's failed handshakes are one line a minute


class ServerTls:
    """The agent's TLS material and who may connect."""

    def __init__(self, files: TlsFiles, client_identity: str = "") -> None:
        self.rotating = RotatingContext(files, "agent.tls", server_context, on_error=self._rotation_failed)
        self.listening = self.rotating.serving_context()
        self.client_identity = client_identity
        self.refused = 0
        self._lock = threading.Lock()
        self._logged_at = -REFUSED_LOG_EVERY_S

    def wrap(self, sock: socket.socket) -> socket.socket:
        return self.listening.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)

    def reload(self) -> bool:
        """SIGHUP: read the files now (a bad file keeps the running material)."""
        return self.rotating.reload()

    def step(self, conn: Connection) -> int:
        """Drive the handshake: the selector events it waits for, 0 once it is done and the
        client is one we serve, -1 when it failed (the connection is to be closed)."""
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            return selectors.EVENT_READ
        except ssl.SSLWantWriteError:
            return selectors.EVENT_WRITE
        except (ssl.SSLError, OSError) as exc:
            failure = tls_failure(exc)
            # The client-side words ("refuses this side's ...") do not fit a server: only
            # its own verdict on the client's certificate is worded as such.
            return self._refuse(conn, failure.line if failure is not None and failure.verify else
                                f"TLS handshake failed ({getattr(exc, 'reason', None) or type(exc).__name__})")
        if self.client_identity and self.client_identity not in peer_names(sock.getpeercert()):
            names = ", ".join(printable(n, 80) for n in peer_names(sock.getpeercert())[:4]) or "none"
            return self._refuse(conn, f"client certificate lacks SAN {printable(self.client_identity, 200)!r} "
                                f"(has {names})")
        conn.tls_pending = False
        conn.tls_generation = self.rotating.generation
        return 0

    def stale(self, conn: Connection) -> bool:
        """Whether `conn` was made with material older than the files' (checked at most
        every CHECK_EVERY_S: a stat of each file)."""
        self.rotating.current()
        return conn.tls_generation != self.rotating.generation

    def _refuse(self, conn: Connection, cause: str) -> int:
        with self._lock:
            self.refused += 1
            now = time.monotonic()
            if now - self._logged_at < REFUSED_LOG_EVERY_S:
                return -1
            self._logged_at = now
        log.warning("https: refused %s: %s", printable(conn.peer, 60), cause)
        return -1

    @staticmethod
    def _rotation_failed(exc: ConfigError) -> None:
        log.error("agent.tls: new material not used, the running certificate stays: %s", exc)


class TlsHTTPServer(BoundedHTTPServer):
    """BoundedHTTPServer over TLS: a connection's events go to its handshake until it is
    done, then to the HTTP side as on a plain connection."""

    def __init__(self, address: tuple[str, int], router: Router, pools: Mapping[str, Pool],
                 limits: ConnectionLimits, tls: ServerTls) -> None:
        super().__init__(address, router, pools, limits)
        self.tls = tls
        self._listener.wrap = tls.wrap
        self.rotated = 0  # kept-alive connections ended because the material changed

    def _on_event(self, data: object, mask: int) -> None:
        if isinstance(data, Connection) and data.tls_pending:
            self._guarded(self._shake, data)
        else:
            super()._on_event(data, mask)

    def _shake(self, conn: Connection) -> None:
        events = self.tls.step(conn)
        if events < 0:
            self._close(conn)
        else:
            self._watch(conn, events or selectors.EVENT_READ)

    def _read(self, conn: Connection) -> None:
        if conn.phase == IDLE and self.tls.stale(conn):  # between requests: not used again
            self.rotated += 1
            self._close(conn)
            return
        super()._read(conn)

    def _dispatch(self, conn: Connection, request: Request) -> None:
        if request.keep_alive and self.tls.stale(conn):  # this answer is its last
            self.rotated += 1
            request = dataclasses.replace(request, keep_alive=False)
        super()._dispatch(conn, request)
