"""Leader election on a Consul session, as Consul's leader-election guide describes.

One session per controller (TTL, renewed at TTL/2, LockDelay, Behavior "release") tries
to acquire `<prefix>leader` with the value {"name", "address"}. Whoever holds it writes
the weights; the others stand by (and keep pulling agents, so a new leader starts warm).

Stepping down is immediate and conservative: a failed renew (404: the session is gone,
or Consul unreachable: we can no longer prove we hold the lock) or a 409 from a fenced
write makes us a standby before anything else happens. Fencing itself is not here but in
publish.py: every write checks this session in the same transaction.

All methods are blocking (py-consul on requests); the controller calls them from a
worker thread so a hung Consul never stalls the pull loop.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import consul

from azprobe.consul import ConsulError, ConsulSettings, translate_error

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
        self.key = settings.key("leader")
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
            value = json.loads(data.get("Value") or b"{}")
        except ValueError:
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
