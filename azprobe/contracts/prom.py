"""The Prometheus face of the window contract: metric names, labels and histogram buckets
the agent's /metrics exports and the controller's Prometheus source reads back.

Both sides import this module (they never import each other), so a name or a bucket
bound cannot drift between writer and reader.

Histograms are *classic* Prometheus histograms with a small fixed set of buckets, not
native ones (docs/prometheus.md says why). Every bucket bound is a loglin-16 bucket
lower bound (azprobe.contracts.sketch), so each classic bucket is a union of whole
loglin-16 buckets and the exported cumulative counts are exact; only resolution is lost:
4 buckets per octave from 64 µs to 2^22 µs (~4.2 s), i.e. a bucket is at most 25 % of its
lower bound wide. Values are integer µs, so a bucket `le=B` holds the values < B (the
loglin-16 buckets below B), which differs from Prometheus's "≤ B" by at most 1 µs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from azprobe.contracts.sketch import Histogram, bucket_index, bucket_lower_bound
from azprobe.contracts.window import COUNTER_FIELDS, HISTOGRAM_FIELDS

# -- names ---------------------------------------------------------------------------
LABEL_NODE = "node"
LABEL_SRC = "src_az"
LABEL_DST = "dst_az"
PATH_LABELS = (LABEL_NODE, LABEL_SRC, LABEL_DST)

# Counter families (the exposition appends `_total`).
COUNTER_FAMILY = {name: f"azprobe_path_{name}" for name in COUNTER_FIELDS}
COUNTER_SERIES = {name: f"{family}_total" for name, family in COUNTER_FAMILY.items()}
# Histogram families in seconds (Prometheus's base unit); the window holds µs.
HISTOGRAM_FAMILY = {"rtt_us": "azprobe_path_rtt_seconds", "connect_us": "azprobe_path_connect_seconds"}
assert tuple(HISTOGRAM_FAMILY) == HISTOGRAM_FIELDS
HISTOGRAM_BUCKET_SERIES = {name: f"{family}_bucket" for name, family in HISTOGRAM_FAMILY.items()}
# The same buckets, *not* cumulative and only those with samples: what the controller's
# Prometheus source reads. A classic histogram is dense (every bucket above the data
# changes with it: 66 series per histogram); these are ~3-6 per path, so the controller
# decodes ~8x less. Label `upper` (the bucket's upper bound, like `le`), not `le`, so no
# tool mistakes them for a histogram.
HITS_FAMILY = {name: f"{family}_hits" for name, family in HISTOGRAM_FAMILY.items()}
HITS_SERIES = {name: f"{family}_total" for name, family in HITS_FAMILY.items()}
LABEL_UPPER = "upper"
# Node-level series, each with the `node` label so the reader can group by node.
INFO_SERIES = "azprobe_agent_info"  # 1, labels node, az, boot_id
CPU_SERIES = "azprobe_agent_cpu_utilisation"  # 0..1, the util of the latest window
MEM_SERIES = "azprobe_agent_mem_utilisation"
LOST_FAMILY = "azprobe_agent_lost_events"  # probe events the ring buffer had no room for (counter)
LOST_SERIES = f"{LOST_FAMILY}_total"

MAX_AZ_NAMES = 17  # the probe's 16 AZ ids plus "other"

# -- buckets -------------------------------------------------------------------------
BUCKETS_PER_OCTAVE = 4
FIRST_BOUND_US = 1 << 6  # 64 µs: below it the model's ms-scale tolerances see no difference
LAST_OCTAVE = 22  # the last finite bound is 1.75 * 2^21 µs; beyond 2^22 µs is +Inf


def _bounds() -> tuple[int, ...]:
    out = []
    for octave in range(6, LAST_OCTAVE):
        for k in range(BUCKETS_PER_OCTAVE):
            out.append((1 << octave) + k * ((1 << octave) // BUCKETS_PER_OCTAVE))
    out.append(1 << LAST_OCTAVE)
    return tuple(out)


BUCKET_BOUNDS_US: tuple[int, ...] = _bounds()  # 65 finite bounds, ascending
assert all(bucket_lower_bound(bucket_index(b)) == b for b in BUCKET_BOUNDS_US)
INF = math.inf


def le_text(bound_us: float) -> str:
    """The `le` label of a bound in µs, as the Python client prints it (seconds)."""
    return "+Inf" if bound_us == INF else f"{bound_us / 1e6:.6f}".rstrip("0")


_BOUND_SET = frozenset(BUCKET_BOUNDS_US)


def bound_from_le(text: object) -> float | None:
    """Reader side: an `le` label -> its bound in µs, or None when it is not one of ours.
    Parsed as a number, not matched as text: a Prometheus-compatible store may print
    0.000064 as 6.4e-05."""
    if not isinstance(text, str) or len(text) > 32:
        return None
    if text in ("+Inf", "Inf", "+inf", "inf"):
        return INF
    try:
        us = float(text) * 1e6
    except ValueError:
        return None
    if not math.isfinite(us):
        return None
    bound = round(us)
    return float(bound) if bound in _BOUND_SET and abs(us - bound) < 0.01 else None


def cumulative_buckets(hist: Histogram) -> list[tuple[str, int]]:
    """(le, cumulative count) for every bucket, +Inf last: the exposition of `hist`."""
    counts = sorted(hist.counts.items())
    out: list[tuple[str, int]] = []
    seen, i = 0, 0
    for bound in BUCKET_BOUNDS_US:
        while i < len(counts) and counts[i][0] < bound:
            seen += counts[i][1]
            i += 1
        out.append((le_text(bound), seen))
    out.append(("+Inf", seen + sum(n for _, n in counts[i:])))
    return out


def bucket_hits(hist: Histogram) -> list[tuple[str, int]]:
    """(upper bound, count) of every classic bucket with samples, not cumulative."""
    out = []
    below = 0
    for le, cumulative in cumulative_buckets(hist):
        if cumulative > below:
            out.append((le, cumulative - below))
        below = cumulative
    return out


def _fine_buckets(lo: int, hi: int) -> list[tuple[int, int]]:
    """(lower bound, width) of the loglin-16 buckets covering [lo, hi)."""
    out = []
    index = bucket_index(lo)
    while True:
        lower = bucket_lower_bound(index)
        if lower >= hi:
            return out
        upper = bucket_lower_bound(index + 1)
        out.append((lower, upper - lower))
        index += 1


_INDEX_OF: dict[float, int] = {b: i for i, b in enumerate(BUCKET_BOUNDS_US)}
_FINE = [_fine_buckets(lo, hi) for lo, hi in zip((0,) + BUCKET_BOUNDS_US[:-1], BUCKET_BOUNDS_US)]


def histogram_from_deltas(deltas: Mapping[float, int]) -> Histogram:
    """Per-bucket counts (not cumulative) keyed by `le` bound in µs -> a loglin-16
    Histogram. A classic bucket's count is spread over the loglin-16 buckets it covers in
    proportion to their width (uniform density, what histogram_quantile assumes too), so
    Histogram.quantile interpolates across the whole classic bucket; +Inf counts sit at
    the last bound. Unknown bounds raise ValueError."""
    hist = Histogram()
    for bound, n in deltas.items():
        if n <= 0:
            continue
        if bound == INF:
            hist.add_bucket(BUCKET_BOUNDS_US[-1], n)
            continue
        i = _INDEX_OF.get(bound)  # type: ignore[arg-type]
        if i is None:
            raise ValueError(f"le={bound} µs is not one of azprobe's histogram buckets")
        fine = _FINE[i]
        total_width = sum(w for _, w in fine)
        covered, given = 0, 0
        for lower, width in fine:
            covered += width
            share = (n * covered + total_width // 2) // total_width  # rounded cumulative share
            hist.add_bucket(lower, share - given)
            given = share
    return hist
