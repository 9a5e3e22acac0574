"""What the decision reads of the evaluation window: a node's windows summed (counters
added, percentiles from merged histograms), the zones seen and their utilisation per AZ,
per-source zones, `other` excluded, the spike detector's input."""

from __future__ import annotations

import pytest

from azprobe.contracts.sketch import Histogram
from azprobe.contracts.window import PathStats, Utilisation, Window, parse_window
from azprobe.contracts.stats import ZoneStats
from azprobe.controller.merge import Aggregate, NodeSeen, UtilWeights, failures_by_zone, zones_seen
from azprobe.controller.window_store import WindowStore

NOW = 1_764_470_000.0


def hist(value_us: int, n: int) -> Histogram:
    h = Histogram()
    h.record(value_us, n)
    return h


def path(src: str, dst: str, *, ok=0, refused=0, timeout=0, attempts=None, syn=0, rto=0,
         rtt: Histogram | None = None, connect: Histogram | None = None) -> PathStats:
    return PathStats(src=src, dst=dst, conn_attempts=attempts if attempts is not None else ok + refused + timeout,
                     conn_ok=ok, conn_refused=refused, conn_timeout=timeout, syn_retrans=syn, rto=rto,
                     rtt_us=rtt or Histogram(), connect_us=connect or Histogram())


def window(node: str, az: str, end: float, paths: list[PathStats], cpu=0.2, mem=0.6, seq=1) -> Window:
    return Window(node=node, az=az, boot_id="b", seq=seq, start=end - 1, end=end,
                  util=Utilisation(cpu=cpu, mem=mem), paths=paths)


def summed(windows: list[Window], dst: str = "az-b") -> Aggregate:
    """One node's windows summed towards dst, as the window store sums them."""
    store = WindowStore(horizon_s=1e9)
    for w in windows:
        assert store.add(w.node, w, at=w.end)
    (_az, dsts), = store.node_input().values()
    return dsts[dst]


def stats(windows: list[Window], dst: str = "az-b") -> ZoneStats:
    return summed(windows, dst).zone_stats(None)


def test_success_rate_ignores_pending_attempts():
    w = window("n1", "az-a", NOW, [path("az-a", "az-b", ok=90, refused=5, timeout=5, attempts=130)])
    assert stats([w]).success == pytest.approx(0.90)  # 30 attempts still pending are not failures


def test_counters_add_up_across_windows():
    ws = [window("n1", "az-a", NOW - 1, [path("az-a", "az-b", ok=10, syn=1)], seq=1),
          window("n1", "az-a", NOW, [path("az-a", "az-b", ok=10, timeout=10, syn=3, rto=2)], seq=2)]
    agg = summed(ws)
    assert (agg.conn_ok, agg.conn_timeout, agg.syn_retrans, agg.rto) == (20, 10, 4, 2)
    z = agg.zone_stats(None)
    assert z.success == pytest.approx(20 / 30)
    assert z.syn_retrans_per_conn == pytest.approx(4 / 30)
    assert z.rto_per_conn == pytest.approx(2 / 30)
    assert z.samples == 30


def test_p95_comes_from_the_merged_histogram_not_an_average():
    # Window 1: 95 fast samples (10 ms); window 2: 5 slow ones (500 ms). Merged P95 is near
    # 10 ms (95 of 100 samples are fast); averaging the two windows' P95s would say ~255 ms.
    ws = [window("n1", "az-a", NOW - 1, [path("az-a", "az-b", rtt=hist(10_000, 95))], seq=1),
          window("n1", "az-a", NOW, [path("az-a", "az-b", rtt=hist(500_000, 5))], seq=2)]
    z = stats(ws)
    assert z.p95_ms is not None and 9.5 <= z.p95_ms <= 11.0
    ws[1] = window("n1", "az-a", NOW, [path("az-a", "az-b", rtt=hist(500_000, 6))], seq=2)
    assert stats(ws).p95_ms >= 450  # now 6 % are slow


def test_connect_latency_p95_on_the_aggregate():
    agg = summed([window("n1", "az-a", NOW, [path("az-a", "az-b", ok=100, connect=hist(2_000, 100))])])
    assert agg.p95_connect_ms == pytest.approx(2.0, rel=0.07)
    assert agg.p95_rtt_ms is None


def test_other_destination_is_no_zone():
    w = window("n1", "az-a", NOW, [path("az-a", "other", timeout=100), path("az-a", "az-b", ok=5)])
    store = WindowStore(horizon_s=1e9)
    store.add("n1", w, at=NOW)
    (_az, dsts), = store.node_input().values()
    assert set(dsts) == {"az-b"}
    seen = store.zones_seen()
    assert "other" not in seen.util and seen.by_source == {"az-a": ("az-b",)}
    assert failures_by_zone([w]) == {"az-b": 0}


