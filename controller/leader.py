"""Leader election on a Consul session, as Consul's leader-election guide describes.

One session per controller (TTL, renewed at TTL/2, LockDelay, Behavior "release") tries
to acquire `<prefix>leader` with the value {"name", "address"}. Whoever holds it writes
the weights; the others stand by (and keep pulling agents, so a new leader starts warm).

Stepping down is immediate and conservative: a failed renew (404: the session is gone,
or Consul unreachable: we can no longer prove we hold the lock) or a 409 from a fenced
write makes us a standby before anything else happens. Fencing itself is not here but in
publish.py: every write checks this session in the same transaction.

A crashed leader's session outlives it by up to 2 x TTL (Consul's rule), so standbys
also probe the holder's advertised /healthz (LeaderProbe, below) and invalidate the
session of a leader that stopped answering: fail-over then takes the lock-delay plus a
few rounds, not 20 s more (docs/design.md "Failover").

All methods are blocking (py-consul on requests); the controller calls them from a
worker thread so a hung Consul never stalls the pull loop.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import consul

from azprobe.clients.consul import ConsulError, ConsulSettings, translate_error
from azprobe.contracts import bounded_json, kv
from azprobe.contracts.window import printable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Transition:
    """A change of leadership this tick: became=True (now leader) or False (stepped down)."""

    became_leader: bool
    reason: str


class LeaderElection:
    def __init__(self, client: consul.Consul, settings: ConsulSettings, *, name: str, address: str,
                 ttl_s: float = 10.0, lock_delay_s: float = 15.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.key = settings.key(kv.LEADER)
        self.name = name
        self.address = address
        self.ttl_s = ttl_s
        self.lock_delay_s = lock_delay_s
        self.clock = clock
        self.session_id: str | None = None
        self.is_leader = False
        self._renewed_at = 0.0

    @property
    def lock_value(self) -> bytes:
        return json.dumps({"name": self.name, "address": self.address}, sort_keys=True).encode()

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except consul.NotFound:
            raise
        except Exception as exc:
            raise translate_error(exc, self.client.http.base_uri, what) from None

    def _create_session(self) -> str:
        lock_delay: int | str = int(self.lock_delay_s) if float(self.lock_delay_s).is_integer() else self.lock_delay_s
        session_id = self._call("creating a session", lambda: self.client.session.create(
            name=f"azprobe-controller {self.name}", behavior="release", ttl=int(self.ttl_s),
            lock_delay=lock_delay))  # type: ignore[arg-type]  # py-consul formats it as "<n>s"
        self._renewed_at = self.clock()
        log.debug("created session %s", session_id)
        return session_id

    def step_down(self, reason: str) -> Transition | None:
        """Stop acting as leader now (a 409, a lost session, Consul gone)."""
        if not self.is_leader:
            return None
        self.is_leader = False
        log.info("stepped down as leader: %s", reason)
        return Transition(False, reason)

    def tick(self) -> Transition | None:
        """Keep the session alive and try to take the lock. Raises ConsulError when Consul
        does not answer (after stepping down: we can no longer prove we hold the lock)."""
        try:
            return self._tick()
        except ConsulError as exc:
            self.step_down(f"consul unavailable ({exc})")
            raise

    def _tick(self) -> Transition | None:
        stepped: Transition | None = None
        now = self.clock()
        if self.session_id is not None and now - self._renewed_at >= self.ttl_s / 2:
            try:
                self._call("renewing the session", lambda: self.client.session.renew(self.session_id))
                self._renewed_at = now
            except consul.NotFound:
                # The session expired or was destroyed: the lock is gone with it.
                self.session_id = None
                stepped = self.step_down("session lost (renew answered 404)")
        if self.session_id is None:
            self.session_id = self._create_session()
        if self.is_leader:
            return stepped
        acquired = self._call("acquiring the leader lock", lambda: self.client.kv.put(
            self.key, self.lock_value, acquire=self.session_id))
        if acquired:
            self.is_leader = True
            log.info("became leader (%s holds %s)", self.name, self.key)
            return Transition(True, "acquired the leader lock")
        return stepped

    def holder(self) -> dict[str, Any] | None:
        """The current lock holder's {"name", "address", "session"}, None when free."""
        _, data = self._call("reading the leader key", lambda: self.client.kv.get(self.key))
        if not data or not data.get("Session"):
            return None
        try:
            value = bounded_json.loads(data.get("Value") or b"{}", max_bytes=kv.MAX_VALUE_BYTES, what="leader key")
        except bounded_json.JsonRefused:
            value = {}
        return {**(value if isinstance(value, dict) else {}), "session": data["Session"]}

    def release(self) -> None:
        """Graceful shutdown: release the lock (no lock-delay for a release, so a standby
        takes over at once), then destroy the session. Best effort."""
        session_id, self.session_id = self.session_id, None
        was_leader, self.is_leader = self.is_leader, False
        if session_id is None:
            return
        try:
            if was_leader:
                self.client.kv.put(self.key, self.lock_value, release=session_id)
            self.client.session.destroy(session_id)
            if was_leader:
                log.info("released the leader lock")
        except Exception as exc:  # shutting down: the session's TTL cleans up anyway
            log.info("could not release the leader lock cleanly: %s", translate_error(exc, "consul", "releasing"))


