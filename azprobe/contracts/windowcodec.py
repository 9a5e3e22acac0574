"""The /v1/windows response in two encodings: JSON (the default, for people and curl)
and a compact msgpack form the controller asks for with `Accept` (docs/scale.md).

Both decode to the same `WindowsPage` of the same `Window` objects, so everything past
decoding is encoding-blind. The compact form exists for the controller's hot path
(5,000 agents a second): positional arrays instead of objects keyed by field names, and
histograms as flat `[bucket index, count, ...]` arrays instead of objects keyed by
stringified lower bounds. msgspec decodes it straight into typed structs whose field
constraints do the per-field checks in C; the window-level checks are
`window.check_window`'s, shared with `parse_window`. A histogram is a msgpack map from
the bucket's lower bound (an integer, µs) to its count: msgspec builds exactly the dict
`Histogram` holds, in C, so no Python code runs per bucket (docs/scale.md has the figures
against index arrays).

Compact layout (msgpack, every struct an array in this field order):

    page   = [node, az, boot_id, [window, ...]]
    window = [schema, node, az, boot_id, seq, start, end, cpu, mem, lost_events, [path, ...], source,
              [host, ...], hosts_dropped]      (the last three optional, trailing)
    path   = [src, dst, conn_attempts, conn_ok, conn_refused, conn_timeout, syn_retrans,
              retrans, rto, rtt_us, connect_us]
    hist   = {lower bound µs: count, ...}   loglin-16 lower bounds, counts > 0
    host   = [src, dst, addr, connects, failures, retrans, rto, [rtt bucket count x 8]]

Windows are decoded one by one (the page holds them as raw msgpack), so one bad window
is one garbage window, as with JSON, not a lost page.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Callable

import msgspec

from azprobe.contracts import bounded_json
from azprobe.contracts.sketch import NUM_BUCKETS, Histogram
from azprobe.contracts.window import (
    DEFAULT_SOURCE,
    MAX_AZ_NAME,
    MAX_BOOT_ID,
    MAX_BUCKET_LOWER,
    HOST_RTT_BUCKETS,
    KNOWN_NAMES,
    MAX_ADDRESS_LEN,
    MAX_COUNT,
    MAX_HOSTS,
    MAX_NODE_NAME,
    MAX_SEQ,
    MAX_SOURCE_LEN,
    SCHEMA_VERSION,
    HostStats,
    PathStats,
    Utilisation,
    Window,
    WindowError,
    check_window,
    is_name,
    name_error,
    name_problem,
    parse_window,
    printable,
)

JSON_TYPE = "application/json"
COMPACT_TYPE = "application/vnd.azprobe.windows.v1+msgpack"
# What a client that reads both sends: the compact form first, JSON from an older agent.
ACCEPT_BOTH = f"{COMPACT_TYPE}, {JSON_TYPE};q=0.5"

# The window contract's per-field rules, checked by msgspec in C (window.py has the same
# rules for JSON); the cross-field ones are window.check_window's. The names' characters
# are window.is_name's, in _window_from_struct: every window repeats the same few names,
# and that check remembers them, where a pattern here ran a regex on each (1.9 us a window).
AzName = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_AZ_NAME)]
NodeName = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NODE_NAME)]
BootId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_BOOT_ID)]
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Seq = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]
LowerBound = Annotated[int, msgspec.Meta(ge=0, le=MAX_BUCKET_LOWER)]
Buckets = Annotated[dict[LowerBound, Count], msgspec.Meta(max_length=NUM_BUCKETS)]
Time = Annotated[float, msgspec.Meta(ge=0, le=1e11)]
Fraction = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Source = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_SOURCE_LEN, pattern="^[A-Za-z0-9]+$")]
# The address's characters here; its canonical form is window.check_window's, for both encodings.
Address = Annotated[str, msgspec.Meta(min_length=2, max_length=MAX_ADDRESS_LEN, pattern="^[0-9a-f:.]+$")]
RttBuckets = Annotated[list[Count], msgspec.Meta(min_length=HOST_RTT_BUCKETS, max_length=HOST_RTT_BUCKETS)]


class _Host(msgspec.Struct, array_like=True):
    src: AzName
    dst: AzName
    addr: Address
    connects: Count
    failures: Count
    retrans: Count
    rto: Count
    rtt_buckets: RttBuckets


Hosts = Annotated[list[_Host], msgspec.Meta(max_length=MAX_HOSTS)]


class _Path(msgspec.Struct, array_like=True):
    src: AzName
    dst: AzName
    conn_attempts: Count
    conn_ok: Count
    conn_refused: Count
    conn_timeout: Count
    syn_retrans: Count
    retrans: Count
    rto: Count
    rtt_us: Buckets
    connect_us: Buckets


class _Window(msgspec.Struct, array_like=True):
    schema: int
    node: NodeName
    az: AzName
    boot_id: BootId
    seq: Seq
    start: Time
    end: Time
    cpu: Fraction
    mem: Fraction
    lost_events: Count
    paths: list[_Path]
    source: Source = DEFAULT_SOURCE  # trailing and optional: an older agent's windows omit it
    hosts: Hosts = []  # trailing and optional, as source
    hosts_dropped: Count = 0


class _WindowHead(msgspec.Struct, array_like=True):
    """The leading fields of a window, untyped: decoding stops short of the paths."""

    schema: object = None
    node: object = None
    az: object = None
    boot_id: object = None
    seq: object = None
    start: object = None
    end: object = None


class _Page(msgspec.Struct, array_like=True):
    node: str  # the header's names: _page checks them, for both encodings
    az: str
    boot_id: str
    windows: list[msgspec.Raw]


class _TypedPage(msgspec.Struct, array_like=True):
    """A page whose every window is valid by type: one decode, and no value is skipped
    untyped (msgspec skips recursively, so only a depth-checked body may be skipped)."""

    node: str
    az: str
    boot_id: str
    windows: list[_Window]


_PAGE_DECODER = msgspec.msgpack.Decoder(_Page)
_TYPED_PAGE_DECODER = msgspec.msgpack.Decoder(_TypedPage)
_WINDOW_DECODER = msgspec.msgpack.Decoder(_Window)
_HEAD_DECODER = msgspec.msgpack.Decoder(_WindowHead)
_ENCODER = msgspec.msgpack.Encoder()


@dataclass
class PendingWindow:
    """One window of a page, not yet validated: `seq`/`end` when readable (for the
    collector's cheap duplicate and age filters), `parse()` validates it."""

    seq: int | None
    end: float | None
    parse: Callable[[], Window]


@dataclass
class WindowsPage:
    node: str
    az: str
    boot_id: str
    windows: list[PendingWindow]

    def parse_all(self) -> list[Window]:
        """Every window, validated; raises WindowError at the first bad one."""
        return [w.parse() for w in self.windows]


# --- encoding (agent side) -------------------------------------------------------------
def _buckets(hist: Histogram) -> dict[int, int]:
    return {lower: n for lower, n in sorted(hist.counts.items()) if n}


def _compact_window(w: Window) -> _Window:
    return _Window(w.schema, w.node, w.az, w.boot_id, w.seq, w.start, w.end, w.util.cpu, w.util.mem,
                   w.lost_events,
                   [_Path(p.src, p.dst, p.conn_attempts, p.conn_ok, p.conn_refused, p.conn_timeout,
                          p.syn_retrans, p.retrans, p.rto, _buckets(p.rtt_us), _buckets(p.connect_us))
                    for p in w.paths], w.source,
                   [_Host(h.src, h.dst, h.addr, h.connects, h.failures, h.retrans, h.rto, list(h.rtt_buckets))
                    for h in w.hosts], w.hosts_dropped)


def encode_compact_window(window: Window) -> bytes:
    """One window in the compact form (a sender may cache it: windows never change)."""
    return _ENCODER.encode(_compact_window(window))


def encode_page(node: str, az: str, boot_id: str, windows: list[Window], media_type: str) -> bytes:
    if media_type == COMPACT_TYPE:
        return encode_compact_page(node, az, boot_id, [encode_compact_window(w) for w in windows])
    return json.dumps({"node": node, "az": az, "boot_id": boot_id, "windows": [w.to_json() for w in windows]},
                      separators=(",", ":")).encode()


def encode_compact_page(node: str, az: str, boot_id: str, encoded_windows: list[bytes]) -> bytes:
    """A compact page from windows already encoded with encode_compact_window."""
    return _ENCODER.encode(_Page(node, az, boot_id, [msgspec.Raw(b) for b in encoded_windows]))


def negotiate(accept: str | None) -> str:
    """The media type to answer an `Accept` header with: compact only when asked for."""
    if accept and COMPACT_TYPE in accept:
        for part in accept.split(","):
            media, _, params = part.strip().partition(";")
            if media.strip() == COMPACT_TYPE:
                return JSON_TYPE if params.replace(" ", "") in ("q=0", "q=0.0") else COMPACT_TYPE
    return JSON_TYPE


# --- decoding (controller, top, demo) ---------------------------------------------------
_WINDOW_FIELDS = _Window.__struct_fields__
_PATH_FIELDS = _Path.__struct_fields__
_HOST_FIELDS = _Host.__struct_fields__


def _field_error(message: str) -> str:
    """msgspec's "Expected `int` >= 0 - at `$[10][0][2]`" as "paths[0].conn_attempts: ..."."""
    problem, _, at = message.rpartition(" - at `")
    if not problem:
        return f"window: {message}"
    indexes = [int(i) for i in re.findall(r"\[(\d+)\]", at)]
    where = "window"
    if indexes and indexes[0] < len(_WINDOW_FIELDS):
        where = _WINDOW_FIELDS[indexes[0]]
        if where == "paths" and len(indexes) > 1:
            where = f"paths[{indexes[1]}]"
            if len(indexes) > 2 and indexes[2] < len(_PATH_FIELDS):
                where += "." + _PATH_FIELDS[indexes[2]]
        elif where == "hosts" and len(indexes) > 1:
            where = f"hosts[{indexes[1]}]"
            if len(indexes) > 2 and indexes[2] < len(_HOST_FIELDS):
                where += "." + _HOST_FIELDS[indexes[2]]
        elif where in ("cpu", "mem"):
            where = "util." + where
    return f"{where}: {problem}"


def _window_from_compact(raw: bytes | msgspec.Raw) -> Window:
    try:
        c = _WINDOW_DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        raise WindowError(_field_error(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise WindowError(f"window: not msgpack ({exc})") from None
    return _window_from_struct(c)


_WINDOW_NAMES = (("node", MAX_NODE_NAME), ("az", MAX_AZ_NAME), ("boot_id", MAX_BOOT_ID))


_new = object.__new__  # an instance without its __init__: _path_stats, _window_from_struct


def _window_from_struct(c: _Window) -> Window:
    if c.schema != SCHEMA_VERSION:
        raise WindowError(f"schema: unsupported version {c.schema!r} (this azprobe reads {SCHEMA_VERSION})")
    # msgspec bounded each name's type and length, so a name is_name accepted before is one
    # here too: a set lookup, not a call, for the names every window repeats.
    known = KNOWN_NAMES
    if not (c.node in known and c.az in known and c.boot_id in known):
        for field, limit in _WINDOW_NAMES:
            value = getattr(c, field)
            if not is_name(value, limit):
                raise name_error(field, value, limit)
    paths = []
    for p in c.paths:
        if not ((p.src in known or is_name(p.src, MAX_AZ_NAME)) and (p.dst in known or is_name(p.dst, MAX_AZ_NAME))):
            raise _az_name_error(p, f"paths[{len(paths)}]")
        paths.append(_path_stats(p))
    hosts = []
    for h in c.hosts:
        if not ((h.src in known or is_name(h.src, MAX_AZ_NAME)) and (h.dst in known or is_name(h.dst, MAX_AZ_NAME))):
            raise _az_name_error(h, f"hosts[{len(hosts)}]")
        hosts.append(HostStats(h.src, h.dst, h.addr, h.connects, h.failures, h.retrans, h.rto, h.rtt_buckets))
    # Window(node=c.node, ...) spelled out, as in _path_stats: the attributes its __init__ sets.
    window = _new(Window)
    window.node = c.node
    window.az = c.az
    window.boot_id = c.boot_id
    window.seq = c.seq
    window.start = c.start
    window.end = c.end
    window.util = Utilisation(c.cpu, c.mem)
    window.paths = paths
    window.lost_events = c.lost_events
    window.schema = SCHEMA_VERSION
    window.source = c.source
    window.hosts = hosts
    window.hosts_dropped = c.hosts_dropped
    return check_window(window)


def _path_stats(p: _Path) -> PathStats:
    """PathStats(p.src, p.dst, conn_attempts=p.conn_attempts, ...), spelled out: the same
    attributes the dataclass's __init__ sets, in its order, from values the decoder checked.
    Its keyword call costs three times these stores, and the controller builds ~15,000 a
    second (tests/unit/test_windowcodec_build.py holds this in step with the fields)."""
    path = _new(PathStats)
    path.conn_attempts = p.conn_attempts
    path.conn_ok = p.conn_ok
    path.conn_refused = p.conn_refused
    path.conn_timeout = p.conn_timeout
    path.syn_retrans = p.syn_retrans
    path.retrans = p.retrans
    path.rto = p.rto
    path.rtt_us = rtt_us = _new(Histogram)  # Histogram's __init__ re-checks what the decoder did
    rtt_us.counts = p.rtt_us
    path.connect_us = connect_us = _new(Histogram)
    connect_us.counts = p.connect_us
    path.src = p.src
    path.dst = p.dst
    return path


def _az_name_error(item: _Path | _Host, where: str) -> WindowError:
    key = "dst" if is_name(item.src, MAX_AZ_NAME) else "src"
    return name_error(f"{where}.{key}", getattr(item, key), MAX_AZ_NAME)


def _typed_pending(c: _Window) -> PendingWindow:
    return PendingWindow(c.seq, c.end, lambda: _window_from_struct(c))


def _compact_pending(raw: msgspec.Raw) -> PendingWindow:
    """seq and end read from the window's head (a duplicate or a backlog window too old
    to count is never built); the full decode and checks when the reader asks."""
    try:
        head = _HEAD_DECODER.decode(raw)
        seq, end = head.seq, head.end
    except (msgspec.ValidationError, msgspec.DecodeError):
        seq = end = None
    return PendingWindow(seq if type(seq) is int and 0 <= seq <= MAX_SEQ else None,
                         float(end) if type(end) in (int, float) and end == end else None,
                         lambda: _window_from_compact(raw))


def _json_seq(doc: object) -> int | None:
    value = doc.get("seq") if isinstance(doc, dict) else None
    return value if type(value) is int and 0 <= value <= MAX_SEQ else None


def _json_number(doc: object, key: str) -> float | None:
    value = doc.get(key) if isinstance(doc, dict) else None
    if type(value) not in (int, float) or value != value or value in (float("inf"), float("-inf")):
        return None
    try:
        return float(value)
    except OverflowError:  # JSON integers have no bound; one past a float's is no time
        return None


def _page(node: object, az: object, boot_id: object, windows: list[PendingWindow]) -> WindowsPage:
    """A page from its header, one rule for both encodings: boot_id is a name (every
    window must carry the same), node and az are names or absent (""; a non-string JSON
    value counts as absent). A cursor keeps these, so none is longer than a name."""
    problem = name_problem(boot_id, MAX_BOOT_ID)
    if problem:
        raise WindowError(f"response: boot_id {printable(boot_id, 40)!r} {problem}")
    header = {}
    for key, value, limit in (("node", node, MAX_NODE_NAME), ("az", az, MAX_AZ_NAME)):
        value = value if isinstance(value, str) else ""
        problem = name_problem(value, limit) if value else ""
        if problem:
            raise WindowError(f"response: {key} {printable(value, 40)!r} {problem}")
        header[key] = value
    return WindowsPage(header["node"], header["az"], boot_id, windows)


def page_from_doc(doc: object) -> WindowsPage:
    """A page from a decoded JSON document; windows are validated lazily (parse_window)."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("windows"), list):
        raise WindowError("response: expected {node, az, boot_id, windows: [...]}")
    return _page(doc.get("node"), doc.get("az"), doc.get("boot_id"),
                 [PendingWindow(_json_seq(raw), _json_number(raw, "end"),
                                (lambda raw=raw: parse_window(raw))) for raw in doc["windows"]])


# msgpack type bytes -> bytes to skip after them (fixed-size values), and the width of the
# length that follows (strings, binaries, extensions) or the count (arrays, maps).
_MSGPACK_FIXED = {0xc0: 0, 0xc2: 0, 0xc3: 0, 0xca: 4, 0xcb: 8, 0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8,
                  0xd0: 1, 0xd1: 2, 0xd2: 4, 0xd3: 8, 0xd4: 2, 0xd5: 3, 0xd6: 5, 0xd7: 9, 0xd8: 17}
_MSGPACK_SIZED = {0xc4: 1, 0xc5: 2, 0xc6: 4, 0xd9: 1, 0xda: 2, 0xdb: 4}  # bin, str
_MSGPACK_EXT = {0xc7: 1, 0xc8: 2, 0xc9: 4}  # length, then one type byte
_MSGPACK_ARRAY = {0xdc: 2, 0xdd: 4}
_MSGPACK_MAP = {0xde: 2, 0xdf: 4}


def msgpack_depth_exceeds(data: bytes, max_depth: int) -> bool:
    """Whether msgpack `data` nests arrays and maps more than max_depth deep. One pass
    over the value headers, without recursing; a truncated body ends the pass (the
    decoder refuses it). Only run on a page the typed decoder refused."""
    pos, end = 0, len(data)
    remaining, stack = 1, []  # values left at this level; those of the levels above
    while True:
        if remaining == 0:
            if not stack:
                return False
            remaining = stack.pop()
            continue
        if pos >= end:
            return False
        b = data[pos]
        pos += 1
        remaining -= 1
        if b <= 0x7f or b >= 0xe0:
            continue
        if b <= 0x8f:
            count = 2 * (b & 0x0f)
        elif b <= 0x9f:
            count = b & 0x0f
        elif b <= 0xbf:
            pos += b & 0x1f
            continue
        elif b in _MSGPACK_FIXED:
            pos += _MSGPACK_FIXED[b]
            continue
        elif b in _MSGPACK_SIZED or b in _MSGPACK_EXT:
            width = _MSGPACK_SIZED.get(b) or _MSGPACK_EXT[b]
            pos += width + int.from_bytes(data[pos:pos + width], "big") + (b in _MSGPACK_EXT)
            continue
        elif b in _MSGPACK_ARRAY or b in _MSGPACK_MAP:
            width = _MSGPACK_ARRAY.get(b) or _MSGPACK_MAP[b]
            count = int.from_bytes(data[pos:pos + width], "big") * (2 if b in _MSGPACK_MAP else 1)
            pos += width
        else:  # 0xc1, never used
            return False
        if len(stack) + 1 > max_depth:
            return True
        if count:
            stack.append(remaining)
            remaining = count


def decode_page(body: bytes, content_type: str | None, *, max_bytes: int) -> WindowsPage:
    """A /v1/windows response body of at most max_bytes in either encoding; raises
    WindowError when the page itself (not one of its windows) is unreadable."""
    media = (content_type or JSON_TYPE).split(";", 1)[0].strip().lower()
    if len(body) > max_bytes:
        raise WindowError(f"response: {len(body)} bytes exceed the limit of {max_bytes}")
    if media == COMPACT_TYPE:
        try:
            typed = _TYPED_PAGE_DECODER.decode(body)
        except (msgspec.ValidationError, msgspec.DecodeError):
            pass  # a bad window or a bad page: window by window below tells which
        else:
            return _page(typed.node, typed.az, typed.boot_id, [_typed_pending(c) for c in typed.windows])
        if msgpack_depth_exceeds(body, bounded_json.MAX_DEPTH):
            raise WindowError(f"response: msgpack nested more than {bounded_json.MAX_DEPTH} levels deep")
        try:
            page = _PAGE_DECODER.decode(body)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise WindowError(f"response: {exc}") from None
        return _page(page.node, page.az, page.boot_id, [_compact_pending(r) for r in page.windows])
    if media != JSON_TYPE and not media.endswith("+json"):
        raise WindowError(f"response: unexpected Content-Type {media[:60]!r}")
    try:
        doc = bounded_json.loads(body, max_bytes=max_bytes, what="response")
    except bounded_json.JsonRefused as exc:
        raise WindowError(str(exc)) from None
    return page_from_doc(doc)
