"""The /v1/windows codec: both encodings decode to the same windows; Accept negotiation;
a bad window in a compact page is one garbage window named by its field, not a lost page."""

from __future__ import annotations

import re

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from azprobe.clients.transport import MAX_BODY_BYTES
from azprobe.contracts.sketch import Histogram, bucket_index, bucket_lower_bound
from azprobe.contracts.window import HOST_RTT_BUCKETS, PathStats, Utilisation, Window, WindowError, parse_window
from azprobe.contracts.windowcodec import (
    ACCEPT_BOTH,
    COMPACT_TYPE,
    JSON_TYPE,
    decode_page,
    encode_compact_page,
    encode_compact_window,
    encode_page,
    msgpack_depth_exceeds,
    negotiate,
)
from azprobe.controller.collect import Collector
from azprobe.controller.window_source import AgentTarget
from tests.controller_harness import topology


def _window(seq: int = 1, rtt: list[int] = (900, 1000, 150_000), **kw) -> Window:
    hist = Histogram()
    for v in rtt:
        hist.record(v)
    connect = Histogram()
    connect.record(2_000, 7)
    paths = [PathStats("az-a", dst, conn_attempts=10, conn_ok=8, conn_refused=1, conn_timeout=1, syn_retrans=2,
                       retrans=3, rto=1, rtt_us=hist, connect_us=connect) for dst in ("az-a", "az-b")]
    fields = dict(node="n1", az="az-a", boot_id="boot", seq=seq, start=100.0 + seq, end=101.0 + seq,
                  util=Utilisation(0.25, 0.5), paths=paths, lost_events=4)
    fields.update(kw)
    return Window(**fields)


def _decoded(body: bytes, media: str) -> list[dict]:
    return [w.to_json() for w in decode_page(body, media, max_bytes=MAX_BODY_BYTES).parse_all()]


def test_both_encodings_give_the_same_windows():
    windows = [_window(1), _window(2, rtt=[]), _window(3, paths=[])]
    compact = encode_page("n1", "az-a", "boot", windows, COMPACT_TYPE)
    json_body = encode_page("n1", "az-a", "boot", windows, JSON_TYPE)
    expected = [w.to_json() for w in windows]
    assert _decoded(compact, COMPACT_TYPE) == expected
    assert _decoded(json_body, "application/json; charset=utf-8") == expected
    assert len(compact) < len(json_body) / 2
    page = decode_page(compact, COMPACT_TYPE, max_bytes=MAX_BODY_BYTES)
    assert (page.node, page.az, page.boot_id) == ("n1", "az-a", "boot")
    assert [(p.seq, p.end) for p in page.windows] == [(1, 102.0), (2, 103.0), (3, 104.0)]


@settings(max_examples=50, deadline=None)
@given(values=st.lists(st.integers(0, 2**34 - 1), max_size=40), counts=st.integers(0, 2**32 - 2),
       cpu=st.floats(0, 1), start=st.floats(0, 1e10))
def test_compact_round_trip_is_exact(values, counts, cpu, start):
    window = _window(5, rtt=values, util=Utilisation(cpu, 1.0), start=start, end=start + 1.0)
    window.paths[0].conn_ok = counts
    window.paths[0].conn_attempts = counts + 2  # the window contract: completions were attempted
    body = encode_page("n", "az-a", "boot", [window], COMPACT_TYPE)
    assert _decoded(body, COMPACT_TYPE) == [window.to_json()]


def test_accept_negotiation_defaults_to_json():
    assert negotiate(None) == JSON_TYPE
    assert negotiate("*/*") == JSON_TYPE
    assert negotiate("application/json") == JSON_TYPE
    assert negotiate(ACCEPT_BOTH) == COMPACT_TYPE
    assert negotiate(f"{COMPACT_TYPE};q=0, application/json") == JSON_TYPE


def _raw(fields: list) -> bytes:
    return msgspec.msgpack.encode(fields)


GOOD = [1, "n", "az-a", "boot", 7, 1.0, 2.0, 0.5, 0.5, 0, [["az-a", "az-b", 3, 3, 0, 0, 0, 0, 0, {992: 3}, {}]]]


@pytest.mark.parametrize("change, field", [
    ((10, 0, 2), "paths[0].conn_attempts"),  # a negative count
    ((7,), "util.cpu"),  # 1.5 > 1
    ((1,), "node"),  # empty
    ((5,), "end"),  # start after end
    ((0,), "schema"),
    ((10, 0, 9), "paths[0].rtt_us"),  # a negative bucket count
])
def test_a_bad_compact_window_names_its_field(change, field):
    bad = [list(x) if isinstance(x, list) else x for x in GOOD]
    bad[10] = [list(bad[10][0])]
    values = {(10, 0, 2): -1, (7,): 1.5, (1,): "", (5,): 3.0, (0,): 2, (10, 0, 9): {992: -3}}
    if len(change) == 1:
        bad[change[0]] = values[change]
    else:
        bad[10][0][change[2]] = values[change]
    page = encode_compact_page("n", "az-a", "boot", [_raw(GOOD), _raw(bad)])
    decoded = decode_page(page, COMPACT_TYPE, max_bytes=MAX_BODY_BYTES)
    assert decoded.windows[0].parse().seq == 7
    with pytest.raises(WindowError, match="^" + re.escape(field) + ":"):
        decoded.windows[1].parse()