def test_util_is_weighted_and_averaged_per_node_then_the_median_per_az():
    nodes = [NodeSeen("az-b", [], cpu=0.2, mem=0.6),  # n1's mean over its windows
             NodeSeen("az-b", [], cpu=1.0, mem=1.0),
             NodeSeen("az-a", ["az-b", "az-c"], cpu=0.0, mem=0.0)]
    seen = zones_seen(nodes)
    assert seen.util["az-b"] == pytest.approx((0.4 + 1.0) / 2)  # nodes count once each
    assert seen.util["az-c"] is None  # no agent runs in az-c
    assert seen.util["az-a"] == pytest.approx(0.0)  # agents there, no traffic to it
    assert seen.zones == ("az-a", "az-b", "az-c")
    assert zones_seen(nodes, UtilWeights(cpu=1.0, mem=0.0)).util["az-b"] == pytest.approx((0.2 + 1.0) / 2)


def test_a_chatty_node_counts_once_in_its_az_utilisation():
    store = WindowStore(horizon_s=1e9)
    for seq in range(3):  # n1: three windows
        store.add("n1", window("n1", "az-b", NOW - seq, [], cpu=0.2, mem=0.6, seq=seq), at=NOW - seq)
    store.add("n2", window("n2", "az-b", NOW, [], cpu=1.0, mem=1.0), at=NOW)
    assert store.zones_seen().util["az-b"] == pytest.approx((0.4 + 1.0) / 2)


def test_one_node_reporting_itself_at_full_load_does_not_move_its_az_utilisation():
    honest = [NodeSeen("az-b", [], cpu=0.3, mem=0.3 + i / 100) for i in range(4)]
    liar = NodeSeen("az-b", [], cpu=1.0, mem=1.0)
    assert zones_seen(honest).util["az-b"] == pytest.approx(0.3075)
    assert zones_seen([*honest, liar]).util["az-b"] == pytest.approx(0.31)
    # of three nodes at 0.6, one liar would take a mean to 0.73, past the default util_knee 0.7
    busy = [NodeSeen("az-b", [], cpu=0.6, mem=0.6)] * 2
    assert zones_seen([*busy, liar]).util["az-b"] == pytest.approx(0.6)


def test_by_source_names_the_destinations_each_source_az_reports_on():
    seen = zones_seen([NodeSeen("az-a", ["az-b"], 0.1, 0.1), NodeSeen("az-c", ["az-b", "az-a"], 0.1, 0.1),
                       NodeSeen("az-d", [], 0.1, 0.1)])
    assert seen.by_source == {"az-a": ("az-b",), "az-c": ("az-a", "az-b")}  # az-d reports on nothing
    assert seen.zones == ("az-a", "az-b", "az-c", "az-d")


def test_nothing_seen_gives_no_zone():
    seen = zones_seen([])
    assert seen.util == {} and seen.by_source == {}


def test_no_completed_connects_means_unknown_success_and_zero_rates():
    z = stats([window("n1", "az-a", NOW, [path("az-a", "az-b", attempts=3, rtt=hist(5_000, 50))])])
    assert z.success is None
    assert z.samples == 50
    assert z.is_evidence(20)


def test_min_samples_decides_evidence():
    z = stats([window("n1", "az-a", NOW, [path("az-a", "az-b", ok=19)])])
    assert not z.is_evidence(20) and z.is_evidence(19)


def test_failures_by_zone_counts_refused_and_timeouts():
    ws = [window("n1", "az-a", NOW, [path("az-a", "az-b", ok=5, refused=2, timeout=3)]),
          window("n2", "az-c", NOW, [path("az-c", "az-b", timeout=1), path("az-c", "az-a", ok=1)])]
    assert failures_by_zone(ws) == {"az-b": 6, "az-a": 0}


def test_sums_parsed_window_documents():
    doc = {"schema": 1, "node": "n1", "az": "az-a", "boot_id": "x", "seq": 3, "start": NOW - 1, "end": NOW,
           "util": {"cpu": 0.5, "mem": 0.5},
           "paths": [{"src": "az-a", "dst": "az-b", "conn_attempts": 4, "conn_ok": 4,
                      "rtt_us": {"scheme": "loglin-16", "counts": {"12288": 40}}}]}
    z = stats([parse_window(doc)])
    assert z.success == 1.0 and z.samples == 44
    assert 12.0 <= z.p95_ms <= 13.0
