"""The sick-hosts document (docs/contracts.md "Sick-hosts document"): Consul KV
`<prefix>hosts`, beside the weights documents and written in the same transaction.

Why a key of its own and not a field of the weights document: readers of the weights
document refuse unknown fields (azprobe.contracts.weights), so a field would make every
reader older than it refuse every document while a host is named, and fall back to equal
weights. A key beside it leaves the weights document exactly as it was: old readers keep
parsing it, new ones read both.

One document holds every view (the global one and each source AZ's), so the transaction
grows by one operation whatever the number of AZs. Per view, per zone, the sick hosts the
controller named, worst first, each with its reasons (`controller/hosts.py`). Ordering
and staleness follow the weights document's rules (`generation` within a `term`,
`generated_at` across terms, `expires_at`, refused from the future), so WeightWatcher
reads it as it reads a weights document (`WeightWatcher(..., parse=parse_hosts)`).

Bounds: at most MAX_ZONES zones per view, MAX_ZONE_SICK_HOSTS hosts per zone,
MAX_DOC_SICK_HOSTS hosts in the whole document, MAX_HOST_REASONS reasons per host (each
at most MAX_STRING characters), and the whole at most MAX_DOC_BYTES (one KV value).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from azprobe.contracts import bounded_json
from azprobe.contracts.weights import (MAX_CLOCK_SKEW_S, MAX_DOC_BYTES, MAX_INT, MAX_STRING, MAX_TERM, MAX_TIMESTAMP,
                                       MAX_ZONES, REJECTED, TermDocument, WeightsError, reject_constant,
                                       unique_keys, check_lifetime)
from azprobe.contracts.window import MAX_ADDRESS_LEN, is_az_name, name_problem, printable

HOSTS_SCHEMA_VERSION = 1
MAX_ZONE_SICK_HOSTS = 64
MAX_DOC_SICK_HOSTS = 256
MAX_HOST_REASONS = 4
DOC_FIELDS = ("schema", "generation", "generated_at", "expires_at", "global", "from")
OPTIONAL_FIELDS = ("term",)
HOST_FIELDS = ("addr", "reasons")

ZoneSick = Mapping[str, "tuple[SickHostEntry, ...]"]  # zone -> its sick hosts, worst first


@dataclass(frozen=True)
class SickHostEntry:
    """One named host: its address (canonical text) and why."""

    addr: str
    reasons: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        addr = self.addr
        try:
            ok = isinstance(addr, str) and 0 < len(addr) <= MAX_ADDRESS_LEN and str(ipaddress.ip_address(addr)) == addr
        except ValueError:
            ok = False
        if not ok:
            raise WeightsError("addr", f"{str(addr)[:40]!r} is not an IPv4 or IPv6 address in canonical form")
        if not isinstance(self.reasons, (list, tuple)) or len(self.reasons) > MAX_HOST_REASONS:
            raise WeightsError("reasons", f"expected at most {MAX_HOST_REASONS} strings")
        for i, r in enumerate(self.reasons):
            if not isinstance(r, str) or len(r) > MAX_STRING:
                raise WeightsError(f"reasons[{i}]", f"expected a string of at most {MAX_STRING} characters")
        object.__setattr__(self, "reasons", tuple(self.reasons))

    def to_json(self) -> dict[str, Any]:
        return {"addr": self.addr, "reasons": list(self.reasons)}


def _view(zones: Any, where: str) -> Mapping[str, tuple[SickHostEntry, ...]]:
    if not isinstance(zones, Mapping):
        raise WeightsError(where, "expected an object of AZ -> [sick host, ...]")
    if len(zones) > MAX_ZONES:
        raise WeightsError(where, f"{len(zones)} zones exceed {MAX_ZONES}")
    out: dict[str, tuple[SickHostEntry, ...]] = {}
    for az, hosts in zones.items():
        if not is_az_name(az):
            raise WeightsError(where, f"{str(az)[:40]!r} {name_problem(az, 63)}")
        if not isinstance(hosts, (list, tuple)) or len(hosts) > MAX_ZONE_SICK_HOSTS:
            raise WeightsError(f"{where}.{az}", f"expected a list of at most {MAX_ZONE_SICK_HOSTS} sick hosts")
        if any(not isinstance(h, SickHostEntry) for h in hosts):
            raise WeightsError(f"{where}.{az}", "expected SickHostEntry items")
        if len({h.addr for h in hosts}) != len(hosts):
            raise WeightsError(f"{where}.{az}", "names a host twice")
        out[az] = tuple(hosts)
    return MappingProxyType(dict(sorted(out.items())))


@dataclass(frozen=True)
class HostsDoc(TermDocument):
    """The sick hosts of every view. Immutable; ordered and aged like a WeightsDoc."""

    generation: int
    generated_at: float
    expires_at: float
    global_view: ZoneSick
    from_views: Mapping[str, ZoneSick]
    term: str | None = None
    schema: int = HOSTS_SCHEMA_VERSION

    def __post_init__(self) -> None:
        if type(self.schema) is not int or self.schema != HOSTS_SCHEMA_VERSION:
            raise WeightsError("schema", f"unsupported version {str(self.schema)[:20]} (this azprobe reads "
                                         f"{HOSTS_SCHEMA_VERSION}; upgrade the reader)")
        for name, value, lo, hi in (("generation", self.generation, 1, MAX_INT),
                                    ("generated_at", self.generated_at, 0, MAX_TIMESTAMP),
                                    ("expires_at", self.expires_at, 0, MAX_TIMESTAMP)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
                raise WeightsError(name, f"{str(value)[:40]} outside {lo:g}..{hi:g}")
            if name == "generation" and not isinstance(value, int):
                raise WeightsError(name, "expected an integer")
        check_lifetime(self.generated_at, self.expires_at)
        if self.term is not None and name_problem(self.term, MAX_TERM):
            raise WeightsError("term", f"{str(self.term)[:40]!r} {name_problem(self.term, MAX_TERM)}")
        object.__setattr__(self, "global_view", _view(self.global_view, "global"))
        if not isinstance(self.from_views, Mapping) or len(self.from_views) > MAX_ZONES:
            raise WeightsError("from", f"expected an object of at most {MAX_ZONES} source AZs")
        views = {}
        for src, zones in self.from_views.items():
            if not is_az_name(src):
                raise WeightsError("from", f"{str(src)[:40]!r} {name_problem(src, 63)}")
            views[src] = _view(zones, f"from.{src}")
        object.__setattr__(self, "from_views", MappingProxyType(dict(sorted(views.items()))))
        total = sum(len(h) for v in (self.global_view, *self.from_views.values()) for h in v.values())
        if total > MAX_DOC_SICK_HOSTS:
            raise WeightsError("", f"{total} sick hosts exceed {MAX_DOC_SICK_HOSTS}")
        if len(self.dumps()) > MAX_DOC_BYTES:
            raise WeightsError("", f"the document exceeds {MAX_DOC_BYTES} bytes")

    def sick(self, source_az: str | None = None) -> ZoneSick:
        """The sick hosts a view's data plane demotes: the source AZ's own, else the global ones."""
        if source_az is not None and source_az in self.from_views:
            return self.from_views[source_az]
        return self.global_view

    def to_json(self) -> dict[str, Any]:
        def view(zones: ZoneSick) -> dict[str, Any]:
            return {az: [h.to_json() for h in hosts] for az, hosts in zones.items()}
        doc: dict[str, Any] = {"schema": self.schema, "generation": self.generation,
                               "generated_at": self.generated_at, "expires_at": self.expires_at,
                               "global": view(self.global_view),
                               "from": {src: view(z) for src, z in self.from_views.items()}}
        if self.term is not None:
            doc["term"] = self.term
        return doc

    def __hash__(self) -> int:
        return hash(self.dumps())


def _entries(raw: Any, where: str) -> dict[str, list[SickHostEntry]]:
    if not isinstance(raw, Mapping):
        raise WeightsError(where, "expected an object of AZ -> [sick host, ...]")
    if len(raw) > MAX_ZONES:
        raise WeightsError(where, f"{len(raw)} zones exceed {MAX_ZONES}")
    out: dict[str, list[SickHostEntry]] = {}
    for az, hosts in raw.items():
        at = f"{where}.{printable(az, 64)}"  # az is checked later (_view): quote it safely until then
        if not isinstance(hosts, list) or len(hosts) > MAX_ZONE_SICK_HOSTS:
            raise WeightsError(at, f"expected a list of at most {MAX_ZONE_SICK_HOSTS} sick hosts")
        entries = []
        for i, h in enumerate(hosts):
            if not isinstance(h, Mapping) or set(h) != set(HOST_FIELDS):
                raise WeightsError(f"{at}[{i}]", f"expected an object with exactly {', '.join(HOST_FIELDS)}")
            if not isinstance(h["reasons"], list):
                raise WeightsError(f"{at}[{i}].reasons", "expected a list of strings")
            try:
                entries.append(SickHostEntry(h["addr"], tuple(h["reasons"])))
            except WeightsError as exc:
                raise exc.within(f"{at}[{i}]") from None
        out[az] = entries
    return out


def hosts_from_json(doc: Any) -> HostsDoc:
    if not isinstance(doc, Mapping):
        raise WeightsError("", "expected a JSON object")
    if "schema" in doc and doc["schema"] != HOSTS_SCHEMA_VERSION:
        raise WeightsError("schema", f"unsupported version {str(doc['schema'])[:20]} (this azprobe reads "
                                     f"{HOSTS_SCHEMA_VERSION}; upgrade the reader)")
    for key in doc:
        if key not in DOC_FIELDS and key not in OPTIONAL_FIELDS:
            # the name comes from the document: escaped and cut, the error stays one short line
            raise WeightsError(printable(key, 64), f"unknown field (known: {', '.join(DOC_FIELDS + OPTIONAL_FIELDS)})")
    for key in DOC_FIELDS:
        if key not in doc:
            raise WeightsError(key, "is required")
    if not isinstance(doc["from"], Mapping) or len(doc["from"]) > MAX_ZONES:
        raise WeightsError("from", f"expected an object of at most {MAX_ZONES} source AZs")
    return HostsDoc(generation=doc["generation"], generated_at=doc["generated_at"], expires_at=doc["expires_at"],
                    global_view=_entries(doc["global"], "global"),
                    from_views={src: _entries(z, f"from.{printable(src, 64)}") for src, z in doc["from"].items()},
                    term=doc.get("term"), schema=doc["schema"])


def parse_hosts(raw: bytes | str, *, now: float | None = None) -> HostsDoc:
    """Decode and validate a sick-hosts document; WeightsError (naming the field) for
    anything else, counted with the rejected weights documents."""
    try:
        try:
            # parse_weights' hooks: a duplicate key or a NaN is refused, not read as the last
            # value, so every reader of one document demotes the same hosts
            doc = bounded_json.loads(raw, max_bytes=MAX_DOC_BYTES, what="sick-hosts document",
                                     parse_constant=reject_constant, object_pairs_hook=unique_keys)
        except bounded_json.JsonRefused as exc:
            raise WeightsError("", str(exc)) from None
        parsed = hosts_from_json(doc)
        if now is not None and parsed.is_from_future(now):
            raise WeightsError("generated_at", f"{parsed.generated_at:.1f} is more than {MAX_CLOCK_SKEW_S:g} s ahead "
                                               "of this reader's clock: a document from the future (check NTP)")
        return parsed
    except WeightsError:
        REJECTED.inc()
        raise