@pytest.mark.parametrize("paths, field", [
    ([["az-a", "az-b", 0, 100_000, 0, 0, 0, 0, 0, {}, {}]], "paths[0].conn_ok"),  # completions never attempted
    ([["az-a", "az-b", 3, 3, 0, 0, 0, 0, 0, {}, {}]] * 2, "paths"),  # one (src, dst) twice
    ([["az a", "az-b", 3, 3, 0, 0, 0, 0, 0, {}, {}]], "paths[0].src"),  # not a name
    ([["az-a", "az-b", 3, 3, 0, 0, 0, 0, 0, {2**34: 1}, {}]], "paths[0].rtt_us"),  # beyond loglin-16
    ([["az-a", "az-b", 3, 3, 0, 0, 0, 0, 0, {}, {1000: 3}]], "paths[0].connect_us.counts"),  # not a bound
])
def test_the_compact_form_keeps_the_window_contract(paths, field):
    """The same contract as JSON: names, buckets and the cross-field rules (check_window)."""
    bad = list(GOOD)
    bad[10] = paths
    with pytest.raises(WindowError, match="^" + re.escape(field)):
        page = encode_compact_page("n", "az-a", "boot", [_raw(bad)])
        decode_page(page, COMPACT_TYPE, max_bytes=MAX_BODY_BYTES).windows[0].parse()


@pytest.mark.parametrize("index, value, field", [
    (1, "node 1", "node"), (2, "az/a", "az"), (3, "boot\n", "boot_id"),
    (10, [["az-a", "az b", 3, 3, 0, 0, 0, 0, 0, {}, {}]], "paths[0].dst"),
    (12, [["az-a", "az-b", "198.18.0.1", 1, 0, 0, 0, [0] * HOST_RTT_BUCKETS],
          ["az-a", "az-b\x1b", "198.18.0.2", 1, 0, 0, 0, [0] * HOST_RTT_BUCKETS]], "hosts[1].dst"),
])
def test_a_compact_window_with_a_bad_name_is_refused_naming_the_field(index, value, field):
    bad = [*GOOD, "bpf", [], 0]
    bad[index] = value
    page = encode_compact_page("n", "az-a", "boot", [_raw(bad)])
    with pytest.raises(WindowError, match="^" + re.escape(field) + ": .* contains"):
        decode_page(page, COMPACT_TYPE, max_bytes=MAX_BODY_BYTES).windows[0].parse()


def test_collector_counts_a_bad_compact_window_as_garbage_and_keeps_the_page():
    collector = Collector(evaluation_window_s=1e9, pull_timeout_s=0.5, stale_after_s=3.0, clock=lambda: 1000.0,
                          topology=topology())
    collector.set_targets([AgentTarget("http://agent-1")])
    cursor = collector.cursors["http://agent-1"]
    bad = list(GOOD)
    bad[4], bad[7] = 8, 7.0  # seq 8 with cpu out of range
    good9 = list(GOOD)
    good9[4], good9[5], good9[6] = 9, 2.0, 3.0
    body = encode_compact_page("n", "az-a", "boot", [_raw(GOOD), _raw(bad), _raw(good9)])
    assert collector.ingest(cursor, decode_page(body, COMPACT_TYPE, max_bytes=MAX_BODY_BYTES), 1000.0) == 2
    assert collector.counters.windows_garbage == 1
    assert cursor.last_seq == 9  # stepped past the garbage window, not re-read


@pytest.mark.parametrize("body, media", [
    (b"\xc1", COMPACT_TYPE),  # not msgpack
    (msgspec.msgpack.encode(["n", "az-a", "", []]), COMPACT_TYPE),  # empty boot_id
    (b"{", JSON_TYPE),
    (b'{"boot_id": "b"}', JSON_TYPE),
    (b"<html>", "text/html"),
    # the header's names, under one rule in both encodings
    (b'{"boot_id": "b c", "windows": []}', JSON_TYPE),
    (b'{"boot_id": "' + b"b" * 129 + b'", "windows": []}', JSON_TYPE),
    (b'{"node": "' + b"n" * 254 + b'", "boot_id": "b", "windows": []}', JSON_TYPE),
    (msgspec.msgpack.encode(["n", "az a", "boot", []]), COMPACT_TYPE),
    (msgspec.msgpack.encode(["n" * 254, "az-a", "boot", []]), COMPACT_TYPE),
])
def test_an_unreadable_page_is_one_clear_error(body, media):
    with pytest.raises(WindowError, match="^response: "):
        decode_page(body, media, max_bytes=MAX_BODY_BYTES)


def test_compact_window_encoding_is_stable_for_caching():
    window = _window(3)
    assert encode_compact_window(window) == encode_compact_window(window)


