"""The drill's scoring (azprobe.dev.drill.metrics): windows, percentiles, detection,
recovery and Envoy's counter shares, on synthetic request records."""

from azprobe.dev.drill.metrics import (AdminSample, RequestRecord, detection_s, envoy_share, mode_figures,
                                       parse_admin, parse_records, percentile, recovery_s)

AZS = ("az-a", "az-b", "az-c")


def traffic(start: float, end: float, rate: float, az_of, latency_of=lambda t, az: 2.0, status_of=lambda t, az: 200):
    out, t, i = [], start, 0
    while t < end:
        az = az_of(t, i)
        out.append(RequestRecord(t, latency_of(t, az), status_of(t, az), az))
        i += 1
        t = start + i / rate
    return out


def round_robin(t, i):
    return AZS[i % 3]


def test_percentile_is_nearest_rank():
    values = sorted(float(v) for v in range(1, 101))
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0 and percentile(values, 99.9) == 100.0
    assert percentile([], 99) is None


def test_records_and_admin_lines_parse_and_skip_torn_lines():
    records = parse_records("1.5,2.0,200,az-a\n1.0,1000.0,504,-\n2.0,3.0")
    assert [r.t for r in records] == [1.0, 1.5] and not records[0].ok and records[1].ok
    admin = parse_admin('{"t": 1, "zones": {"az-a": {"rq_total": 3}}}\n{"t": 2, "zon')
    assert admin == [AdminSample(1.0, {"az-a": 3})]


def drained_at(t_drain: float):
    """Round robin until t_drain, then az-b gets nothing."""
    def az_of(t, i):
        return AZS[i % 3] if t < t_drain else ("az-a", "az-c")[i % 2]
    return az_of


def test_detection_is_when_the_sick_share_stays_low_until_the_fault_ends():
    requests = traffic(0, 20, 100, drained_at(13.2))
    assert detection_s(requests, ["az-b"], 10.0, 20.0) == 3.5  # the first whole 0.5 s bin after 3.2 s
    assert detection_s(traffic(0, 20, 100, round_robin), ["az-b"], 10.0, 20.0) is None


def test_a_share_that_drops_only_at_the_very_end_is_not_a_detection():
    assert detection_s(traffic(0, 20, 100, drained_at(19.6)), ["az-b"], 10.0, 20.0) is None


def test_recovery_is_when_the_share_comes_back_and_stays():
    def az_of(t, i):
        return ("az-a", "az-c")[i % 2] if t < 23.0 else AZS[i % 3]
    requests = traffic(20, 30, 100, az_of)
    assert recovery_s(requests, ["az-b"], 20.0, 30.0, baseline_share=1 / 3) == 3.0
    assert recovery_s(requests, ["az-b"], 20.0, 30.0, baseline_share=None) is None


def test_a_sliver_at_the_end_of_the_window_is_not_a_bin_of_its_own():
    # The window ends 10 ms into a bin: its one or two requests both miss az-b. Judged alone
    # they would read as az-b's share at 0 and undo a recovery that held for 7 s.
    def az_of(t, i):
        return ("az-a", "az-c")[i % 2] if t < 23.0 or t >= 30.0 else AZS[i % 3]
    requests = traffic(20, 30.01, 100, az_of)
    assert recovery_s(requests, ["az-b"], 20.0, 30.01, baseline_share=1 / 3) == 3.0


def test_envoy_share_is_the_counter_delta_inside_the_window():
    admin = [AdminSample(0.0, {"az-a": 0, "az-b": 0}), AdminSample(1.0, {"az-a": 10, "az-b": 10}),
             AdminSample(2.0, {"az-a": 110, "az-b": 10})]
    assert envoy_share(admin, ["az-b"], 1.0, 2.0) == 0.0
    assert envoy_share(admin, ["az-b"], 0.0, 2.0) == 10 / 120
    assert envoy_share(admin, ["az-b"], 0.5, 1.5) is None  # one sample is no interval


def test_mode_figures_split_baseline_fault_and_after_detection():
    def latency(t, az):
        return 202.0 if az == "az-b" and 10 <= t < 20 else 2.0
    requests = traffic(0, 25, 100, drained_at(13.2), latency_of=latency)
    f = mode_figures("azprobe", requests, [], ["az-b"], run_start=0.0, fault_start=10.0, fault_end=20.0,
                     run_end=25.0, grace_s=5.0, azs=AZS)
    assert f.detect_s == 3.5 and f.after_detection.start_s == 3.5
    assert f.after_detection.p99_ms == 2.0 and f.after_detection.sick_share_client == 0.0
    assert f.fault.p99_ms == 202.0 and f.baseline.p99_ms == 2.0
    assert abs(f.baseline.sick_share_client - 1 / 3) < 0.01
    static = mode_figures("static", traffic(0, 25, 100, round_robin, latency_of=latency), [], ["az-b"],
                          run_start=0.0, fault_start=10.0, fault_end=20.0, run_end=25.0, grace_s=5.0)
    assert static.detect_s is None and static.after_detection.start_s == 5.0 and static.after_detection.p99_ms == 202.0
