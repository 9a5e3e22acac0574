"""The window contract (agent -> controller), DESIGN.md "Contracts".

One window per agent interval; `seq` strictly increases within one agent boot
(`boot_id`). Stats are keyed by path: source AZ -> destination AZ. `parse_window` is the
one validator every reader uses: it raises `WindowError` with the offending field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from azprobe.contracts.sketch import Histogram

SCHEMA_VERSION = 1
OTHER_AZ = "other"  # destination outside the topology

COUNTER_FIELDS = (
    "conn_attempts",
    "conn_ok",
    "conn_refused",
    "conn_timeout",
    "syn_retrans",
    "retrans",
    "rto",
)
HISTOGRAM_FIELDS = ("rtt_us", "connect_us")
# Which collector made a window: "bpf" (the probe) or "sockdiag" (the sampling fallback).
# Optional on the wire, "bpf" when absent; readers treat every source alike.
DEFAULT_SOURCE = "bpf"
MAX_SOURCE_LEN = 32
MAX_COUNT = 2**53  # above this a counter is garbage, not traffic


class WindowError(ValueError):
    """A window that breaks the contract; the message names the field."""


@dataclass(kw_only=True)
class TcpCounters:
    """Connect outcomes, retransmits, RTOs and latency histograms; merged by addition."""

    conn_attempts: int = 0
    conn_ok: int = 0
    conn_refused: int = 0
    conn_timeout: int = 0
    syn_retrans: int = 0
    retrans: int = 0
    rto: int = 0
    rtt_us: Histogram = field(default_factory=Histogram)
    connect_us: Histogram = field(default_factory=Histogram)

    def merge(self, other: "TcpCounters") -> None:
        # Spelled out, not a getattr/setattr loop: the controller merges ~10^5 per second.
        self.conn_attempts += other.conn_attempts
        self.conn_ok += other.conn_ok
        self.conn_refused += other.conn_refused
        self.conn_timeout += other.conn_timeout
        self.syn_retrans += other.syn_retrans
        self.retrans += other.retrans
        self.rto += other.rto
        self.rtt_us.merge(other.rtt_us)
        self.connect_us.merge(other.connect_us)


@dataclass
class PathStats(TcpCounters):
    """The counters of one path, source AZ -> destination AZ."""

    src: str
    dst: str

    def to_json(self) -> dict:
        doc: dict = {"src": self.src, "dst": self.dst}
        for name in COUNTER_FIELDS:
            doc[name] = getattr(self, name)
        doc["rtt_us"] = self.rtt_us.to_json()
        doc["connect_us"] = self.connect_us.to_json()
        return doc


@dataclass
class Utilisation:
    cpu: float
    mem: float


@dataclass
class Window:
    node: str
    az: str
    boot_id: str
    seq: int
    start: float
    end: float
    util: Utilisation
    paths: list[PathStats]
    lost_events: int = 0
    schema: int = SCHEMA_VERSION
    source: str = DEFAULT_SOURCE

    def to_json(self) -> dict:
        return {
            "schema": self.schema,
            "node": self.node,
            "az": self.az,
            "boot_id": self.boot_id,
            "seq": self.seq,
            "start": self.start,
            "end": self.end,
            "util": {"cpu": self.util.cpu, "mem": self.util.mem},
            "paths": [p.to_json() for p in self.paths],
            "lost_events": self.lost_events,
            "source": self.source,
        }


def _str(doc: Mapping, key: str, where: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value or len(value) > 253:
        raise WindowError(f"{where}{key}: expected a non-empty string, got {value!r:.40}")
    return value


def _is_object(value: object) -> bool:
    # json.loads gives dicts; the Mapping ABC check is the slow path for anything else.
    return type(value) is dict or isinstance(value, Mapping)


def _count_error(where: str, key: str, value: object) -> WindowError:
    return WindowError(f"{where}{key}: expected a count 0..2^53, got {value!r:.40}")


def _count(doc: Mapping, key: str, where: str) -> int:
    value = doc.get(key, 0)
    if type(value) is not int or not 0 <= value <= MAX_COUNT:  # type(): a bool is not a count
        raise _count_error(where, key, value)
    return value


def _number(doc: Mapping, key: str, where: str, lo: float, hi: float) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WindowError(f"{where}{key}: expected a number, got {value!r:.40}")
    value = float(value)
    if math.isnan(value) or not lo <= value <= hi:
        raise WindowError(f"{where}{key}: {value} outside {lo}..{hi}")
    return value


def parse_path(doc: object, where: str = "paths[]") -> PathStats:
    if not _is_object(doc):
        raise WindowError(f"{where}: expected an object")
    prefix = where + "."
    # The controller's hot path (every path of every window of every agent): one loop,
    # no helper call per counter.
    get = doc.get
    fields: dict = {}
    for name in COUNTER_FIELDS:
        value = get(name, 0)
        if type(value) is not int or not 0 <= value <= MAX_COUNT:
            raise _count_error(prefix, name, value)
        fields[name] = value
    for name in HISTOGRAM_FIELDS:
        if name in doc:
            try:
                fields[name] = Histogram.from_json(doc[name])
            except ValueError as exc:
                raise WindowError(f"{prefix}{name}: {exc}") from None
    return PathStats(_str(doc, "src", prefix), _str(doc, "dst", prefix), **fields)


def parse_window(doc: object) -> Window:
    """Validate one window document; raises WindowError naming the bad field."""
    if not _is_object(doc):
        raise WindowError("window: expected a JSON object")
    schema = doc.get("schema")
    if schema != SCHEMA_VERSION:
        raise WindowError(f"schema: unsupported version {schema!r} (this azprobe reads {SCHEMA_VERSION})")
    util = doc.get("util")
    if not _is_object(util):
        raise WindowError("util: expected an object with cpu and mem")
    paths = doc.get("paths")
    if not isinstance(paths, list):
        raise WindowError("paths: expected a list")
    start = _number(doc, "start", "", 0, 1e11)
    end = _number(doc, "end", "", 0, 1e11)
    if end < start:
        raise WindowError(f"end: {end} is before start {start}")
    return Window(
        node=_str(doc, "node", ""),
        az=_str(doc, "az", ""),
        boot_id=_str(doc, "boot_id", ""),
        seq=_count(doc, "seq", ""),
        start=start,
        end=end,
        util=Utilisation(
            cpu=_number(util, "cpu", "util.", 0.0, 1.0),
            mem=_number(util, "mem", "util.", 0.0, 1.0),
        ),
        paths=[parse_path(p, f"paths[{i}]") for i, p in enumerate(paths)],
        lost_events=_count(doc, "lost_events", ""),
        source=_source(doc),
    )


def _source(doc: Mapping) -> str:
    value = doc.get("source", DEFAULT_SOURCE)
    if not isinstance(value, str) or not value.isascii() or not value.isalnum() or len(value) > MAX_SOURCE_LEN:
        raise WindowError(f"source: expected a collector name like \"bpf\", got {value!r:.40}")
    return value
