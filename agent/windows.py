"""Cumulative BPF readings -> per-interval windows, and the ring that serves them.

The BPF maps only ever grow; each interval the agent takes a Snapshot (CPUs summed) and
the window is the difference to the previous one. Pure code: tested without a kernel.
"""

from __future__ import annotations

import ipaddress
import itertools
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from azprobe import bpf
from azprobe.contracts.sketch import Histogram, bucket_lower_bound
from azprobe.contracts.window import COUNTER_FIELDS, HOST_COUNTER_FIELDS, HostStats, PathStats, Window

# Counters per path in BPF order (struct azp_path_counters). `syn_rto` is not part of the
# window contract; it goes to /metrics only.
BPF_COUNTER_FIELDS = COUNTER_FIELDS + ("syn_rto",)


@dataclass
class Snapshot:
    """Cumulative values: path id -> counter name -> n, (path, hist kind) -> bucket index -> n."""

    counters: dict[int, dict[str, int]] = field(default_factory=dict)
    hists: dict[tuple[int, int], dict[int, int]] = field(default_factory=dict)
    lost_events: int = 0
    # (path, 16-byte address, epoch) -> HOST_COUNTER_FIELDS then the RTT bucket counts
    # (agent/hosts.py); hosts_dropped: host summaries not kept (a full table).
    hosts: dict[tuple[int, bytes, int], tuple[int, ...]] = field(default_factory=dict)
    hosts_dropped: int = 0


def _diff(cur: Mapping, prev: Mapping) -> dict:
    # A value below its previous reading means the entry was recreated: count it afresh.
    out = {}
    for key, value in cur.items():
        d = value - prev.get(key, 0)
        d = value if d < 0 else d
        if d:
            out[key] = d
    return out


def counts_since(cur: Sequence[int], prev: Sequence[int]) -> tuple[int, ...]:
    """Element-wise `cur - prev` of two cumulative count vectors (`prev` may be shorter:
    missing counts are 0); as in _diff, a count below its previous one counts afresh."""
    return tuple(c - p if c >= p else c for c, p in itertools.zip_longest(cur, prev[:len(cur)], fillvalue=0))


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
    hosts = {}
    for key, values in cur.hosts.items():
        d = counts_since(values, prev.hosts.get(key, ()))
        if any(d):
            hosts[key] = d
    dropped = cur.hosts_dropped - prev.hosts_dropped
    return Snapshot(counters, hists, lost if lost >= 0 else cur.lost_events, hosts,
                    dropped if dropped >= 0 else cur.hosts_dropped)


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


def address_text(raw: bytes) -> str:
    """A 16-byte probe address (IPv4 as ::ffff:a.b.c.d) in canonical text."""
    addr = ipaddress.IPv6Address(bytes(raw))
    return str(addr.ipv4_mapped or addr)


def host_stats(delta: Snapshot, az_name: Callable[[int], str]) -> list[HostStats]:
    """Every host with activity in `delta`, sorted by (src, dst, address)."""
    n = len(HOST_COUNTER_FIELDS)
    out = []
    for (path, addr, _epoch), values in delta.hosts.items():
        src, dst = split_path(path)
        out.append(HostStats(az_name(src), az_name(dst), address_text(addr), *values[:n],
                             rtt_buckets=list(values[n:])))
    return sorted(out, key=lambda h: (h.src, h.dst, h.addr))


def newest_within(windows: list[Window], max_hosts: int) -> list[Window]:
    """The newest of `windows` (oldest first) whose hosts sum to at most `max_hosts`,
    and always the newest one: a windows page stays within the reader's size bound. The
    older ones are left out whole, a gap the controller counts, not a window cut short."""
    total, start = 0, len(windows)
    while start > 0 and (start == len(windows) or total + len(windows[start - 1].hosts) <= max_hosts):
        total += len(windows[start - 1].hosts)
        start -= 1
    return windows[start:]


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
