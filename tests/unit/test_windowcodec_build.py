"""The controller's hot path: the compact decoder builds the same windows as the JSON
parser, histograms sum as Histogram's own methods do, and the store keeps most windows in
a queue rather than a heap yet takes them out in arrival order."""

from __future__ import annotations

import heapq
import random

import pytest

from azprobe.clients.transport import MAX_BODY_BYTES
from azprobe.contracts.sketch import Histogram
from azprobe.contracts.window import HostStats, PathStats, Utilisation, Window, WindowError, parse_window
from azprobe.contracts.windowcodec import COMPACT_TYPE, decode_page, encode_page
from azprobe.controller.collect import seqs_read
from azprobe.controller.window_store import WindowStore


def _window(seq: int = 1, node: str = "n1", end: float = 101.0) -> Window:
    rtt, connect = Histogram(), Histogram()
    for v in (900, 1000, 150_000):
        rtt.record(v)
    connect.record(2_000, 7)
    paths = [PathStats("az-a", dst, conn_attempts=10, conn_ok=8, conn_refused=1, conn_timeout=1, syn_retrans=2,
                       retrans=3, rto=1, rtt_us=rtt, connect_us=connect) for dst in ("az-a", "az-b")]
    hosts = [HostStats("az-a", "az-b", "198.18.0.1", 4, 1, 0, 0, [1, 2, 0, 0, 0, 0, 0, 1])]
    return Window(node=node, az="az-a", boot_id="boot", seq=seq, start=end - 1.0, end=end,
                  util=Utilisation(0.25, 0.5), paths=paths, lost_events=4, source="sockdiag", hosts=hosts,
                  hosts_dropped=2)


def _compact(*windows: Window) -> list[Window]:
    body = encode_page(windows[0].node, windows[0].az, windows[0].boot_id, list(windows), COMPACT_TYPE)
    return decode_page(body, COMPACT_TYPE, max_bytes=MAX_BODY_BYTES).parse_all()


def test_a_compact_window_is_the_windows_json_form():
    expected = parse_window(_window().to_json())
    (decoded,) = _compact(_window())
    assert decoded.to_json() == expected.to_json()
    assert type(decoded.util) is Utilisation and decoded.util == expected.util
    for got, want in zip(decoded.paths, expected.paths, strict=True):
        assert type(got) is PathStats
        assert type(got.rtt_us) is Histogram and got.rtt_us.counts == want.rtt_us.counts
        assert got.connect_us.counts == want.connect_us.counts
        assert got.rtt_us is not got.connect_us


def test_a_name_known_from_a_longer_field_still_has_its_own_bound():
    long_name = "n" * 100  # a valid node name, too long for an AZ
    assert _compact(_window(node=long_name))[0].node == long_name
    bad = _window(node=long_name)
    bad.az = long_name
    body = encode_page(long_name, "az-a", "boot", [bad], COMPACT_TYPE)
    with pytest.raises(WindowError, match="^az: "):
        decode_page(body, COMPACT_TYPE, max_bytes=MAX_BODY_BYTES).windows[0].parse()


def test_the_store_takes_windows_out_in_at_order_whatever_order_they_arrive_in():
    rng = random.Random(7)
    store, reference = WindowStore(5.0), []
    clock = 100.0
    for seq in range(1, 400):
        clock += rng.choice([0.0, 0.01, 0.3])
        at = clock - rng.choice([0.0, 0.0, 0.0, 0.5, 2.0])  # mostly in order; a backlog back-dated
        assert store.add(f"a{seq % 7}", _window(seq, node=f"n{seq % 7}", end=float(seq)), at)
        heapq.heappush(reference, (at, seq))
        if seq % 50 == 0:
            store.prune(clock)
            while reference and reference[0][0] < clock - 5.0:
                heapq.heappop(reference)
            assert len(store) == len(reference)
            assert [w.window.seq for w in store.items()] == [seq for _, seq in sorted(reference)]
            # each node's sums hold exactly its windows still stored
            held = {node: sum(w.window.paths[0].conn_attempts for w in store.items() if w.window.node == node)
                    for node in {w.window.node for w in store.items()}}
            assert {node: dsts["az-a"].conn_attempts for node, (_, dsts) in store.node_input().items()} == held
    assert sorted(w.seq for w in store.windows()) == sorted(seq for _, seq in reference)


@pytest.mark.parametrize("fresh, skipped, read", [
    ([], set(), []),
    ([5], set(), [5]),
    ([7, 5, 6], set(), [5, 6, 7]),
    ([5, 5], set(), [5, 5]),  # one seq twice in a page: count_gaps reads it as once
    ([9, 4], {6, 2}, [2, 4, 6, 9]),
    ([], {3, 1}, [1, 3]),
])
def test_seqs_read_are_the_stored_and_skipped_seqs_ascending(fresh, skipped, read):
    windows = [_window(seq) for seq in fresh]
    assert seqs_read(windows, skipped) == read
    assert [w.seq for w in windows] == sorted(fresh)


def test_counters_merge_and_subtract_their_histograms_as_histogram_does():
    """TcpCounters merges and subtracts its histograms with Histogram.merge and .subtract: the same counts."""
    rng = random.Random(3)
    bounds = sorted(Histogram(dict.fromkeys([0, 15, 16, 17, 1024, 2048, 150_000], 1)).counts)

    def hist() -> Histogram:
        return Histogram({b: rng.randint(1, 9) for b in rng.sample(bounds, rng.randint(0, len(bounds)))})

    paths = [PathStats("az-a", "az-b", conn_attempts=rng.randint(0, 99), rtt_us=hist(), connect_us=hist())
             for _ in range(20)]
    total, rtt, connect = PathStats("az-a", "az-b"), Histogram(), Histogram()
    for p in paths:
        total.merge(p)
        rtt.merge(p.rtt_us)
        connect.merge(p.connect_us)
    assert (total.rtt_us.counts, total.connect_us.counts) == (rtt.counts, connect.counts)
    assert total.conn_attempts == sum(p.conn_attempts for p in paths)
    for p in paths[:12]:
        total.subtract(p)
        rtt.subtract(p.rtt_us)
        connect.subtract(p.connect_us)
        assert (total.rtt_us.counts, total.connect_us.counts) == (rtt.counts, connect.counts)
    for p in paths[12:]:
        total.subtract(p)
    assert total.rtt_us.counts == total.connect_us.counts == {} and total.conn_attempts == 0
