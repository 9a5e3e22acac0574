"""The window contract (agent -> controller), docs/contracts.md "Window document".

One window per agent interval; `seq` strictly increases within one agent boot
(`boot_id`). Stats are keyed by path: source AZ -> destination AZ. `parse_window` is the
one validator every reader uses: it raises `WindowError` with the offending field.

Everything in a window comes from the network, so everything is bounded here, once:
- names (docs/quorum.md "Identity"): AZ names 1..63 characters, node names 1..253, boot
  ids 1..128, all of `[A-Za-z0-9._-]` (`is_az_name`, `is_node_name`): a DNS label, a
  host name, a UUID fit; a control character, a space or a quote never reaches a log line
  or a terminal;
- counts: each counter at most MAX_WINDOW_COUNT (2^32) per window (4 billion connects
  in one window is not traffic), at most MAX_PATHS paths, each (src, dst) once;
- relations: a connect that completes (ok, refused, timed out) was attempted, either in
  this window or in an earlier one still in SYN-SENT when this one began, so completions
  may exceed this window's attempts only by MAX_CONNECT_CARRY (65,536: one node's
  ephemeral port range; the kernel cannot hold more connects in flight to one
  destination port). `retrans >= syn_retrans` is NOT required: the agent counts them
  from different tracepoints;
- histograms: scheme `loglin-16` (when named), every key one of its lower bounds up to
  its last (2^34 µs; readers merge by key, so any other key is garbage), counts within
  the count bound;
- times: 0 <= start <= end <= 1e11, end - start <= MAX_WINDOW_S;
- hosts (optional): at most MAX_HOSTS per-destination-address summaries, each (src, dst,
  addr) once, addr a canonical IPv4 or IPv6 address (as Python's `ipaddress` prints it),
  counts within the count bound, failures within connects plus MAX_CONNECT_CARRY, and
  exactly HOST_RTT_BUCKETS RTT buckets.
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from azprobe.contracts.sketch import (
    LAST_BUCKET,
    LOWER_BOUNDS,
    NUM_BUCKETS,
    SCHEME,
    Histogram,
    bucket_lower_bound,
)

MAX_BUCKET_LOWER = bucket_lower_bound(LAST_BUCKET)

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
MAX_COUNT = 2**32  # per window: above this a counter is garbage, not traffic
MAX_WINDOW_COUNT = MAX_COUNT
MAX_SEQ = 2**53  # a window's seq: JSON-exact integers (a synthetic source may number by time in ms)
MAX_CONNECT_CARRY = 65_536  # completions beyond this window's attempts (see the module docstring)
MAX_PATHS = 1024  # the BPF side has 16 x 16 paths; room for a bigger build, not for garbage
MAX_WINDOW_S = 3600.0
MIN_INTERVAL_S = 0.1  # an agent's shortest interval (agent.interval_s): at most 10 windows a second
MAX_AZ_NAME = 63
MAX_NODE_NAME = 253
MAX_BOOT_ID = 128
# Per destination host: at most this many summaries in one window (the agent's own table,
# agent.max_hosts, is capped below it), so a window stays within the page's size.
MAX_HOSTS = 4096
# A host's RTT sketch: bucket i counts smoothed-RTT samples below HOST_RTT_FIRST_US * 4^i
# (the last bucket: everything above). Factor 4 from 256 µs: < 256 µs, < 1 ms, < 4 ms,
# < 16 ms, < 65 ms, < 262 ms, < 1 s, more: enough to tell a slow host from its peers,
# cheap enough to keep per address in the kernel.
HOST_RTT_BUCKETS = 8
# The hosts section as a JSON Schema (what this module checks beyond it: canonical addresses,
# failures within connects + MAX_CONNECT_CARRY, each host once).
HOSTS_SCHEMA_PATH = Path(__file__).parent / "schema" / "window-hosts.schema.json"
HOST_RTT_FIRST_US = 256
MAX_ADDRESS_LEN = 39  # the longest canonical IPv6 text
NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
NAME_RULE = "letters, digits, '.', '_' and '-'"


_KNOWN_NAMES: set[str] = set()  # names already checked: AZ names repeat in every path of every window


def is_name(value: object, limit: int) -> TypeGuard[str]:
    """A name of 1..`limit` of [A-Za-z0-9._-]; the names seen before are remembered (bounded)."""
    if type(value) is str and value in _KNOWN_NAMES and len(value) <= limit:
        return True
    ok = isinstance(value, str) and 0 < len(value) <= limit and NAME_CHARS.issuperset(value)
    if ok and len(_KNOWN_NAMES) < 100_000:  # bounded: boot ids and fake names do not grow it for ever
        _KNOWN_NAMES.add(value)  # type: ignore[arg-type]
    return ok


# The names is_name accepted, whatever the limit each was checked against. A reader whose
# decoder bounds a name's type and length itself (windowcodec: msgspec's constraints) needs
# only a lookup here for the names every window repeats. Read-only: is_name fills it.
KNOWN_NAMES: AbstractSet[str] = _KNOWN_NAMES


def is_az_name(value: object) -> bool:
    """An AZ name: 1..63 of [A-Za-z0-9._-] (a DNS label's length)."""
    return is_name(value, MAX_AZ_NAME)


def is_node_name(value: object) -> bool:
    """A node name: 1..253 of [A-Za-z0-9._-] (a host name's length)."""
    return is_name(value, MAX_NODE_NAME)


def name_problem(value: object, limit: int) -> str:
    """Why `value` is not a valid name of at most `limit` characters ("" when it is)."""
    if not isinstance(value, str) or not value:
        return "is empty" if value == "" else "is not a string"
    if len(value) > limit:
        return f"has {len(value)} characters, at most {limit} allowed"
    bad = sorted(set(value) - NAME_CHARS)
    if bad:
        return f"contains {bad[0]!r}: only {NAME_RULE} are allowed"
    return ""


def is_decimal(text: str, max_digits: int = sys.get_int_max_str_digits()) -> bool:
    """1..max_digits ASCII digits: what int() reads as a count from the network. The
    default is int()'s own bound. str.isdigit() alone takes latin-1's "²", which int()
    refuses with a ValueError no parser of a header or a port expects."""
    return 0 < len(text) <= max_digits and text.isascii() and text.isdigit()


def printable(value: object, limit: int = 80) -> str:
    """Text from the network made safe for a log line or a terminal: control and
    non-ASCII characters escaped, cut at `limit` characters."""
    text = (value if isinstance(value, str) else repr(value))[:limit]
    if text.isascii() and text.isprintable():
        return text
    return "".join(c if " " <= c <= "~" else c.encode("unicode_escape").decode("ascii") for c in text)


AZ_NAME_FIX = f"use AZ names of {NAME_RULE} (at most {MAX_AZ_NAME}), and not {OTHER_AZ!r}"


def az_name_problem(value: object) -> str:
    """Why `value` cannot name a configured AZ ("" when it can): the windows' name rule,
    and not `other`, which names the destinations outside the topology."""
    return name_problem(value, MAX_AZ_NAME) or ("is reserved" if value == OTHER_AZ else "")


_KNOWN_ADDRESSES: set[str] = set()  # canonical addresses already checked: hosts repeat in every window


def is_canonical_address(value: object) -> bool:
    """An IPv4 or IPv6 address in its canonical text form ("198.18.2.6", "2001:2:0:120::102")."""
    if type(value) is str and value in _KNOWN_ADDRESSES:
        return True
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ADDRESS_LEN:
        return False
    try:
        ok = str(ipaddress.ip_address(value)) == value
    except ValueError:
        return False
    if ok and len(_KNOWN_ADDRESSES) < 100_000:  # bounded, as _KNOWN_NAMES
        _KNOWN_ADDRESSES.add(value)
    return ok


def address_error(field: str, value: object) -> WindowError:
    """The error for a `field` whose `value` is not a canonical address."""
    return WindowError(f"{field}: {printable(value, 40)!r} is not an IPv4 or IPv6 address in canonical form "
                       "(for example 198.18.2.6 or 2001:2:0:120::102)")


def host_rtt_bucket(rtt_us: int) -> int:
    """The HOST_RTT_BUCKETS bucket of one RTT sample: the rule every producer of rtt_buckets follows."""
    bucket, bound = 0, HOST_RTT_FIRST_US
    while bucket < HOST_RTT_BUCKETS - 1 and rtt_us >= bound:
        bucket, bound = bucket + 1, bound * 4
    return bucket


# Which collector made a window: "bpf" (the probe) or "sockdiag" (the sampling fallback).
# Optional on the wire, "bpf" when absent; readers treat every source alike.
DEFAULT_SOURCE = "bpf"
MAX_SOURCE_LEN = 32


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

    def subtract(self, other: "TcpCounters") -> None:
        """Take back what merge(other) added (the window store, as a window leaves)."""
        self.conn_attempts -= other.conn_attempts
        self.conn_ok -= other.conn_ok
        self.conn_refused -= other.conn_refused
        self.conn_timeout -= other.conn_timeout
        self.syn_retrans -= other.syn_retrans
        self.retrans -= other.retrans
        self.rto -= other.rto
        self.rtt_us.subtract(other.rtt_us)
        self.connect_us.subtract(other.connect_us)


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


HOST_COUNTER_FIELDS = ("connects", "failures", "retrans", "rto")


@dataclass
class HostStats:
    """One destination address of one path: connects started, connects that failed
    (refused or timed out), retransmits, RTOs and a coarse RTT sketch."""

    src: str
    dst: str
    addr: str
    connects: int = 0
    failures: int = 0
    retrans: int = 0
    rto: int = 0
    rtt_buckets: list[int] = field(default_factory=lambda: [0] * HOST_RTT_BUCKETS)

    def to_json(self) -> dict:
        return {"src": self.src, "dst": self.dst, "addr": self.addr, "connects": self.connects,
                "failures": self.failures, "retrans": self.retrans, "rto": self.rto,
                "rtt_buckets": list(self.rtt_buckets)}


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
    hosts: list[HostStats] = field(default_factory=list)
    # Host summaries the agent could not keep (its table was full): counted, never silent.
    hosts_dropped: int = 0

    def to_json(self) -> dict:
        doc = {
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
        if self.hosts or self.hosts_dropped:  # optional: a window without host evidence omits it
            doc["hosts"] = [h.to_json() for h in self.hosts]
            doc["hosts_dropped"] = self.hosts_dropped
        return doc


def name_error(field: str, value: object, limit: int) -> WindowError:
    """The error for a `field` whose `value` is not a name of at most `limit` characters."""
    return WindowError(f"{field}: {printable(value, 40)!r} {name_problem(value, limit)}")


def _name(doc: Mapping, key: str, where: str, limit: int) -> str:
    value = doc.get(key)
    if not is_name(value, limit):
        raise name_error(f"{where}{key}", value, limit)
    return value


def _is_object(value: object) -> TypeGuard[Mapping[Any, Any]]:
    # json.loads gives dicts; the Mapping ABC check is the slow path for anything else.
    return type(value) is dict or isinstance(value, Mapping)


def _count_error(where: str, key: str, value: object) -> WindowError:
    return WindowError(f"{where}{key}: expected a count 0..2^32, got {printable(value, 40)}")


def _count(doc: Mapping, key: str, where: str) -> int:
    value = doc.get(key, 0)
    if type(value) is not int or not 0 <= value <= MAX_COUNT:  # type(): a bool is not a count
        raise _count_error(where, key, value)
    return value


def _seq(doc: Mapping) -> int:
    value = doc.get("seq", 0)
    if type(value) is not int or not 0 <= value <= MAX_SEQ:
        raise WindowError(f"seq: expected an integer 0..2^53, got {printable(value, 40)}")
    return value


def _number(doc: Mapping, key: str, where: str, lo: float, hi: float) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WindowError(f"{where}{key}: expected a number, got {printable(value, 40)}")
    if not lo <= value <= hi:  # before float(): a JSON integer past a float's range overflows it
        raise WindowError(f"{where}{key}: {printable(value, 40)} outside {lo}..{hi}")
    return float(value)


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
            fields[name] = _histogram(doc[name], prefix + name)
    return PathStats(_name(doc, "src", prefix, MAX_AZ_NAME), _name(doc, "dst", prefix, MAX_AZ_NAME), **fields)


def parse_host(doc: object, where: str) -> HostStats:
    if not _is_object(doc):
        raise WindowError(f"{where}: expected an object")
    prefix = where + "."
    counts = [_count(doc, name, prefix) for name in HOST_COUNTER_FIELDS]
    buckets = doc.get("rtt_buckets", [0] * HOST_RTT_BUCKETS)
    if not isinstance(buckets, list) or len(buckets) != HOST_RTT_BUCKETS:
        raise WindowError(f"{prefix}rtt_buckets: expected a list of {HOST_RTT_BUCKETS} counts")
    for n in buckets:
        if type(n) is not int or not 0 <= n <= MAX_COUNT:
            raise _count_error(prefix, "rtt_buckets", n)
    src, dst, addr = _name(doc, "src", prefix, MAX_AZ_NAME), _name(doc, "dst", prefix, MAX_AZ_NAME), doc.get("addr")
    if not isinstance(addr, str):  # its canonical form is check_window's, for both encodings
        raise address_error(f"{prefix}addr", addr)
    connects, failures, retrans, rto = counts
    return HostStats(src, dst, addr, connects, failures, retrans, rto, list(buckets))


def _hosts(doc: Mapping) -> list[HostStats]:
    hosts = doc.get("hosts", [])
    if not isinstance(hosts, list):
        raise WindowError("hosts: expected a list")
    if len(hosts) > MAX_HOSTS:
        raise WindowError(f"hosts: {len(hosts)} hosts exceed {MAX_HOSTS}")
    return [parse_host(h, f"hosts[{i}]") for i, h in enumerate(hosts)]


def _histogram(doc: object, where: str) -> Histogram:
    if _is_object(doc):
        scheme = doc.get("scheme", SCHEME)
        if scheme != SCHEME:
            raise WindowError(f"{where}.scheme: {printable(scheme, 40)!r} is not {SCHEME!r}")
    try:
        hist = Histogram.from_json(doc)
    except ValueError as exc:
        raise WindowError(f"{where}: {printable(str(exc), 120)}") from None
    _check_buckets(hist.counts, where)
    return hist


def _connect_relation_error(p: TcpCounters, prefix: str) -> WindowError:
    """The error for counters whose completions exceed their attempts by more than a window carries."""
    return WindowError(f"{prefix}conn_ok: ok {p.conn_ok} + refused {p.conn_refused} + timeout {p.conn_timeout} "
                       f"exceed conn_attempts {p.conn_attempts} by more than the {MAX_CONNECT_CARRY} connects "
                       "one window can carry over")


def _check_buckets(counts: Mapping[int, int], where: str) -> None:
    if len(counts) > NUM_BUCKETS:
        raise WindowError(f"{where}.counts: {len(counts)} buckets exceed {SCHEME}'s {NUM_BUCKETS}")
    # builtins over the whole dict, not a Python loop: this runs for every path of every window
    # (the keys are check_window's, for both encodings)
    if counts and max(counts.values()) > MAX_COUNT:
        raise WindowError(f"{where}.counts: a bucket's count {max(counts.values())} exceeds {MAX_COUNT}")


def _bucket_error(path: PathStats, prefix: str) -> WindowError:
    for name in HISTOGRAM_FIELDS:
        foreign = set(getattr(path, name).counts) - LOWER_BOUNDS
        if foreign:
            return WindowError(f"{prefix}{name}.counts: {min(foreign)} is not a {SCHEME} bucket "
                               f"(a lower bound of at most {MAX_BUCKET_LOWER} µs)")
    return WindowError(f"{prefix.rstrip('.')}: a histogram key is not a {SCHEME} bucket")


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
    if len(paths) > MAX_PATHS:
        raise WindowError(f"paths: {len(paths)} paths exceed {MAX_PATHS}")
    start = _number(doc, "start", "", 0, 1e11)
    end = _number(doc, "end", "", 0, 1e11)
    return check_window(Window(
        node=_name(doc, "node", "", MAX_NODE_NAME),
        az=_name(doc, "az", "", MAX_AZ_NAME),
        boot_id=_name(doc, "boot_id", "", MAX_BOOT_ID),
        seq=_seq(doc),
        start=start,
        end=end,
        util=Utilisation(
            cpu=_number(util, "cpu", "util.", 0.0, 1.0),
            mem=_number(util, "mem", "util.", 0.0, 1.0),
        ),
        paths=[parse_path(p, f"paths[{i}]") for i, p in enumerate(paths)],
        lost_events=_count(doc, "lost_events", ""),
        source=_source(doc),
        hosts=_hosts(doc),
        hosts_dropped=_count(doc, "hosts_dropped", ""),
    ))


def check_window(window: Window) -> Window:
    """The rules across a window's fields, shared by every encoding (JSON here, the compact
    form in windowcodec); per-field types, names and ranges are each decoder's job."""
    if window.end < window.start:
        raise WindowError(f"end: {window.end} is before start {window.start}")
    if window.end - window.start > MAX_WINDOW_S:
        raise WindowError(f"start: the window spans {window.end - window.start:.0f} s, at most {MAX_WINDOW_S:.0f} s")
    if len(window.paths) > MAX_PATHS:
        raise WindowError(f"paths: {len(window.paths)} paths exceed {MAX_PATHS}")
    # This runs for every path of every window: one pass, each rule tested in line (one C
    # call per histogram), and its message (the path's index in it) built only for a path
    # that breaks it.
    is_bucket_set = LOWER_BOUNDS.issuperset
    pairs: set[tuple[str, str]] = set()
    for i, p in enumerate(window.paths):
        if p.conn_ok + p.conn_refused + p.conn_timeout > p.conn_attempts + MAX_CONNECT_CARRY:
            raise _connect_relation_error(p, f"paths[{i}].")
        if not (is_bucket_set(p.rtt_us.counts) and is_bucket_set(p.connect_us.counts)):
            raise _bucket_error(p, f"paths[{i}].")
        pairs.add((p.src, p.dst))
    if len(pairs) != len(window.paths):
        raise WindowError("paths: a (src, dst) path appears twice")
    if window.hosts:
        _check_hosts(window.hosts)
    return window


def _check_hosts(hosts: list[HostStats]) -> None:
    if len(hosts) > MAX_HOSTS:
        raise WindowError(f"hosts: {len(hosts)} hosts exceed {MAX_HOSTS}")
    for i, h in enumerate(hosts):
        if not is_canonical_address(h.addr):
            raise address_error(f"hosts[{i}].addr", h.addr)
        if h.failures > h.connects + MAX_CONNECT_CARRY:
            raise WindowError(f"hosts[{i}].failures: {h.failures} exceed connects {h.connects} by more than "
                              f"the {MAX_CONNECT_CARRY} connects one window can carry over")
    if len({(h.src, h.dst, h.addr) for h in hosts}) != len(hosts):
        raise WindowError("hosts: a (src, dst, addr) host appears twice")


def _source(doc: Mapping) -> str:
    value = doc.get("source", DEFAULT_SOURCE)
    if not isinstance(value, str) or not value.isascii() or not value.isalnum() or len(value) > MAX_SOURCE_LEN:
        raise WindowError(f"source: expected a collector name like \"bpf\", got {printable(value, 40)!r}")
    return value