# Controllers talk to each other directly: an http_proxy in the environment must not
# answer (or fail) on the leader's behalf.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
MAX_HEALTHZ_BYTES = 65536  # /healthz is a small object; more is not a controller answering


def address_problem(address: str) -> str | None:
    """Why `address` (the leader key's, from KV) is not a host:port to probe, or None."""
    try:
        parts = urllib.parse.urlsplit(f"http://{address}")
        port = parts.port  # raises ValueError on a port that is no number or out of range
    except ValueError as exc:
        return str(exc)
    if not parts.hostname or port is None or parts.path or parts.query or parts.fragment or "@" in parts.netloc:
        return "not host:port"
    return None


def probe_healthz(address: str, timeout_s: float) -> str | None:
    """The controller name answering http://<address>/healthz; None when nothing answers
    (refused, timeout, not our JSON) or `address` is no address at all."""
    try:
        with _NO_PROXY.open(f"http://{address}/healthz", timeout=timeout_s) as resp:
            body = bounded_json.loads(resp.read(MAX_HEALTHZ_BYTES), max_bytes=MAX_HEALTHZ_BYTES, what="healthz")
    # URLError and timeouts are OSErrors. The address comes from the leader key in KV:
    # a bad port is InvalidURL, a label over 63 characters UnicodeError (both
    # ValueErrors), a broken answer an HTTPException. Each is silence, never a raise out
    # of the standby's round.
    except (OSError, ValueError, http.client.HTTPException):
        return None
    name = body.get("name") if isinstance(body, dict) else None
    return name if isinstance(name, str) else None


class LeaderProbe:
    """A standby's liveness check of the lock holder, for fast fail-over after a crash.

    Consul keeps a crashed leader's session (and so the lock) until 2 x TTL pass without
    a renew. A standby that finds nobody answering at the holder's advertised address
    `failures_needed` rounds in a row destroys the holder's session; the lock is then free
    after the lock-delay. Only silence counts: a different controller answering at that
    address proves nothing either way. Wrongly deposing a live leader is safe (its next
    fenced write gets a 409 and it stands by), so the cost of a false positive is one
    lock-delay without writes, while readers keep the last document until it expires.
    """

    def __init__(self, client: consul.Consul, *, own_name: str, failures_needed: int, timeout_s: float,
                 probe: Callable[[str, float], str | None] = probe_healthz) -> None:
        self.client = client
        self.own_name = own_name
        self.failures_needed = failures_needed
        self.timeout_s = timeout_s
        self.probe = probe
        self._session: str | None = None
        self._failures = 0
        self._denied = False
        self._bad_address: str | None = None  # the last bad address logged (once each)

    def observe(self, holder: dict[str, Any] | None) -> str | None:
        """One round. Returns why the holder's session was invalidated, or None."""
        if (self.failures_needed <= 0 or holder is None or not holder.get("address")
                or holder.get("name") == self.own_name):
            self._session, self._failures = None, 0
            return None
        if holder["session"] != self._session:
            self._session, self._failures = holder["session"], 0
        address = str(holder["address"])
        problem = address_problem(address)
        if problem is not None and address != self._bad_address:
            # Not probed: a holder that advertises no reachable address is as silent as
            # a dead one (deposing a live leader costs one lock-delay, see above).
            log.info("the leader key's address %s (leader %s) is not host:port (%s): it counts as silent; "
                     "set [controller] advertise on that controller", printable(address, 100),
                     printable(str(holder.get("name")), 100), printable(problem, 100))
            self._bad_address = address
        answered = None if problem is not None else self.probe(address, self.timeout_s)
        if answered is not None:
            self._failures = 0
            return None
        self._failures += 1
        if self._failures < self.failures_needed:
            return None
        self._failures = 0
        reason = (f"leader {holder.get('name')!r} at {holder['address']} did not answer "
                  f"{self.failures_needed} probes in a row: invalidating its session")
        try:
            self.client.session.destroy(holder["session"])
        except consul.ACLPermissionDenied:
            if not self._denied:
                log.info("%s failed: the token may not destroy other sessions; waiting for its TTL", reason)
                self._denied = True
            return None
        except Exception as exc:
            raise translate_error(exc, self.client.http.base_uri, "invalidating the dead leader's session") from None
        log.info("%s", reason)
        return reason