# the scheme's lower bounds, computed here from its own arithmetic (sketch.LOWER_BOUNDS is the code's)
BOUNDS = {bucket_lower_bound(i) for i in range(bucket_index(2**34 - 1) + 1)}


@pytest.mark.parametrize("bad", [1000, 17_000, 2**33 + 1])
def test_only_loglin16_bucket_bounds_are_accepted_in_both_encodings(bad):
    """A histogram keyed by anything but the scheme's own lower bounds is garbage: readers
    merge by key, and 512 arbitrary keys per histogram cost the controller 40x the CPU."""
    assert bad not in BOUNDS
    window = _window(1)
    window.paths[1].connect_us = Histogram({**window.paths[1].connect_us.counts, bad: 1})
    compact = decode_page(encode_page("n1", "az-a", "boot", [window], COMPACT_TYPE), COMPACT_TYPE, max_bytes=MAX_BODY_BYTES)
    with pytest.raises(WindowError, match=re.escape(f"paths[1].connect_us.counts: {bad} is not a loglin-16 bucket")):
        compact.windows[0].parse()
    with pytest.raises(WindowError, match=re.escape(f"paths[1].connect_us.counts: {bad} is not a loglin-16 bucket")):
        parse_window(window.to_json())


def test_every_loglin16_bucket_bound_is_accepted_in_both_encodings():
    window = _window(1)
    from azprobe.contracts.sketch import LOWER_BOUNDS

    assert LOWER_BOUNDS == BOUNDS and len(BOUNDS) == 496 and max(BOUNDS) < 2**34
    window.paths[0].rtt_us = Histogram({lower: 1 for lower in BOUNDS})
    for media in (COMPACT_TYPE, JSON_TYPE):
        assert _decoded(encode_page("n1", "az-a", "boot", [window], media), media) == [window.to_json()]
def _depth(value: object) -> int:
    if isinstance(value, (list, tuple)):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((max(_depth(k), _depth(v)) for k, v in value.items()), default=0)
    return 0


_SCALARS = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False)
            | st.text(max_size=40) | st.text(min_size=256, max_size=300) | st.binary(max_size=300)
            | st.builds(msgspec.msgpack.Ext, st.integers(0, 127), st.binary(max_size=20)))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=20)
                       | st.dictionaries(st.integers(-2**63, 2**64 - 1) | st.text(max_size=5), inner, max_size=18),
                       max_leaves=60)


@settings(max_examples=150, deadline=None)
@given(value=_VALUES, bound=st.integers(0, 6))
def test_msgpack_depth_scan_is_the_values_depth(value, bound):
    """Every msgpack type and width (fix, 8/16/32 lengths, ext): the scan's verdict is
    the structure's depth against the bound."""
    assert msgpack_depth_exceeds(msgspec.msgpack.encode(value), bound) == (_depth(value) > bound)


@pytest.mark.parametrize("wide, depth", [
    (b"\xdd\x00\x00\x00\x01" * 3 + b"\x90", 4),  # array32 of one, three deep, around []
    (b"\xdf\x00\x00\x00\x01\x01" * 3 + b"\x01", 3),  # map32 of one pair, three deep
    (b"\x92\xdb\x00\x00\x00\x02\x91\x91\xc6\x00\x00\x00\x01\x91", 1),  # array headers as str32, bin32 data
    (b"\x91\xc9\x00\x00\x00\x02\x05\x91\x91", 1),  # ext32: length, type, then data
])
def test_msgpack_depth_scan_reads_the_32_bit_forms(wide, depth):
    assert not msgpack_depth_exceeds(wide, depth) and msgpack_depth_exceeds(wide, depth - 1)


_HEADER = b"\x94" + b"".join(msgspec.msgpack.encode(s) for s in ("n", "az-a", "boot"))


@pytest.mark.parametrize("body", [
    _HEADER + b"\x91" * 200_000 + b"\x90",  # the windows list nests
    _HEADER + b"\x92" + _raw(GOOD) + b"\xdc\x00\x01" * 100_000 + b"\x90",  # a second window nests
    _HEADER + b"\x91" + _raw(GOOD)[:-1] + b"\x81\x01" * 100_000 + b"\x01",  # maps inside a window's last field
])
def test_a_deeply_nested_compact_page_is_refused_whole(body):
    with pytest.raises(WindowError, match=r"^response: msgpack nested more than \d+ levels deep"):
        decode_page(body, COMPACT_TYPE, max_bytes=MAX_BODY_BYTES)


def test_a_deeply_nested_json_page_is_refused_whole():
    body = b'{"boot_id": "b", "windows": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}"
    with pytest.raises(WindowError, match=r"^response: JSON nested too deeply"):
        decode_page(body, JSON_TYPE, max_bytes=MAX_BODY_BYTES)


def test_a_page_over_the_size_bound_is_refused():
    body = encode_page("n1", "az-a", "boot", [_window(1)], COMPACT_TYPE)
    with pytest.raises(WindowError, match=f"^response: {len(body)} bytes exceed the limit of {len(body) - 1}"):
        decode_page(body, COMPACT_TYPE, max_bytes=len(body) - 1)
