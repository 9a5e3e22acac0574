"""Cumulative BPF readings -> per-interval windows, and the ring that serves them.

The BPF maps only ever grow; each interval the agent takes a Snapshot (CPUs summed) and
the window is the difference to the previous one. Pure code: tested without a kernel.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from azprobe import bpf
from azprobe.contracts.sketch import Histogram, bucket_lower_bound
from azprobe.contracts.window import COUNTER_FIELDS, PathStats, Window

# Counters per path in BPF order (struct azp_path_counters). `syn_rto` is not part of the
# window contract; it goes to /metrics only.
BPF_COUNTER_FIELDS = COUNTER_FIELDS + ("syn_rto",)


@dataclass
class Snapshot:
    """Cumulative values: path id -> counter name -> n, (path, hist kind) -> bucket index -> n."""

    counters: dict[int, dict[str, int]] = field(default_factory=dict)
    hists: dict[tuple[int, int], dict[int, int]] = field(default_factory=dict)
    lost_events: int = 0


def _diff(cur: Mapping, prev: Mapping) -> dict:
    # A value below its previous reading means the entry was recreated: count it afresh.
    out = {}
    for key, value in cur.items():
        d = value - prev.get(key, 0)
        d = value if d < 0 else d
        if d:
            out[key] = d
    return out


def snapshot_delta(cur: Snapshot, prev: Snapshot) -> Snapshot:
    counters = {}
    for path, values in cur.counters.items():
        d = _diff(values, prev.counters.get(path, {}))
        if d:
            counters[path] = d
    hists = {}
    for key, buckets in cur.hists.items():
        d = _diff(buckets, prev.hists.get(key, {}))
        if d:
            hists[key] = d
    lost = cur.lost_events - prev.lost_events
    return Snapshot(counters, hists, lost if lost >= 0 else cur.lost_events)


def histogram_from_indexes(counts: Mapping[int, int]) -> Histogram:
    """BPF bucket indexes -> a Histogram keyed by lower bound (sketch.bucket_lower_bound)."""
    hist = Histogram()
    for index, n in counts.items():
        hist.add_bucket(bucket_lower_bound(index), n)
    return hist


def split_path(path: int) -> tuple[int, int]:
    """BPF path id -> (src AZ id, dst AZ id)."""
    return divmod(path, bpf.constant("MAX_AZ"))


def path_id(src: int, dst: int) -> int:
    return src * bpf.constant("MAX_AZ") + dst


def path_stats(delta: Snapshot, az_name: Callable[[int], str]) -> list[PathStats]:
    """Every path with activity in `delta`, sorted by (src, dst) name."""
    rtt_kind, connect_kind = bpf.constant("HIST_RTT"), bpf.constant("HIST_CONNECT")
    paths = set(delta.counters) | {p for p, _ in delta.hists}
    out = []
    for path in paths:
        src, dst = split_path(path)
        stats = PathStats(src=az_name(src), dst=az_name(dst))
        for name, n in delta.counters.get(path, {}).items():
            if name in COUNTER_FIELDS:
                setattr(stats, name, n)
        stats.rtt_us = histogram_from_indexes(delta.hists.get((path, rtt_kind), {}))
        stats.connect_us = histogram_from_indexes(delta.hists.get((path, connect_kind), {}))
        out.append(stats)
    return sorted(out, key=lambda p: (p.src, p.dst))


class WindowRing:
    """The last `size` windows; thread-safe (the read loop appends, HTTP threads read)."""

    def __init__(self, size: int) -> None:
        self._windows: deque[Window] = deque(maxlen=size)
        self._lock = threading.Lock()

    def append(self, window: Window) -> None:
        with self._lock:
            if self._windows and window.seq <= self._windows[-1].seq:
                raise ValueError(f"seq {window.seq} after {self._windows[-1].seq}")
            self._windows.append(window)

    def after(self, seq: int) -> list[Window]:
        with self._lock:
            return [w for w in self._windows if w.seq > seq]

    def latest(self) -> Window | None:
        with self._lock:
            return self._windows[-1] if self._windows else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._windows)
