"""Log-linear histograms ("loglin-16"), computed identically in BPF (bpf/azprobe.bpf.h).

Values are non-negative integers (µs). Values below 16 get one exact bucket each; above,
every power-of-two octave is split into 16 linear sub-buckets, so a bucket's width is at
most 1/16 of its lower bound and a quantile read from it has at most 6.25 % relative
error. A bucket is *named by its lower bound*, so any reader can merge (add counts) and
compute quantiles without knowing the scheme.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

SCHEME = "loglin-16"
SUB_BUCKET_BITS = 4
SUB_BUCKETS = 1 << SUB_BUCKET_BITS  # 16
MAX_VALUE_BITS = 34  # values are clamped below 2**34 µs (~4.8 h), as in BPF
NUM_BUCKETS = 512  # covers bucket_index(2**34 - 1) == 495


def bucket_index(value: int) -> int:
    """Index of the bucket holding `value` (the same arithmetic as the BPF side)."""
    value = max(0, min(int(value), (1 << MAX_VALUE_BITS) - 1))
    if value < SUB_BUCKETS:
        return value
    octave = value.bit_length() - 1  # >= 4
    sub = (value >> (octave - SUB_BUCKET_BITS)) & (SUB_BUCKETS - 1)
    return (octave - SUB_BUCKET_BITS + 1) * SUB_BUCKETS + sub


def bucket_lower_bound(index: int) -> int:
    """Smallest value that falls into bucket `index`."""
    if index < 0 or index >= NUM_BUCKETS:
        raise ValueError(f"bucket index {index} outside 0..{NUM_BUCKETS - 1}")
    if index < SUB_BUCKETS:
        return index
    octave = index // SUB_BUCKETS + SUB_BUCKET_BITS - 1
    sub = index % SUB_BUCKETS
    return (SUB_BUCKETS + sub) << (octave - SUB_BUCKET_BITS)


def bucket_width(lower_bound: int) -> int:
    """Width of the bucket whose lower bound is `lower_bound`."""
    if lower_bound < SUB_BUCKETS:
        return 1
    octave = lower_bound.bit_length() - 1
    return 1 << (octave - SUB_BUCKET_BITS)


class Histogram:
    """Counts keyed by bucket lower bound (µs). Mergeable by addition."""

    __slots__ = ("counts",)

    def __init__(self, counts: Mapping[int, int] | None = None) -> None:
        self.counts: dict[int, int] = {}
        if counts:
            for lower, n in counts.items():
                self.add_bucket(int(lower), int(n))

    @classmethod
    def of_checked(cls, counts: dict[int, int]) -> "Histogram":
        """A histogram holding `counts` itself, which its reader checked already (the keys
        lower bounds, the counts in range): __init__ would check them again, per bucket."""
        hist = cls()
        hist.counts = counts
        return hist

    def record(self, value: int, n: int = 1) -> None:
        self.add_bucket(bucket_lower_bound(bucket_index(value)), n)

    def add_bucket(self, lower_bound: int, n: int) -> None:
        if n < 0:
            raise ValueError(f"negative count {n} for bucket {lower_bound}")
        if n:
            self.counts[lower_bound] = self.counts.get(lower_bound, 0) + n

    def merge(self, other: "Histogram") -> None:
        for lower, n in other.counts.items():
            self.counts[lower] = self.counts.get(lower, 0) + n

    def subtract(self, other: "Histogram") -> None:
        """Take back counts `other` merged in; a bucket that reaches 0 leaves."""
        counts = self.counts
        for lower, n in other.counts.items():
            left = counts.get(lower, 0) - n
            if left > 0:
                counts[lower] = left
            else:
                counts.pop(lower, None)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0..1), interpolated inside its bucket; None when empty."""
        if not 0.0 <= q <= 1.0 or math.isnan(q):
            raise ValueError(f"quantile {q} outside 0..1")
        total = self.total
        if total == 0:
            return None
        rank = q * total
        seen = 0
        for lower in sorted(self.counts):
            n = self.counts[lower]
            if seen + n >= rank:
                width = bucket_width(lower)
                fraction = (rank - seen) / n if n else 0.0
                return lower + min(max(fraction, 0.0), 1.0) * width
            seen += n
        last = max(self.counts)
        return float(last + bucket_width(last))

    def to_json(self) -> dict:
        return {"scheme": SCHEME, "counts": {str(k): v for k, v in sorted(self.counts.items())}}

    @classmethod
    def from_json(cls, doc: object) -> "Histogram":
        """Parse {"scheme": ..., "counts": {"<lower µs>": n}}; raises ValueError."""
        # type() first: json.loads gives dicts, and the Mapping ABC check is slow.
        if type(doc) is not dict and not isinstance(doc, Mapping):
            raise ValueError("histogram must be an object")
        counts = doc.get("counts", {})
        if type(counts) is not dict and not isinstance(counts, Mapping):
            raise ValueError("histogram.counts must be an object")
        # The controller parses thousands of these per cycle: build the dict directly.
        parsed: dict[int, int] = {}
        for key, n in counts.items():
            lower = _BUCKET_NAMES.get(key)
            if lower is None:
                try:
                    lower = int(key)
                except (TypeError, ValueError):
                    raise ValueError(f"histogram bucket name {key!r} is not an integer") from None
            if type(n) is not int or n < 0 or lower < 0:
                raise ValueError(f"histogram bucket {key!r} has bad count {n!r}")
            if n:
                parsed[lower] = parsed.get(lower, 0) + n
        return cls.of_checked(parsed)


# The names loglin-16 writers use, pre-parsed: a dict lookup beats int() on the hot path.
_BUCKET_NAMES: dict[str, int] = {str(bucket_lower_bound(i)): bucket_lower_bound(i) for i in range(NUM_BUCKETS)}

LAST_BUCKET = bucket_index((1 << MAX_VALUE_BITS) - 1)  # 495: where every larger value is clamped
# Every key a loglin-16 histogram can have: a set, so a reader checks a whole histogram's
# keys with one C-level issuperset() (readers merge by key, so any other key is garbage).
LOWER_BOUNDS: frozenset[int] = frozenset(bucket_lower_bound(i) for i in range(LAST_BUCKET + 1))


def merged(histograms: Iterable[Histogram]) -> Histogram:
    out = Histogram()
    for h in histograms:
        out.merge(h)
    return out
