"""Fenced, validated writes of the weights documents to Consul KV.

Every write is ONE transaction:
    [check-session <prefix>leader = our session, set <prefix>weights,
     set <prefix>weights/from/<src AZ> ...]
so a deposed leader (whose session no longer holds the lock) cannot write anything:
Consul rolls the whole transaction back with a 409, and the caller steps down.

What is written, and when:
- only when a share (or a zone's / the overall state) moved since the last write, or
  every heartbeat_s, or on the first write of a term;
- every document carries the leader's `term`, drawn afresh (random) by start_term, and
  `generation` strictly increases per write within it; a new leader reads the current
  document's generation and continues above it (a leader that never saw the old
  document still cannot go backwards, because that read happens before its first
  write). A generation above MAX_CONTINUED_GENERATION (2^52), readable or not, is not
  one a leader wrote (2^52 writes at one a second take 140 million years): numbering
  restarts at 1, logged. Continuing above it would soon exceed the contract's 2^53 and
  wedge every later write. Readers order by generation only within one term and by
  `generated_at` across terms (azprobe.contracts.weights.is_newer), so a restart in a
  new term is taken at once, and a future-dated document is refused by every reader;
- `expires_at = generated_at + max(3 * heartbeat_s, 2 * session_ttl_s + lock_delay_s +
  3 * interval_s)`: a reader tolerates two missed heartbeats, and a leader fail-over
  (the old session expiring - Consul may take up to 2 x TTL - plus the lock-delay plus a
  few cycles) never makes readers treat a still-correct document as stale;
- each document is validated by parse_weights(doc.dumps()) - the readers' own parser -
  before the transaction; an invalid document is never written (counted, logged).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import consul

from azprobe.clients.consul import ConsulSettings, TxnConflict, op_check_session, op_set, read_key, txn
from azprobe.clients.consul import MAX_TXN_OPS
from azprobe.contracts import bounded_json, kv
from azprobe.contracts.window import printable
from azprobe.contracts.weights import MAX_DOC_BYTES, MAX_INT, WeightsDoc, WeightsError, ZoneWeights, parse_weights
from azprobe.contracts.weights_hosts import (MAX_DOC_SICK_HOSTS, MAX_ZONE_SICK_HOSTS, HostsDoc, SickHostEntry,
                                             parse_hosts)
from azprobe.controller.decide import GLOBAL_VIEW

log = logging.getLogger(__name__)

MAX_CONTINUED_GENERATION = 2**52  # above: not ours, restart the numbering (module docstring)


def new_term() -> str:
    """A leader term's id: 64 random bits in hex, so no two terms share one."""
    return secrets.token_hex(8)


@dataclass(frozen=True)
class WeightsView:
    """One document's content before it gets its generation and timestamps."""

    state: str
    zones: Mapping[str, ZoneWeights]
    source_az: str | None = None
    sick: Mapping[str, tuple[SickHostEntry, ...]] = field(default_factory=dict)  # zone -> named hosts, worst first

    def signature(self) -> tuple:
        """What a write is about: shares, states and named hosts (not reasons or float noise)."""
        return (self.state, tuple(sorted((az, z.share, z.state) for az, z in self.zones.items())),
                tuple(sorted((az, tuple(h.addr for h in hosts)) for az, hosts in self.sick.items() if hosts)))


class Fenced(Exception):
    """The transaction was rolled back: we are not (any more) the lock holder."""

    def __init__(self, conflict: TxnConflict) -> None:
        self.conflict = conflict
        super().__init__(str(conflict))


@dataclass
class PublishCounters:
    writes: int = 0
    conflicts: int = 0
    invalid_docs: int = 0
    skipped_unchanged: int = 0
    write_errors: int = 0  # transactions Consul failed (not 409s): retried with backoff
    generation_restarts: int = 0  # implausible generations found in KV
    control_read_errors: int = 0  # reads of control/ that failed: the last good controls held


