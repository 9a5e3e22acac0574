import pytest

from azprobe import bpf
from azprobe.agent.windows import Snapshot, WindowRing, histogram_from_indexes, path_stats, snapshot_delta
from azprobe.contracts.sketch import NUM_BUCKETS, bucket_index, bucket_lower_bound
from azprobe.contracts.window import Utilisation, Window, parse_window

MAX_AZ = bpf.constant("MAX_AZ")
RTT, CONNECT = bpf.constant("HIST_RTT"), bpf.constant("HIST_CONNECT")


def test_bpf_bucket_indexes_become_lower_bounds():
    # Index 16 is the first sub-bucket of octave 4 (16..16), index 100 is 640..671.
    hist = histogram_from_indexes({3: 2, 16: 1, 100: 5, NUM_BUCKETS - 1: 1})
    assert hist.counts == {3: 2, 16: 1, 640: 5, bucket_lower_bound(NUM_BUCKETS - 1): 1}
    assert bucket_lower_bound(100) == 640 and bucket_index(671) == 100


def test_delta_of_cumulative_readings():
    prev = Snapshot(counters={1 * MAX_AZ + 2: {"conn_attempts": 5, "conn_ok": 5}},
                    hists={(1 * MAX_AZ + 2, RTT): {20: 3}}, lost_events=1)
    cur = Snapshot(counters={1 * MAX_AZ + 2: {"conn_attempts": 8, "conn_ok": 7},
                             1 * MAX_AZ + 0: {"conn_attempts": 1}},
                   hists={(1 * MAX_AZ + 2, RTT): {20: 3, 21: 2}}, lost_events=4)
    d = snapshot_delta(cur, prev)
    assert d.counters == {1 * MAX_AZ + 2: {"conn_attempts": 3, "conn_ok": 2}, 1 * MAX_AZ: {"conn_attempts": 1}}
    assert d.hists == {(1 * MAX_AZ + 2, RTT): {21: 2}}
    assert d.lost_events == 3


def test_delta_counts_a_recreated_entry_afresh():
    d = snapshot_delta(Snapshot(counters={5: {"retrans": 2}}), Snapshot(counters={5: {"retrans": 9}}))
    assert d.counters == {5: {"retrans": 2}}


def test_path_stats_names_paths_and_drops_syn_rto_from_the_window():
    names = {0: "other", 1: "az-a", 2: "az-b"}
    delta = Snapshot(counters={1 * MAX_AZ + 2: {"conn_attempts": 3, "syn_rto": 4},
                               1 * MAX_AZ + 0: {"retrans": 1}},
                     hists={(1 * MAX_AZ + 2, CONNECT): {bucket_index(700): 3}})
    paths = path_stats(delta, names.__getitem__)
    assert [(p.src, p.dst) for p in paths] == [("az-a", "az-b"), ("az-a", "other")]
    assert paths[0].conn_attempts == 3 and paths[0].connect_us.counts == {bucket_lower_bound(bucket_index(700)): 3}
    assert paths[1].retrans == 1 and paths[1].rtt_us.total == 0
    assert not hasattr(paths[0], "syn_rto")


def _window(seq: int) -> Window:
    return Window(node="n", az="az-a", boot_id="b", seq=seq, start=1.0, end=2.0,
                  util=Utilisation(0.1, 0.2), paths=[])


def test_ring_after_and_eviction():
    ring = WindowRing(3)
    for seq in range(1, 6):
        ring.append(_window(seq))
    assert [w.seq for w in ring.after(0)] == [3, 4, 5]
    assert [w.seq for w in ring.after(3)] == [4, 5]
    assert ring.after(5) == []
    with pytest.raises(ValueError):
        ring.append(_window(5))
    parse_window(ring.latest().to_json())
