"""Merging windows: counters summed, percentiles from merged histograms, the evaluation
window, utilisation per AZ, per-source views, `other` excluded, spike-detector input."""

from __future__ import annotations

import pytest

from azprobe.contracts.sketch import Histogram
from azprobe.contracts.window import PathStats, Utilisation, Window, parse_window
from azprobe.controller.merge import UtilWeights, failures_by_zone, merge_windows

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


def test_success_rate_ignores_pending_attempts():
    w = window("n1", "az-a", NOW, [path("az-a", "az-b", ok=90, refused=5, timeout=5, attempts=130)])
    z = merge_windows([w], now=NOW).zones["az-b"]
    assert z.success == pytest.approx(0.90)  # 30 attempts still pending are not failures


def test_counters_add_up_across_agents_and_windows():
    ws = [window("n1", "az-a", NOW - 1, [path("az-a", "az-b", ok=10, syn=1)]),
          window("n1", "az-a", NOW, [path("az-a", "az-b", ok=10, timeout=10, syn=3, rto=2)]),
          window("n2", "az-c", NOW, [path("az-c", "az-b", ok=20)])]
    view = merge_windows(ws, now=NOW)
    agg_ab = view.paths[("az-a", "az-b")]
    assert (agg_ab.conn_ok, agg_ab.conn_timeout, agg_ab.syn_retrans, agg_ab.rto) == (20, 10, 4, 2)
    z = view.zones["az-b"]
    assert z.success == pytest.approx(40 / 50)
    assert z.syn_retrans_per_conn == pytest.approx(4 / 50)
    assert z.rto_per_conn == pytest.approx(2 / 50)
    assert z.samples == 50


def test_p95_comes_from_the_merged_histogram_not_an_average():
    # Agent 1: 95 fast samples (10 ms); agent 2: 5 slow ones (500 ms). Merged P95 is near
    # 10 ms (95 of 100 samples are fast); averaging the two agents' P95s would say ~255 ms.
    ws = [window("n1", "az-a", NOW, [path("az-a", "az-b", rtt=hist(10_000, 95))]),
          window("n2", "az-a", NOW, [path("az-a", "az-b", rtt=hist(500_000, 5))])]
    z = merge_windows(ws, now=NOW).zones["az-b"]
    assert z.p95_ms is not None and 9.5 <= z.p95_ms <= 11.0
    ws[1] = window("n2", "az-a", NOW, [path("az-a", "az-b", rtt=hist(500_000, 6))])
    assert merge_windows(ws, now=NOW).zones["az-b"].p95_ms >= 450  # now 6 % are slow


def test_connect_latency_p95_on_the_path_aggregate():
    w = window("n1", "az-a", NOW, [path("az-a", "az-b", ok=100, connect=hist(2_000, 100))])
    agg = merge_windows([w], now=NOW).paths[("az-a", "az-b")]
    assert agg.p95_connect_ms == pytest.approx(2.0, rel=0.07)
    assert agg.p95_rtt_ms is None


def test_evaluation_window_bounds():
    ws = [window("n1", "az-a", NOW - 5.0, [path("az-a", "az-b", ok=1000)]),  # just outside
          window("n1", "az-a", NOW - 4.9, [path("az-a", "az-b", ok=10)]),
          window("n1", "az-a", NOW + 1.0, [path("az-a", "az-b", ok=7)])]  # from the future
    view = merge_windows(ws, now=NOW, evaluation_window_s=5.0)
    assert view.windows_used == 1
    assert view.zones["az-b"].samples == 10


def test_other_destination_is_excluded_from_zones():
    w = window("n1", "az-a", NOW, [path("az-a", "other", timeout=100), path("az-a", "az-b", ok=5)])
    view = merge_windows([w], now=NOW)
    assert "other" not in view.zones
    assert "other" not in view.by_source["az-a"]
    assert view.paths[("az-a", "other")].conn_timeout == 100  # still visible per path
    assert failures_by_zone([w]) == {"az-b": 0}


def test_util_is_weighted_and_averaged_per_node_then_per_az():
    ws = [window("n1", "az-b", NOW - 1, [], cpu=0.2, mem=0.6),
          window("n1", "az-b", NOW - 2, [], cpu=0.2, mem=0.6),
          window("n1", "az-b", NOW - 3, [], cpu=0.2, mem=0.6),  # chatty node: 3 windows
          window("n2", "az-b", NOW, [], cpu=1.0, mem=1.0),
          window("n3", "az-a", NOW, [path("az-a", "az-b", ok=5), path("az-a", "az-c", ok=5)], cpu=0.0, mem=0.0)]
    view = merge_windows(ws, now=NOW)
    assert view.zones["az-b"].util == pytest.approx((0.4 + 1.0) / 2)  # nodes count once each
    assert view.zones["az-c"].util is None  # no agent runs in az-c
    assert view.zones["az-a"].util == pytest.approx(0.0)  # agents there, no traffic to it
    assert view.zones["az-a"].samples == 0
    cpu_only = merge_windows(ws, now=NOW, util_weights=UtilWeights(cpu=1.0, mem=0.0))
    assert cpu_only.zones["az-b"].util == pytest.approx((0.2 + 1.0) / 2)


def test_by_source_views():
    ws = [window("n1", "az-a", NOW, [path("az-a", "az-b", ok=10, timeout=10)]),
          window("n2", "az-c", NOW, [path("az-c", "az-b", ok=20)])]
    view = merge_windows(ws, now=NOW)
    assert view.by_source["az-a"]["az-b"].success == pytest.approx(0.5)
    assert view.by_source["az-c"]["az-b"].success == pytest.approx(1.0)
    assert view.zones["az-b"].success == pytest.approx(30 / 40)


def test_empty_input_gives_empty_view():
    view = merge_windows([], now=NOW)
    assert view.zones == {} and view.paths == {} and view.windows_used == 0


def test_no_completed_connects_means_unknown_success_and_zero_rates():
    w = window("n1", "az-a", NOW, [path("az-a", "az-b", attempts=3, rtt=hist(5_000, 50))])
    z = merge_windows([w], now=NOW).zones["az-b"]
    assert z.success is None
    assert z.samples == 50
    assert z.is_evidence(20)


def test_min_samples_decides_evidence():
    w = window("n1", "az-a", NOW, [path("az-a", "az-b", ok=19)])
    z = merge_windows([w], now=NOW).zones["az-b"]
    assert not z.is_evidence(20) and z.is_evidence(19)


def test_failures_by_zone_counts_refused_and_timeouts():
    ws = [window("n1", "az-a", NOW, [path("az-a", "az-b", ok=5, refused=2, timeout=3)]),
          window("n2", "az-c", NOW, [path("az-c", "az-b", timeout=1), path("az-c", "az-a", ok=1)])]
    assert failures_by_zone(ws) == {"az-b": 6, "az-a": 0}


def test_merges_parsed_window_documents():
    doc = {"schema": 1, "node": "n1", "az": "az-a", "boot_id": "x", "seq": 3, "start": NOW - 1, "end": NOW,
           "util": {"cpu": 0.5, "mem": 0.5},
           "paths": [{"src": "az-a", "dst": "az-b", "conn_attempts": 4, "conn_ok": 4,
                      "rtt_us": {"scheme": "loglin-16", "counts": {"12288": 40}}}]}
    z = merge_windows([parse_window(doc)], now=NOW).zones["az-b"]
    assert z.success == 1.0 and z.samples == 44
    assert 12.0 <= z.p95_ms <= 13.0