@dataclass
class Publisher:
    client: consul.Consul
    settings: ConsulSettings
    leader_name: str
    model_name: str
    heartbeat_s: float = 30.0
    expiry_s: float = 90.0
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    generation: int = 0
    term: str = field(default_factory=new_term)
    counters: PublishCounters = field(default_factory=PublishCounters)
    _last_signatures: dict[str, tuple] | None = None
    _last_write_at: float | None = None
    _hosts_in_kv: bool = False  # a sick-hosts document may name hosts: the next write must replace it

    @staticmethod
    def expiry_for(*, heartbeat_s: float, session_ttl_s: float, lock_delay_s: float, interval_s: float) -> float:
        """See the module docstring for why."""
        return max(3 * heartbeat_s, 2 * session_ttl_s + lock_delay_s + 3 * interval_s)

    @property
    def weights_key(self) -> str:
        return self.settings.key(kv.WEIGHTS)

    def view_key(self, view: str) -> str:
        return self.settings.key(kv.weights_name(None if view == GLOBAL_VIEW else view))

    def start_term(self) -> int:
        """On becoming leader: a new term, numbered above the generation already in KV.
        Raises ConsulError when Consul does not answer (then we must not write yet)."""
        state = read_key(self.client, self.weights_key)
        current = 0
        if state.value:
            try:
                current = parse_weights(state.value).generation
            except WeightsError as exc:
                # An invalid document still tells us the generation readers last saw.
                try:
                    raw = bounded_json.loads(state.value, max_bytes=MAX_DOC_BYTES, what="weights document")
                    value = raw.get("generation") if isinstance(raw, dict) else None
                    current = value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
                except bounded_json.JsonRefused:
                    current = 0
                log.warning("the weights document in KV is invalid (%s): continuing above generation %d",
                            printable(str(exc), 200), current)
        if current > MAX_CONTINUED_GENERATION:
            log.warning("the weights document in KV has generation %d, beyond any a leader writes: "
                        "restarting the numbering at 1 in a new term", current)
            self.counters.generation_restarts += 1
            current, self.generation = 0, 0
        self.generation = max(self.generation, current)
        self._hosts_in_kv = read_key(self.client, self.settings.key(kv.HOSTS)).value is not None
        self.term = new_term()
        self._last_signatures = None  # first write of a term always goes out
        self._last_write_at = None
        return self.generation

    def due(self, views: Mapping[str, WeightsView]) -> str | None:
        """Why these views should be written now, or None when nothing moved."""
        if self._last_signatures is None or self._last_write_at is None:
            return "first write of this term"
        signatures = {name: v.signature() for name, v in views.items()}
        if signatures != self._last_signatures:
            return "shares or states changed"
        if self.clock() - self._last_write_at >= self.heartbeat_s:
            return "heartbeat"
        return None

    def build(self, views: Mapping[str, WeightsView], generation: int, now: float) -> dict[str, WeightsDoc]:
        """Stamp views into documents and validate each with the readers' parser."""
        docs: dict[str, WeightsDoc] = {}
        for name, view in views.items():
            doc = WeightsDoc(generation=generation, generated_at=now, expires_at=now + self.expiry_s,
                             leader=self.leader_name, model=self.model_name, state=view.state,
                             zones=dict(view.zones), source_az=view.source_az, term=self.term)
            parse_weights(doc.dumps())  # the last line of defence: what readers will accept
            docs[name] = doc
        return docs

    def build_hosts(self, views: Mapping[str, WeightsView], generation: int, now: float) -> HostsDoc | None:
        """The sick-hosts document of these views (None when none names a host and none
        is in KV to replace), within the contract's bounds: each zone's worst first, the
        global view before the source views."""
        room = MAX_DOC_SICK_HOSTS
        named: dict[str, dict[str, tuple[SickHostEntry, ...]]] = {}
        for name in sorted(views, key=lambda n: (n != GLOBAL_VIEW, n)):
            zones = {}
            for az, hosts in sorted(views[name].sick.items()):
                kept = tuple(hosts[:min(MAX_ZONE_SICK_HOSTS, room)])
                room -= len(kept)
                if kept:
                    zones[az] = kept
            named[name] = zones
        if not any(named.values()) and not self._hosts_in_kv:
            return None
        doc = HostsDoc(generation=generation, generated_at=now, expires_at=now + self.expiry_s,
                       global_view=named.get(GLOBAL_VIEW, {}), term=self.term,
                       from_views={name: zones for name, zones in named.items() if name != GLOBAL_VIEW and zones})
        parse_hosts(doc.dumps())
        return doc

    def publish(self, session_id: str, views: Mapping[str, WeightsView], *, force: bool = False) -> WeightsDoc | None:
        """Write the views if due. Returns the global document written, None when nothing
        was due or a document was invalid. Raises Fenced on a 409, ConsulError when
        Consul does not answer."""
        reason = "forced" if force else self.due(views)
        if reason is None:
            self.counters.skipped_unchanged += 1
            return None
        if GLOBAL_VIEW not in views:
            raise ValueError("views must include the global view")
        if self.generation >= MAX_INT:  # a numbering restarts only in a new term
            self.generation, self.term = 0, new_term()
        generation = self.generation + 1
        try:
            now = self.wall()
            docs = self.build(views, generation, now)
        except (WeightsError, ValueError, TypeError) as exc:
            self.counters.invalid_docs += 1
            log.error("not writing an invalid weights document: %s", exc)
            return None
        try:
            hosts = self.build_hosts(views, generation, now)
        except (WeightsError, ValueError, TypeError) as exc:  # the weights still go out: hosts are advice
            self.counters.invalid_docs += 1
            log.error("not writing an invalid sick-hosts document: %s", exc)
            hosts = None
        # Consumed before sending: if the txn applied but its answer was lost, the next
        # write must still carry a higher generation.
        self.generation = generation
        ops = [op_check_session(self.settings.key(kv.LEADER), session_id)]
        ops += [op_set(self.view_key(name), doc.dumps()) for name, doc in docs.items()]
        if hosts is not None:  # before the source views: those are what a cut would drop
            ops.insert(2, op_set(self.settings.key(kv.HOSTS), hosts.dumps()))
        if len(ops) > MAX_TXN_OPS:  # the topology bounds the views; never let a txn fail on this
            log.error("%d views exceed one transaction, writing the first %d", len(docs), MAX_TXN_OPS - 1)
            ops = ops[:MAX_TXN_OPS]
        try:
            txn(self.client, ops)
        except TxnConflict as exc:
            self.counters.conflicts += 1
            raise Fenced(exc) from None
        self.counters.writes += 1
        self._hosts_in_kv = hosts is not None and bool(hosts.global_view or hosts.from_views)
        self._last_signatures = {name: v.signature() for name, v in views.items()}
        self._last_write_at = self.clock()
        log.debug("wrote weights generation %d (%s)", generation, reason)
        return docs[GLOBAL_VIEW]
