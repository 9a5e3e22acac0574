"""THE weights contract (docs/contracts.md "Weights document"): Consul KV `<prefix>weights`
and `<prefix>weights/from/<src AZ>` (key names in azprobe.contracts.kv).

The controller builds documents from these dataclasses; every reader (`azprobe weights`,
WeightWatcher, envoy-eds) parses them with `parse_weights`. Construction validates, so
an invalid document can be neither written nor read: no NaN, no all-zero, no empty set.
A rejected document raises WeightsError naming the field and is counted in `REJECTED`
(a process that exports metrics reads it at scrape time; there is no global registry).

azprobe/contracts/schema/weights.schema.json states the same rules as a JSON Schema, except what
JSON Schema cannot say: shares summing to 100, expires_at within 0..MAX_TTL_S of
generated_at, no duplicate keys, no NaN/Infinity literals, integers written without a fraction.

Which of two documents a reader keeps (`is_newer`): a leader's numbering restarts (a
document in KV with an implausible generation), so a generation means something only
within its `term`, which each leader term draws afresh. Within one term the higher
generation is newer; across terms (or without a term) the later `generated_at` is.
Nothing dated more than MAX_CLOCK_SKEW_S ahead of the reader's clock is ever kept:
`parse_weights(raw, now=...)` refuses it, and a held one loses to any present document.
Before generations are compared, a fresh document wins over an expired one (either
way), and no document is fresh longer than MAX_TTL_S after its generated_at.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from azprobe.contracts.window import name_problem, printable
from azprobe.contracts import bounded_json
from azprobe.contracts.kv import MAX_VALUE_BYTES

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).parent / "schema" / "weights.schema.json"
DECAY_RATE = 2.0  # weight = exp(-DECAY_RATE * (1 - H)): the decay every model's weight follows
MIN_WEIGHT = math.exp(-DECAY_RATE)  # the floor of `weight` (health 0)
MAX_WEIGHT = 1.0  # health 1
WEIGHT_SLACK = 1e-9
TOTAL_SHARE = 100
MAX_ZONES = 64
MAX_STRING = 256
MAX_REASONS = 64
MAX_INT = 2**53  # beyond this a JSON number loses integer precision in most readers
MAX_TIMESTAMP = 1e11  # unix seconds, year ~5138: anything later is garbage
# A reader refuses a document dated further ahead of its own clock than this. Clocks are
# NTP-synchronised (`azprobe doctor` fails above 5 s), and a document dated ahead within
# the bound can hold a reader's choice at most this long.
MAX_CLOCK_SKEW_S = 10.0
# The longest a document may stay fresh: expires_at - generated_at. The controller writes
# max(3 x heartbeat_s, 2 x session_ttl_s + lock_delay_s + 3 x interval_s) (controller/
# publish.py), at most 3 days with its config's maxima (heartbeat_s <= 86400 s); a week
# leaves room for that. Without a bound, one document with a far expires_at is "fresh"
# to every reader for years after its writer died, held through a deleted key or a dead
# Consul: a single input would decide the routing indefinitely.
MAX_TTL_S = 7 * 86400.0
MAX_TERM = 128  # a term id: 1..128 of [A-Za-z0-9._-], like a boot id
MAX_P95_MS = 86_400_000.0  # one day
MAX_DOC_BYTES = MAX_VALUE_BYTES  # a document is one KV value
OVERALL_STATES = frozenset({"ok", "degraded", "panic", "frozen", "stale"})
ZONE_STATES = frozenset({"ok", "degraded", "stale", "panic", "frozen", "shifted"})
DOC_FIELDS = ("schema", "generation", "generated_at", "expires_at", "source_az", "leader",
              "model", "state", "zones")
OPTIONAL_DOC_FIELDS = ("term",)  # absent in documents of writers without terms: they still parse
ZONE_FIELDS = ("weight", "share", "health", "success", "p95_ms", "util", "samples", "state",
               "reasons")


class WeightsError(ValueError):
    """A weights document that breaks the contract. `field` is the dotted path."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)

    def within(self, prefix: str) -> "WeightsError":
        return WeightsError(f"{prefix}.{self.field}" if self.field else prefix, self.problem)


