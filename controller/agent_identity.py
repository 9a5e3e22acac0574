"""Which node an agent's answer may speak for, proven by its TLS certificate.

With [agents.tls] the collector pulls over mutual TLS: the agent's chain must verify
against agents.tls.ca_file (its host name is not checked: agents are reached by
address), and the controller presents its own client certificate. The certificate is
then bound to the answer: one of its SANs (DNS or URI) must equal `agents.identity`
with `{node}` replaced by the node the answer names (docs/contracts.md "Agent
identity"). An answer that fails the binding is refused whole, before anything of it is
stored: no window, no vote. And one certificate speaks through one URL: another URL
presenting it is refused until the first has been silent for CERTIFICATE_HOLD_S, so a
certificate with many SANs, or one copied to many hosts, is at most one vantage point.

Refusals and failed handshakes are counted by bounded reasons (never a node name as a
label) and logged at most once a minute per agent URL, names escaped; no PEM byte
ever reaches a log line or an error.

Rotation: the client context comes from a RotatingContext, so a replaced certificate or
key is used from the next connection on, and a reload (SIGHUP) re-reads it at once.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable

from azprobe.clients.transport import ClosedAfterHandshake, PeerCertificate
from azprobe.contracts.window import printable
from azprobe.errors import ConfigError
from azprobe.security.tls import (TLS_FAILURE_REASONS, RotatingContext, TlsFiles, client_context,
                                  identity_client_context, tls_failure)

log = logging.getLogger(__name__)

LOG_EVERY_S = 60.0
# A certificate speaks through the URL that first answered with it until it has been
# silent this long: alternating two URLs between cycles gains nothing either.
CERTIFICATE_HOLD_S = 60.0
IDENTITY_REASONS = ("mismatch", "no_identity", "shared_certificate", "not_tls")
NODE = "{node}"


def node_in(template: str, name: str) -> str | None:
    """The node a SAN names under `template` ("spiffe://td/azprobe/node/{node}"), or None."""
    head, _, tail = template.partition(NODE)
    if len(name) > len(head) + len(tail) and name.startswith(head) and name.endswith(tail):
        return name[len(head):len(name) - len(tail)]
    return None


class AgentGuard:
    """The collector's check of every answer and every failed pull. Without TLS it
    passes everything (plain HTTP with the token, for labs)."""

    def __init__(self, files: TlsFiles | None, identity: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.identity = identity
        self.rotating: RotatingContext | None = None
        self.files = files
        if files is not None:
            self.rotating = RotatingContext(files, "agents.tls", identity_client_context, on_error=self._rotation_failed)
        self.refused = {reason: 0 for reason in IDENTITY_REASONS}
        self.handshake_failures = {reason: 0 for reason in TLS_FAILURE_REASONS}
        self._logged_at: dict[str, float] = {}
        self._fingerprints: dict[str, tuple[str, float]] = {}  # certificate -> (its URL, last answer)
        self._plain: ssl.SSLContext | None = None

    @property
    def enabled(self) -> bool:
        return self.rotating is not None

    @property
    def server_name(self) -> str | None:
        return self.files.server_name if self.files is not None else None

    def context(self) -> ssl.SSLContext:
        """The client context for the next connection (rotated material from then on);
        without [agents.tls], https URLs are verified against the system's store."""
        if self.rotating is None:
            if self._plain is None:
                self._plain = client_context(TlsFiles(), "agents")
            return self._plain
        return self.rotating.current()

    def apply(self, files: TlsFiles | None, identity: str) -> None:
        """A reload: new files are loaded now (an error keeps the running material and is
        logged), the same files are re-read (SIGHUP is also "the certificate changed")."""
        self.identity = identity
        if files is None:
            self.rotating = self.files = None
        elif files != self.files or self.rotating is None:
            try:
                self.rotating = RotatingContext(files, "agents.tls", identity_client_context,
                                                on_error=self._rotation_failed)
                self.files = files
            except ConfigError as exc:
                self._rotation_failed(exc)
        else:
            self.rotating.reload()

    def new_cycle(self) -> None:
        now = self.clock()
        self._fingerprints = {f: held for f, held in self._fingerprints.items() if now - held[1] < CERTIFICATE_HOLD_S}
        if len(self._logged_at) > 1024:  # one entry per URL logged within the minute
            self._logged_at = {u: t for u, t in self._logged_at.items() if now - t < LOG_EVERY_S}

    def check(self, url: str, peer: PeerCertificate | None, node: str) -> str:
        """"" when the certificate that answered may speak for `node`, else why not (counted, logged)."""
        if self.rotating is None:
            return ""
        if peer is None:
            return self._refuse(url, "not_tls", f"answered as {printable(node, 64)!r} without TLS")
        expected = self.identity.replace(NODE, node)
        if expected not in peer.names:
            named = [n for n in (node_in(self.identity, name) for name in peer.names) if n is not None]
            if named:
                return self._refuse(url, "mismatch", f"answers as node {printable(node, 64)!r} with the certificate "
                                    f"of node {printable(named[0], 64)!r} (serial {peer.serial[:40]})")
            return self._refuse(url, "no_identity", f"answers as node {printable(node, 64)!r}, but its certificate "
                                f"(serial {peer.serial[:40]}) has no SAN {printable(expected, 200)!r}")
        now = self.clock()
        holder, at = self._fingerprints.get(peer.fingerprint, (url, now))
        if holder != url and now - at < CERTIFICATE_HOLD_S:
            return self._refuse(url, "shared_certificate", f"answers as node {printable(node, 64)!r} with the "
                                f"certificate {printable(holder, 200)} answers with: one URL per certificate")
        self._fingerprints[peer.fingerprint] = (url, now)
        return ""

    def describe(self, url: str, exc: BaseException) -> str:
        """A failed pull's one-line cause; a failed TLS handshake is counted and logged."""
        failure = tls_failure(exc) if isinstance(exc, ssl.SSLError) else None
        if isinstance(exc, ClosedAfterHandshake):
            reason, cause = "client_certificate_refused", str(exc)
        elif failure is not None:
            reason, cause = failure.reason, failure.line
        else:
            return str(exc) or type(exc).__name__
        self.handshake_failures[reason] += 1
        self._log(url, f"agent {printable(url, 200)}: TLS refused: {cause}")
        return f"TLS refused: {cause}"

    def _refuse(self, url: str, reason: str, why: str) -> str:
        self.refused[reason] += 1
        message = f"identity refused: {why}"
        self._log(url, f"agent {printable(url, 200)}: answer {message}")
        return message

    def _log(self, url: str, line: str) -> None:
        now = self.clock()
        if now - self._logged_at.get(url, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._logged_at[url] = now
            log.warning("%s", line)

    @staticmethod
    def _rotation_failed(exc: ConfigError) -> None:
        log.error("agents.tls: new material not used, the running certificate stays: %s", exc)
