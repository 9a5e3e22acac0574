from azprobe.contracts.sketch import Histogram
from azprobe.commands.top import render_table, summarise
from azprobe.contracts.window import PathStats, Utilisation, Window


def _window(seq, paths):
    return Window(node="n", az="az-a", boot_id="b", seq=seq, start=float(seq), end=float(seq + 1),
                  util=Utilisation(0.1, 0.1), paths=paths)


def test_summary_merges_histograms_and_rates():
    rtt1 = Histogram()
    rtt1.record(1000, 95)
    rtt2 = Histogram()
    rtt2.record(50_000, 5)
    a = PathStats("az-a", "az-b", conn_attempts=10, conn_ok=9, conn_refused=1, rtt_us=rtt1, syn_retrans=2)
    b = PathStats("az-a", "az-b", conn_attempts=10, conn_ok=8, conn_timeout=2, rtt_us=rtt2, rto=1)
    [s] = summarise([_window(1, [a]), _window(2, [b])])
    assert s.conn_per_s == 10.0 and s.failure_pct == 15.0
    assert (s.syn_retrans, s.rto) == (2, 1)
    assert 0.9 < s.p95_rtt_ms < 1.1  # the 95th of 100 samples is still in the 1 ms bucket
    assert s.p95_connect_ms is None
    table = render_table([s], "t")
    assert "az-a -> az-b" in table and "15.00" in table


def test_empty_table_says_so():
    assert "no TCP activity" in render_table(summarise([]), "t")
