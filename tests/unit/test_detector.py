"""The spike detector: Poisson failures per 10 s bucket, 60-bucket window, 1.3 x P95 or
lambda + 2 sigma, warm-up, min_failures, gaps and clock steps."""

from __future__ import annotations

import math
import random

import pytest

from azprobe.controller.detector import DetectorConfig, SpikeDetector, ZoneSpikeDetectors, percentile

T0 = 1_764_470_000.0  # a multiple of 10


def poisson(rng: random.Random, lam: float) -> int:
    # Knuth's method: fine for the small lambdas used here
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def fill(detector: SpikeDetector, counts: list[int], start: float = T0) -> float:
    """One update per bucket with that bucket's failures; returns the next bucket's time."""
    t = start
    for c in counts:
        detector.update(t, c)
        t += 10.0
    return t


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4, 5], 0.5) == 3
    assert percentile([0] * 19 + [20], 0.95) == pytest.approx(1.0)
    assert percentile([7], 0.95) == 7


def test_warm_up_never_flags():
    d = SpikeDetector()
    t = fill(d, [0, 0, 0, 0, 0])  # 5 closed buckets after the 6th update below
    r = d.update(t, 1000)
    assert not r.spike and not r.warm
    assert "warming up" in r.reason


def test_burst_after_quiet_history_is_a_spike():
    d = SpikeDetector()
    t = fill(d, [2, 3, 1, 2, 4, 2, 3, 2, 1, 3])
    r = d.update(t, 20)
    assert r.spike and r.warm
    assert r.lam == pytest.approx(2.3, abs=0.01)
    assert "p95" in r.reason and "sigma" in r.reason


def test_counts_accumulate_within_a_bucket():
    d = SpikeDetector()
    t = fill(d, [2] * 10)
    first = d.update(t, 3)
    assert not first.spike and first.current == 3
    second = d.update(t + 4.0, 6)  # same bucket: 9 failures so far
    assert second.current == 9 and second.spike


def test_min_failures_guards_quiet_zones():
    d = SpikeDetector()
    t = fill(d, [0] * 10)
    assert not d.update(t, 4).spike  # 4 < min_failures (5) although P95 and lambda are 0
    assert d.update(t + 1, 1).spike  # 5 now


def test_p95_criterion_alone():
    # Bursty history: lambda band is wide above the usual, the 1.3 x P95 line catches it.
    cfg = DetectorConfig(band_sigmas=100.0)  # disable the band criterion
    d = SpikeDetector(cfg)
    t = fill(d, [10] * 19 + [30])
    assert not d.update(t, 13).spike  # P95 = 11, 1.3 x 11 = 14.3
    assert d.update(t + 1, 2).spike  # 15 > 14.3


def test_band_criterion_alone():
    cfg = DetectorConfig(threshold_factor=100.0)  # disable the P95 criterion
    d = SpikeDetector(cfg)
    t = fill(d, [9] * 20)  # lambda 9, sigma 3, band up to 15
    assert not d.update(t, 15).spike
    assert d.update(t + 1, 1).spike


def test_steady_poisson_rarely_flags():
    rng = random.Random(7)
    d = SpikeDetector()
    t = T0
    flagged = 0
    buckets = 600
    for _ in range(buckets):
        r = d.update(t, poisson(rng, 4.0))
        flagged += r.spike
        t += 10.0
    # lambda+2 sigma alone would flag ~5 %; with min_failures and Poisson tails: well under 10 %
    assert flagged / buckets < 0.10
    # and a 10x burst on top of the same process is always caught
    assert d.update(t, 40).spike


def test_window_keeps_60_buckets_and_gaps_count_as_zero():
    d = SpikeDetector()
    t = fill(d, [50] * 70)
    assert len(d.history) == 60
    d.update(t + 10.0 * 30, 0)  # 30 buckets without any update
    zeros = sum(1 for v in d.history if v == 0)
    assert zeros == 30
    assert len(d.history) == 60


def test_clock_stepping_back_keeps_the_bucket():
    d = SpikeDetector()
    t = fill(d, [1] * 8)
    d.update(t, 2)
    r = d.update(t - 35.0, 3)
    assert r.current == 5
    assert len(d.history) == 8


def test_garbage_failures_are_zero():
    d = SpikeDetector()
    r = d.update(T0, float("nan"))
    assert r.current == 0
    assert d.update(T0, -5).current == 0


def test_zone_detectors_per_az():
    z = ZoneSpikeDetectors()
    t = T0
    for _ in range(10):
        z.update(t, {"az-a": 1}, zones=["az-a", "az-b"])
        t += 10.0
    out = z.update(t, {"az-b": 30})
    assert set(out) == {"az-a", "az-b"}
    assert out["az-b"].spike and not out["az-a"].spike
