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

The compact layout, and its per-field rules, are compact_layout.py's structs.

Windows are decoded one by one (the page holds them as raw msgpack), so one bad window
is one garbage window, as with JSON, not a lost page.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Callable

import msgspec

from azprobe.contracts import bounded_json
from azprobe.contracts.compact_layout import (
    ENCODER,
    HEAD_DECODER,
    PAGE_DECODER,
    TYPED_PAGE_DECODER,
    WINDOW_DECODER,
    CompactHost,
    CompactPage,
    CompactPath,
    CompactWindow,
)
from azprobe.contracts.sketch import Histogram
from azprobe.contracts.window import (
    KNOWN_NAMES,
    MAX_AZ_NAME,
    MAX_BOOT_ID,
    MAX_NODE_NAME,
    MAX_SEQ,
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


def _compact_window(w: Window) -> CompactWindow:
    paths = [CompactPath(p.src, p.dst, p.conn_attempts, p.conn_ok, p.conn_refused, p.conn_timeout, p.syn_retrans,
                         p.retrans, p.rto, _buckets(p.rtt_us), _buckets(p.connect_us)) for p in w.paths]
    hosts = [CompactHost(h.src, h.dst, h.addr, h.connects, h.failures, h.retrans, h.rto, list(h.rtt_buckets))
             for h in w.hosts]
    return CompactWindow(w.schema, w.node, w.az, w.boot_id, w.seq, w.start, w.end, w.util.cpu, w.util.mem,
                         w.lost_events, paths, w.source, hosts, w.hosts_dropped)


def encode_compact_window(window: Window) -> bytes:
    """One window in the compact form (a sender may cache it: windows never change)."""
    return ENCODER.encode(_compact_window(window))


def encode_page(node: str, az: str, boot_id: str, windows: list[Window], media_type: str) -> bytes:
    if media_type == COMPACT_TYPE:
        return encode_compact_page(node, az, boot_id, [encode_compact_window(w) for w in windows])
    return json.dumps({"node": node, "az": az, "boot_id": boot_id, "windows": [w.to_json() for w in windows]},
                      separators=(",", ":")).encode()


def encode_compact_page(node: str, az: str, boot_id: str, encoded_windows: list[bytes]) -> bytes:
    """A compact page from windows already encoded with encode_compact_window."""
    return ENCODER.encode(CompactPage(node, az, boot_id, [msgspec.Raw(b) for b in encoded_windows]))


def negotiate(accept: str | None) -> str:
    """The media type to answer an `Accept` header with: compact only when asked for."""
    if accept and COMPACT_TYPE in accept:
        for part in accept.split(","):
            media, _, params = part.strip().partition(";")
            if media.strip() == COMPACT_TYPE:
                return JSON_TYPE if params.replace(" ", "") in ("q=0", "q=0.0") else COMPACT_TYPE
    return JSON_TYPE


# --- decoding (controller, top, demo) ---------------------------------------------------
_WINDOW_FIELDS = CompactWindow.__struct_fields__
_PATH_FIELDS = CompactPath.__struct_fields__
_HOST_FIELDS = CompactHost.__struct_fields__


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
        c = WINDOW_DECODER.decode(raw)
    except msgspec.ValidationError as invalid:
        raise WindowError(_field_error(str(invalid))) from None
    except msgspec.DecodeError as unreadable:
        raise WindowError(f"window: not msgpack ({unreadable})") from None
    return _window_from_struct(c)


_WINDOW_NAMES = (("node", MAX_NODE_NAME), ("az", MAX_AZ_NAME), ("boot_id", MAX_BOOT_ID))


def _window_from_struct(c: CompactWindow) -> Window:
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
    paths: list[PathStats] = []
    for p in c.paths:
        if not ((p.src in known or is_name(p.src, MAX_AZ_NAME)) and (p.dst in known or is_name(p.dst, MAX_AZ_NAME))):
            raise _az_name_error(p, f"paths[{len(paths)}]")
        paths.append(_path_stats(p))
    hosts: list[HostStats] = []
    for h in c.hosts:
        if not ((h.src in known or is_name(h.src, MAX_AZ_NAME)) and (h.dst in known or is_name(h.dst, MAX_AZ_NAME))):
            raise _az_name_error(h, f"hosts[{len(hosts)}]")
        hosts.append(HostStats(h.src, h.dst, h.addr, h.connects, h.failures, h.retrans, h.rto, h.rtt_buckets))
    window = Window(c.node, c.az, c.boot_id, c.seq, c.start, c.end, Utilisation(c.cpu, c.mem), paths,
                    c.lost_events, SCHEMA_VERSION, c.source, hosts, c.hosts_dropped)
    return check_window(window)


def _path_stats(p: CompactPath) -> PathStats:
    return PathStats(p.src, p.dst, conn_attempts=p.conn_attempts, conn_ok=p.conn_ok, conn_refused=p.conn_refused,
                     conn_timeout=p.conn_timeout, syn_retrans=p.syn_retrans, retrans=p.retrans, rto=p.rto,
                     rtt_us=Histogram.of_checked(p.rtt_us), connect_us=Histogram.of_checked(p.connect_us))


def _az_name_error(item: CompactPath | CompactHost, where: str) -> WindowError:
    key = "dst" if is_name(item.src, MAX_AZ_NAME) else "src"
    return name_error(f"{where}.{key}", getattr(item, key), MAX_AZ_NAME)


def _typed_pending(c: CompactWindow) -> PendingWindow:
    return PendingWindow(c.seq, c.end, lambda: _window_from_struct(c))


def _compact_pending(raw: msgspec.Raw) -> PendingWindow:
    """seq and end read from the window's head (a duplicate or a backlog window too old
    to count is never built); the full decode and checks when the reader asks."""
    try:
        head = HEAD_DECODER.decode(raw)
        seq, end = head.seq, head.end
    except (msgspec.ValidationError, msgspec.DecodeError):
        seq = end = None
    return PendingWindow(seq if type(seq) is int and 0 <= seq <= MAX_SEQ else None,
                         float(end) if (type(end) is int or type(end) is float) and end == end else None,
                         lambda: _window_from_compact(raw))


def _json_seq(doc: object) -> int | None:
    value = doc.get("seq") if isinstance(doc, dict) else None
    return value if type(value) is int and 0 <= value <= MAX_SEQ else None


def _json_number(doc: object, key: str) -> float | None:
    value = doc.get(key) if isinstance(doc, dict) else None
    if not (type(value) is int or type(value) is float) or value != value or value in (float("inf"), float("-inf")):
        return None
    try:
        return float(value)
    except OverflowError:  # JSON integers have no bound; one past a float's is no time
        return None


def _page(node: object, az: object, boot_id: object, windows: list[PendingWindow]) -> WindowsPage:
    """A page from its header, one rule for both encodings: boot_id is a name (every
    window must carry the same), node and az are names or absent (""; a non-string JSON
    value counts as absent). A cursor keeps these, so none is longer than a name."""
    if not is_name(boot_id, MAX_BOOT_ID):
        raise WindowError(f"response: boot_id {printable(boot_id, 40)!r} {name_problem(boot_id, MAX_BOOT_ID)}")
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
                                partial(parse_window, raw)) for raw in doc["windows"]])


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
    remaining = 1  # values left at this level
    stack: list[int] = []  # those of the levels above
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
            typed = TYPED_PAGE_DECODER.decode(body)
        except (msgspec.ValidationError, msgspec.DecodeError):
            pass  # a bad window or a bad page: window by window below tells which
        else:
            return _page(typed.node, typed.az, typed.boot_id, [_typed_pending(c) for c in typed.windows])
        if msgpack_depth_exceeds(body, bounded_json.MAX_DEPTH):
            raise WindowError(f"response: msgpack nested more than {bounded_json.MAX_DEPTH} levels deep")
        try:
            page = PAGE_DECODER.decode(body)
        except (msgspec.ValidationError, msgspec.DecodeError) as unreadable:
            raise WindowError(f"response: {unreadable}") from None
        return _page(page.node, page.az, page.boot_id, [_compact_pending(r) for r in page.windows])
    if media != JSON_TYPE and not media.endswith("+json"):
        raise WindowError(f"response: unexpected Content-Type {media[:60]!r}")
    try:
        doc = bounded_json.loads(body, max_bytes=max_bytes, what="response")
    except bounded_json.JsonRefused as refused:
        raise WindowError(str(refused)) from None
    return page_from_doc(doc)
