"""Failure-spike detection per destination AZ (the source documents' method).

Failures (refused + timed-out connects) are counted per fixed bucket (10 s) and treated
as Poisson. The last 60 closed buckets form the window. The bucket in progress is a
spike when, after warm-up and with at least ``min_failures`` failures:

- its count exceeds ``threshold_factor`` (1.3) x the window's 95th percentile, or
- its count leaves the rolling band lambda +- ``band_sigmas`` (2) sigma, with lambda the
  window's mean and sigma = sqrt(lambda) (Poisson). Only the upper side is a spike.

The in-progress bucket is judged as it fills, so a burst is flagged within one cycle,
not at the end of its 10 s bucket. ``min_failures`` stops a single failure in a quiet
zone (lambda ~ 0, P95 = 0) from counting as a spike.

``SpikeDetector.update(now, failures)`` is deterministic: the only state is the closed
buckets and the bucket in progress; feed it the failures *new* since the last call.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class DetectorConfig:
    bucket_s: float = 10.0
    window: int = 60
    threshold_factor: float = 1.3
    band_sigmas: float = 2.0
    warmup_buckets: int = 6  # one minute of history before anything is called a spike
    min_failures: int = 5


@dataclass(frozen=True)
class DetectorResult:
    spike: bool
    reason: str
    current: int  # failures in the bucket in progress
    lam: float  # mean failures per bucket over the window (Poisson lambda)
    p95: float  # 95th percentile of the window's bucket counts
    upper_band: float  # lambda + band_sigmas * sqrt(lambda)
    warm: bool


def percentile(values: list[int], q: float) -> float:
    """Linear-interpolated percentile (q in 0..1) of a non-empty list."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class SpikeDetector:
    """Spike detector for one AZ. Not thread-safe; one instance per AZ per controller."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config or DetectorConfig()
        self.history: deque[int] = deque(maxlen=self.config.window)
        self.bucket: int | None = None  # index of the bucket in progress
        self.current = 0

    def update(self, now: float, failures: float) -> DetectorResult:
        c = self.config
        count = max(int(failures), 0) if math.isfinite(failures) else 0
        index = math.floor(now / c.bucket_s) if math.isfinite(now) else self.bucket or 0
        if self.bucket is None:
            self.bucket = index
        elif index > self.bucket:
            self.history.append(self.current)
            # buckets with no update at all saw no failures; at most a window's worth
            for _ in range(min(index - self.bucket - 1, c.window)):
                self.history.append(0)
            self.bucket, self.current = index, 0
        # index < bucket (clock stepped back): keep counting into the bucket in progress
        self.current += count

        n = len(self.history)
        if n == 0:
            return DetectorResult(False, "warming up: no history yet", self.current, 0.0, 0.0, 0.0, False)
        values = list(self.history)
        lam = sum(values) / n
        p95 = percentile(values, 0.95)
        upper = lam + c.band_sigmas * math.sqrt(lam)
        warm = n >= c.warmup_buckets
        figures = f"{self.current} failures in this {c.bucket_s:g} s bucket; lambda {lam:.2f}, p95 {p95:.1f}"
        if not warm:
            return DetectorResult(False, f"warming up ({n}/{c.warmup_buckets} buckets): {figures}",
                                  self.current, lam, p95, upper, False)
        over_p95 = self.current > c.threshold_factor * p95
        over_band = self.current > upper
        if self.current >= c.min_failures and (over_p95 or over_band):
            why = []
            if over_p95:
                why.append(f"> {c.threshold_factor:g} x p95 = {c.threshold_factor * p95:.1f}")
            if over_band:
                why.append(f"> lambda + {c.band_sigmas:g} sigma = {upper:.1f}")
            return DetectorResult(True, f"spike: {figures}; " + " and ".join(why), self.current, lam, p95, upper, True)
        return DetectorResult(False, f"no spike: {figures}", self.current, lam, p95, upper, True)


class ZoneSpikeDetectors:
    """One SpikeDetector per destination AZ, created on first sight."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config or DetectorConfig()
        self.detectors: dict[str, SpikeDetector] = {}

    def update(self, now: float, failures_by_zone: Mapping[str, int], zones: list[str] | None = None) -> dict[str, DetectorResult]:
        """Feed this cycle's new failures; AZs in `zones` without failures get 0."""
        names = set(failures_by_zone) | set(zones or ()) | set(self.detectors)
        out: dict[str, DetectorResult] = {}
        for az in sorted(names):
            detector = self.detectors.setdefault(az, SpikeDetector(self.config))
            out[az] = detector.update(now, failures_by_zone.get(az, 0))
        return out