class RejectedCounter:
    """Thread-safe count of rejected documents, readable without Prometheus."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def inc(self) -> None:
        with self._lock:
            self._count += 1

    @property
    def value(self) -> int:
        with self._lock:
            return self._count


REJECTED = RejectedCounter()


# --- field checks (shared by parsing and construction) ------------------------------

def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _string(value: Any, name: str, *, allow_empty: bool = True) -> str:
    if not isinstance(value, str):
        raise WeightsError(name, f"expected a string, got {_short(value)}")
    if not allow_empty and not value:
        raise WeightsError(name, "must not be empty")
    if len(value) > MAX_STRING:
        raise WeightsError(name, f"string of {len(value)} chars exceeds {MAX_STRING}")
    return value


def _integer(value: Any, name: str, lo: int, hi: int = MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WeightsError(name, f"expected an integer, got {_short(value)}")
    if not lo <= value <= hi:
        raise WeightsError(name, f"{_short(value)} outside {lo}..{hi}")
    return value


def _number(value: Any, name: str, lo: float, hi: float, *, nullable: bool = False) -> float | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "a number or null" if nullable else "a number"
        raise WeightsError(name, f"expected {kind}, got {_short(value)}")
    if isinstance(value, int) and abs(value) > MAX_INT:
        raise WeightsError(name, f"{_short(value)} outside {lo:g}..{hi:g}")
    number = float(value)
    if not math.isfinite(number):
        raise WeightsError(name, f"{number} is not a finite number")
    if not lo <= number <= hi:
        raise WeightsError(name, f"{number:g} outside {lo:g}..{hi:g}")
    return number


def check_lifetime(generated_at: float, expires_at: float) -> None:
    """expires_at within 0..MAX_TTL_S of generated_at (every TermDocument's rule)."""
    if expires_at < generated_at:
        raise WeightsError("expires_at", f"{expires_at} is before generated_at {generated_at}")
    if expires_at - generated_at > MAX_TTL_S:
        raise WeightsError("expires_at", f"{expires_at - generated_at:.0f} s after generated_at, over the "
                                         f"{MAX_TTL_S:.0f} s a document may stay fresh; the writer's TTL "
                                         "(controller [safety].heartbeat_s) must be shorter")


def _is_schema_version(value: Any) -> bool:
    return type(value) is int and value == SCHEMA_VERSION


def _state(value: Any, name: str, allowed: frozenset[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise WeightsError(name, f"{_short(value)} is not one of {', '.join(sorted(allowed))}")
    return value


# --- the document -------------------------------------------------------------------

@dataclass(frozen=True)
class ZoneWeights:
    """Weights and evidence for one destination AZ."""

    weight: float
    share: int
    health: float
    success: float | None
    p95_ms: float | None
    util: float | None
    samples: int
    state: str
    reasons: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "weight", _number(self.weight, "weight", MIN_WEIGHT - WEIGHT_SLACK, MAX_WEIGHT + WEIGHT_SLACK))
        set_(self, "share", _integer(self.share, "share", 1, TOTAL_SHARE))
        set_(self, "health", _number(self.health, "health", 0.0, 1.0))
        set_(self, "success", _number(self.success, "success", 0.0, 1.0, nullable=True))
        set_(self, "p95_ms", _number(self.p95_ms, "p95_ms", 0.0, MAX_P95_MS, nullable=True))
        set_(self, "util", _number(self.util, "util", 0.0, 1.0, nullable=True))
        set_(self, "samples", _integer(self.samples, "samples", 0))
        set_(self, "state", _state(self.state, "state", ZONE_STATES))
        if not isinstance(self.reasons, (list, tuple)):
            raise WeightsError("reasons", f"expected a list of strings, got {_short(self.reasons)}")
        if len(self.reasons) > MAX_REASONS:
            raise WeightsError("reasons", f"{len(self.reasons)} reasons exceed {MAX_REASONS}")
        set_(self, "reasons", tuple(_string(r, f"reasons[{i}]") for i, r in enumerate(self.reasons)))

    def to_json(self) -> dict[str, Any]:
        return {"weight": self.weight, "share": self.share, "health": self.health,
                "success": self.success, "p95_ms": self.p95_ms, "util": self.util,
                "samples": self.samples, "state": self.state, "reasons": list(self.reasons)}


class TermDocument:
    """What the documents a leader writes each cycle share (the weights documents, the
    sick-hosts document): `generation` within a `term`, `generated_at`, `expires_at`,
    and a deterministic encoding. Subclasses are frozen dataclasses with those fields
    and a `to_json`."""

    generation: int
    generated_at: float
    expires_at: float
    term: str | None

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def dumps(self) -> str:
        """Compact, deterministic JSON (sorted keys): equal docs give equal bytes."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    def is_stale(self, now: float | None = None) -> bool:
        """Past expires_at: a reader must not act on it any more."""
        return (time.time() if now is None else now) >= self.expires_at

    def age_s(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.generated_at

    def is_from_future(self, now: float | None = None) -> bool:
        """Dated more than MAX_CLOCK_SKEW_S ahead of `now`: no reader keeps it."""
        return self.generated_at > (time.time() if now is None else now) + MAX_CLOCK_SKEW_S

    def same_term(self, other: "TermDocument") -> bool:
        """Both written in one leader term, so their generations are comparable."""
        return self.term is not None and self.term == other.term


@dataclass(frozen=True)
class WeightsDoc(TermDocument):
    """One weights document. Immutable (zones is a read-only mapping), so a reader can
    share one instance between threads and swap it atomically."""

    generation: int
    generated_at: float
    expires_at: float
    leader: str
    model: str
    state: str
    zones: Mapping[str, ZoneWeights]
    source_az: str | None = None
    term: str | None = None  # the writer's leader term; generations are ordered within one
    schema: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if not _is_schema_version(self.schema):
            raise WeightsError("schema", f"unsupported version {_short(self.schema)} "
                                         f"(this azprobe reads {SCHEMA_VERSION}; upgrade the reader)")
        set_(self, "generation", _integer(self.generation, "generation", 1))
        set_(self, "generated_at", _number(self.generated_at, "generated_at", 0.0, MAX_TIMESTAMP))
        set_(self, "expires_at", _number(self.expires_at, "expires_at", 0.0, MAX_TIMESTAMP))
        check_lifetime(self.generated_at, self.expires_at)
        if self.source_az is not None:
            _string(self.source_az, "source_az", allow_empty=False)
        if self.term is not None:
            problem = name_problem(self.term, MAX_TERM)
            if problem:
                raise WeightsError("term", f"{_short(self.term)} {problem}")
        _string(self.leader, "leader")
        _string(self.model, "model")
        _state(self.state, "state", OVERALL_STATES)
        if not isinstance(self.zones, Mapping):
            raise WeightsError("zones", f"expected an object of AZ -> zone, got {_short(self.zones)}")
        if not self.zones:
            raise WeightsError("zones", "must not be empty (an empty set would drain every AZ)")
        if len(self.zones) > MAX_ZONES:
            raise WeightsError("zones", f"{len(self.zones)} zones exceed {MAX_ZONES}")
        for az, zone in self.zones.items():
            _string(az, "zones", allow_empty=False)
            if not isinstance(zone, ZoneWeights):
                raise WeightsError(f"zones.{printable(az, 64)}", f"expected ZoneWeights, got {_short(zone)}")
        total = sum(z.share for z in self.zones.values())
        if total != TOTAL_SHARE:
            raise WeightsError("zones", f"shares sum to {total}, must be exactly {TOTAL_SHARE}")
        # A private copy behind a read-only view: the caller's dict cannot mutate us.
        set_(self, "zones", MappingProxyType(dict(sorted(self.zones.items()))))

    def __hash__(self) -> int:
        return hash(self.dumps())

    def to_json(self) -> dict[str, Any]:
        doc = {"schema": self.schema, "generation": self.generation,
               "generated_at": self.generated_at, "expires_at": self.expires_at,
               "source_az": self.source_az, "leader": self.leader, "model": self.model,
               "state": self.state, "zones": {az: z.to_json() for az, z in self.zones.items()}}
        if self.term is not None:
            doc["term"] = self.term
        return doc

    def effective_state(self, now: float | None = None) -> str:
        """The overall state a reader should show: "stale" once expired."""
        return "stale" if self.is_stale(now) else self.state



def is_newer(candidate: TermDocument, current: TermDocument | None, now: float) -> bool:
    """Whether a reader holding `current` takes `candidate` (the module docstring's rule).
    Equal documents are a replay: not newer."""
    if candidate.is_from_future(now):
        return False
    if current is None:
        return True
    if candidate == current:
        return False
    if current.is_from_future(now):  # the reader's clock stepped back: drop it for a present one
        return True
    # Freshness first. An expired document no longer speaks for its term: a fresh one
    # replaces it whatever the generations say, so one document of the term with a huge
    # generation holds the readers at most until it expires (MAX_TTL_S), not until the
    # term changes; and that document, written again once expired, does not displace the
    # fresh one.
    held_stale, candidate_stale = current.is_stale(now), candidate.is_stale(now)
    if held_stale != candidate_stale:
        return held_stale
    if candidate.same_term(current):
        return candidate.generation > current.generation
    return candidate.generated_at > current.generated_at


# --- parsing ------------------------------------------------------------------------

def reject_constant(name: str) -> Any:
    raise WeightsError("", f"{name} is not allowed in a weights document")


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise WeightsError(printable(key, 64), "duplicate key")
        result[key] = value
    return result


def _check_keys(doc: Mapping[str, Any], expected: tuple[str, ...], where: str,
                optional: tuple[str, ...] = ()) -> None:
    for key in doc:
        if key not in expected and key not in optional:
            # the name comes from the document: escaped and cut, the error stays one short line
            raise WeightsError(f"{where}{printable(key, 64)}", f"unknown field (known: {', '.join(expected + optional)})")
    for key in expected:
        if key not in doc:
            raise WeightsError(f"{where}{key}", "is required")  # one of ours; `where` is quoted


def _zone_from_json(az: str, raw: Any) -> ZoneWeights:
    where = f"zones.{printable(az, 64)}"  # the AZ name comes from the document
    if not isinstance(raw, Mapping):
        raise WeightsError(where, f"expected an object, got {_short(raw)}")
    _check_keys(raw, ZONE_FIELDS, where + ".")
    if not isinstance(raw["reasons"], list):
        raise WeightsError(where + ".reasons", f"expected a list of strings, got {_short(raw['reasons'])}")
    try:
        return ZoneWeights(**{name: raw[name] for name in ZONE_FIELDS})
    except WeightsError as exc:
        raise exc.within(where) from None


def weights_from_json(doc: Any) -> WeightsDoc:
    """Validate an already-decoded JSON value. Prefer parse_weights for raw bytes."""
    if not isinstance(doc, Mapping):
        raise WeightsError("", f"expected a JSON object, got {_short(doc)}")
    if "schema" in doc and not _is_schema_version(doc["schema"]):
        # Checked first: a newer schema may legitimately have other fields.
        raise WeightsError("schema", f"unsupported version {_short(doc['schema'])} "
                                     f"(this azprobe reads {SCHEMA_VERSION}; upgrade the reader)")
    _check_keys(doc, DOC_FIELDS, "", OPTIONAL_DOC_FIELDS)
    if "term" in doc and doc["term"] is None:  # absent means "no term"; null is a writer's mistake
        raise WeightsError("term", "None is not a string (omit the field for a document without a term)")
    zones_raw = doc["zones"]
    if not isinstance(zones_raw, Mapping):
        raise WeightsError("zones", f"expected an object of AZ -> zone, got {_short(zones_raw)}")
    if len(zones_raw) > MAX_ZONES:
        raise WeightsError("zones", f"{len(zones_raw)} zones exceed {MAX_ZONES}")
    zones = {}
    for az, raw in zones_raw.items():
        _string(az, "zones", allow_empty=False)
        zones[az] = _zone_from_json(az, raw)
    return WeightsDoc(generation=doc["generation"], generated_at=doc["generated_at"],
                      expires_at=doc["expires_at"], source_az=doc["source_az"], leader=doc["leader"],
                      model=doc["model"], state=doc["state"], zones=zones, term=doc.get("term"),
                      schema=doc["schema"])


def _refuse_future(doc: WeightsDoc, now: float) -> WeightsDoc:
    if doc.is_from_future(now):
        raise WeightsError("generated_at", f"{doc.generated_at:.1f} is {doc.generated_at - now:.0f} s ahead of "
                                           f"this reader's clock (more than {MAX_CLOCK_SKEW_S:g} s): a document "
                                           "from the future; check the writer's and this host's clocks (NTP)")
    return doc


def parse_weights(raw: bytes | str, *, now: float | None = None) -> WeightsDoc:
    """Decode and validate a weights document. Raises WeightsError (naming the field)
    for anything that is not a valid document, and counts it; never anything else.
    Readers pass `now` (their clock): a document from the future is refused too."""
    try:
        if not isinstance(raw, (bytes, bytearray, memoryview, str)):
            raise WeightsError("", f"expected bytes or str, got {type(raw).__name__}")
        try:
            doc = bounded_json.loads(raw, max_bytes=MAX_DOC_BYTES, what="weights document",
                                     parse_constant=reject_constant, object_pairs_hook=unique_keys)
        except bounded_json.JsonRefused as exc:
            raise WeightsError("", str(exc)) from None
        parsed = weights_from_json(doc)
        return parsed if now is None else _refuse_future(parsed, now)
    except WeightsError:
        REJECTED.inc()
        raise
