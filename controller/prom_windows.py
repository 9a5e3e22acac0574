"""Prometheus query answers -> per-node windows, the same `Window`s agents serve directly.

The Prometheus source reads *raw samples* (a range selector, `name[lookback]`), not
increase()/rate(): every scrape of one agent stamps all its series with one timestamp, so
consecutive scrapes (t0, t1] of a node give one synthetic window of exact integer counter
deltas and histogram bucket deltas, aligned to the scrapes. No extrapolation, no
fractional counts, and one window per node per scrape interval, which is what the
decision path (merge, per-node quorum, safety) already consumes from the direct pull.

Everything from the network is bounded here: series count, samples per series, label
lengths, AZ names per node, timestamps and values. A series that breaks a rule is
skipped and counted as garbage, and its node loses its windows of that answer (a window
built without one of its series would be a partial one, e.g. connects without their
successes); a node whose windows break the window contract loses those windows (each is
checked by `parse_window`, the one validator). A scrape target speaks for one node: one
whose series carry several `node` names is refused whole. The work is
linear in the samples read: each series is walked once, in timestamp order, and only the
scrapes inside the evaluation window become windows. Pure code.
"""

from __future__ import annotations

import math
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from azprobe.contracts import prom
from azprobe.contracts.window import (COUNTER_FIELDS, HISTOGRAM_FIELDS, MAX_COUNT, PathStats, Utilisation, Window,
                                      WindowError, parse_window)

MAX_LABEL_LEN = 253
MAX_SAMPLES_PER_SERIES = 4000  # a lookback of an hour at 1 s scrapes
MAX_TIMESTAMP = 1e11
# Samples are cumulative counters since the agent started: an honest long-running agent
# passes 2^32 (MAX_COUNT, the per-window bound parse_window checks each delta against).
# 2^53: the largest integer a float holds exactly, so deltas stay exact integers.
MAX_CUMULATIVE = 2**53
MAX_LABELS = 32
# One series of an answer, as JSON text: MAX_SAMPLES_PER_SERIES samples of at most 64
# characters (a timestamp, a 40-character value, the brackets) and MAX_LABELS labels.
MAX_SERIES_CHARS = MAX_SAMPLES_PER_SERIES * 64 + MAX_LABELS * 512
_SERIES_OWN_LABELS = {"__name__", "le", prom.LABEL_UPPER, prom.LABEL_NODE, prom.LABEL_SRC, prom.LABEL_DST,
                      prom.LABEL_AZ, prom.LABEL_BOOT_ID}

# The window's counters only: the agent exports more (syn_rto), which no window holds.
_COUNTER_BY_SERIES = {series: name for name, series in prom.COUNTER_SERIES.items() if name in COUNTER_FIELDS}
_BUCKET_BY_SERIES = {series: name for name, series in prom.HITS_SERIES.items()}
SERIES_NAMES = (tuple(_COUNTER_BY_SERIES) + tuple(_BUCKET_BY_SERIES)
                + (prom.INFO_SERIES, prom.CPU_SERIES, prom.MEM_SERIES, prom.LOST_SERIES))


class PromAnswerError(ValueError):
    """The whole answer is unusable (not a success, not a matrix, over a bound)."""


class PromAnswerTooLarge(PromAnswerError):
    """Over max_response_bytes or max_series: a shorter range may fit."""


def query_for(range_s: float, selector: str = "") -> str:
    """The one PromQL query a cycle sends: raw samples of every series the windows need
    over the last `range_s` (whole milliseconds, at least 1 s)."""
    names = "|".join(SERIES_NAMES)
    extra = f",{selector}" if selector else ""
    return f'{{__name__=~"{names}"{extra}}}[{max(1000, int(math.ceil(range_s * 1000)))}ms]'


@dataclass(slots=True)
class Samples:
    """One series' samples, timestamps strictly increasing: two float arrays (16 bytes a
    sample; a dict of floats is ~100)."""

    times: array = field(default_factory=lambda: array("d"))  # s
    values: array = field(default_factory=lambda: array("d"))

    def at(self, t: float, default: float) -> float:
        i = bisect_left(self.times, t)
        return self.values[i] if i < len(self.times) and self.times[i] == t else default


@dataclass
class NodeSeries:
    """The raw samples of one node (one scrape target), by kind."""

    node: str
    target: str = ""  # the scrape target's labels (all but the series' own), as text
    info: dict[float, tuple[str, str]] = field(default_factory=dict)  # t -> (az, boot_id)
    counters: dict[tuple[str, str, str], Samples] = field(default_factory=dict)  # (src, dst, field)
    buckets: dict[tuple[str, str, str, float], Samples] = field(default_factory=dict)  # (.., upper µs)
    cpu: Samples = field(default_factory=Samples)
    mem: Samples = field(default_factory=Samples)
    lost: Samples = field(default_factory=Samples)
    azs: set[str] = field(default_factory=set)
    count: int = 0  # series read
    tainted: bool = False  # a series of it was garbage: no window of this answer is whole


@dataclass
class ParsedAnswer:
    nodes: dict[str, NodeSeries]  # key: instance + node
    garbage_series: int = 0
    refused_targets: int = 0  # targets whose series carry more than one node name
    newest: float | None = None  # the newest scrape of any node in the answer


def _label(labels: Mapping, key: str) -> str | None:
    value = labels.get(key)
    if not isinstance(value, str) or not value or len(value) > MAX_LABEL_LEN:
        return None
    return value


def _samples(values: object) -> Samples | None:
    """[[ts, "value"], ...] -> Samples (timestamps to the ms); None when any sample breaks
    a bound."""
    if not isinstance(values, list) or len(values) > MAX_SAMPLES_PER_SERIES:
        return None
    out = Samples()
    times, vals = out.times, out.values
    last = -math.inf
    for pair in values:
        if not isinstance(pair, list) or len(pair) != 2:
            return None
        ts, raw = pair
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not isinstance(raw, str) or len(raw) > 40:
            return None
        try:
            value = float(raw)
            ts = round(float(ts), 3)  # a JSON integer past a float's range: OverflowError
        except (ValueError, OverflowError):
            return None
        if not (0 < ts < MAX_TIMESTAMP) or ts <= last or not math.isfinite(value) or not 0 <= value <= MAX_CUMULATIVE:
            return None
        last = ts
        times.append(ts)
        vals.append(value)
    return out


def parse_answer(doc: object, *, max_series: int) -> ParsedAnswer:
    """Validate a /api/v1/query answer to `query_for(...)`, already decoded, and group it
    by scrape target (prom_source reads it as it streams in, through AnswerBuilder)."""
    result = check_envelope(doc)
    if len(result) > max_series:
        raise PromAnswerTooLarge(f"{len(result)} series, more than prometheus.max_series {max_series}")
    builder = AnswerBuilder(max_series)
    for entry in result:
        builder.add(entry)
    return builder.finish()


def check_envelope(doc: object) -> list:
    """The answer around the series: a success with a matrix result; returns the result."""
    if not isinstance(doc, dict) or doc.get("status") != "success":
        error = doc.get("error") if isinstance(doc, dict) else None
        raise PromAnswerError(f"query failed: {str(error)[:200] if error else 'status is not success'}")
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise PromAnswerError("data: expected {resultType: matrix, result: [...]}")
    return data["result"]


class AnswerBuilder:
    """The series of one answer, added one at a time as they are decoded; the answer is
    refused at the series past max_series, so an oversized result is never held whole.
    One target, one node, as the direct pull takes one URL for one node: a target whose
    series carry more than one `node` name is refused whole (its series count as
    garbage), or it could speak for its neighbours. A name claimed by two targets is
    left to the collector, which knows which target held it before (PrometheusCollector)."""

    def __init__(self, max_series: int) -> None:
        self.max_series = max_series
        self.series = 0
        self._answer = ParsedAnswer(nodes={})

    def add(self, entry: object) -> None:
        self.series += 1
        if self.series > self.max_series:
            raise PromAnswerTooLarge(f"more than prometheus.max_series {self.max_series} series")
        if not _add_series(self._answer, entry):
            self._answer.garbage_series += 1

    def finish(self) -> ParsedAnswer:
        answer = self._answer
        names: dict[str, set[str]] = {}  # target -> the node names its series carry
        for series in answer.nodes.values():
            names.setdefault(series.target, set()).add(series.node)
        for key in [k for k, series in answer.nodes.items() if len(names[series.target]) > 1]:
            answer.garbage_series += answer.nodes.pop(key).count
        answer.refused_targets = sum(len(n) > 1 for n in names.values())
        answer.newest = max((max(n.info) for n in answer.nodes.values() if n.info), default=None)
        return answer


def _add_series(answer: ParsedAnswer, entry: object) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("metric"), dict):
        return False
    labels = entry["metric"]
    name = labels.get("__name__")
    node_name = _label(labels, prom.LABEL_NODE)
    if name not in SERIES_NAMES or node_name is None or len(labels) > MAX_LABELS or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 100 and len(v) <= MAX_LABEL_LEN
            for k, v in labels.items()):
        return False
    # The scrape target: every label but the series' own (name, path, bucket, identity),
    # so two targets claiming one node (two jobs, unmerged HA replicas) never mix samples.
    target = "/".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in _SERIES_OWN_LABELS)
    key = f"{target}/{node_name}"
    node = answer.nodes.get(key)
    if node is None:
        node = answer.nodes[key] = NodeSeries(node=node_name, target=target)
    node.count += 1
    if not _add_samples(node, name, labels, entry.get("values")):
        node.tainted = True
        return False
    return True


def _add_samples(node: NodeSeries, name: str, labels: Mapping, values: object) -> bool:
    samples = _samples(values)
    if samples is None or not samples.times:
        return False
    if name == prom.INFO_SERIES:
        az, boot_id = _label(labels, prom.LABEL_AZ), _label(labels, prom.LABEL_BOOT_ID)
        if az is None or boot_id is None:
            return False
        identity = (az, boot_id)
        for ts in samples.times:
            node.info[ts] = identity
        return True
    # One series per kind and node; a repeated one replaces the earlier (as for paths).
    if name == prom.CPU_SERIES:
        node.cpu = samples
        return True
    if name == prom.MEM_SERIES:
        node.mem = samples
        return True
    if name == prom.LOST_SERIES:
        node.lost = samples
        return True
    src, dst = _label(labels, prom.LABEL_SRC), _label(labels, prom.LABEL_DST)
    if src is None or dst is None:
        return False
    new_azs = {src, dst} - node.azs
    if new_azs and len(node.azs) + len(new_azs) > prom.MAX_AZ_NAMES:
        return False  # more AZ names than any topology can have: not ours
    node.azs |= new_azs
    if name in _COUNTER_BY_SERIES:
        node.counters[(src, dst, _COUNTER_BY_SERIES[name])] = samples
        return True
    bound = prom.bound_from_le(labels.get(prom.LABEL_UPPER))
    if bound is None:
        return False
    node.buckets[(src, dst, _BUCKET_BY_SERIES[name], bound)] = samples
    return True


def _deltas(samples: Samples, scrapes: list[float], index: Mapping[float, int], first: int,
            restarted: list[bool]) -> Iterator[tuple[int, int]]:
    """(i, n) for each scrape pair (scrapes[i-1], scrapes[i]], i >= first, over which the
    counter rose by n > 0, in one pass over the series from just before scrapes[first-1].
    A series born after t0 counts from 0; absent from the scrape at t0 but seen earlier (a
    sample missing from the answer), it counts from that earlier sample; a value below
    the previous one (or a new boot) means the counter restarted from 0."""
    times, values = samples.times, samples.values
    j = bisect_left(times, scrapes[first - 1])
    previous = values[j - 1] if j else None  # the newest sample before the one at hand
    at_scrape, at_value = -2, 0.0  # the newest sample taken at a scrape: its index, its value
    for j in range(j, len(times)):
        v1 = values[j]
        i = index.get(times[j])
        if i is not None:
            if i >= first:
                v0 = at_value if at_scrape == i - 1 else (previous if previous is not None else 0.0)
                n = round(v1) if restarted[i] or v1 < v0 else round(v1 - v0)
                if n:
                    yield i, n
            at_scrape, at_value = i, v1
        previous = v1


@dataclass
class NodeRead:
    windows: list[Window]
    garbage: int  # scrape pairs dropped as garbage
    newest: float | None  # the newest scrape read: the node's next cursor
    gap: bool  # the scrape at the cursor is not in the answer: counts since it are lost
    too_old: int = 0  # scrape pairs ending more than horizon_s before the node's newest scrape


def node_windows(series: NodeSeries, after: float | None, horizon_s: float = math.inf,
                 deadline: float = math.inf) -> NodeRead:
    """Windows for each pair of consecutive scrapes (t0, t1] with t1 > `after` (the
    node's cursor) and t1 at most `horizon_s` before the node's newest scrape (older ones
    are only counted: the store would not keep them). The node's scrapes are the samples
    of its info series (present in every scrape). Past `deadline` (time.monotonic()),
    TimeoutError."""
    scrapes = sorted(series.info)
    garbage = 0
    newest = after
    gap = after is not None and bool(scrapes) and scrapes[-1] > after and after not in series.info
    if not scrapes or (after is not None and scrapes[-1] <= after):
        return NodeRead([], 0, newest, gap)
    newest = scrapes[-1]  # a lone first scrape still sets the cursor: the next delta starts there
    first = max(1, bisect_right(scrapes, after) if after is not None else 1)
    recent = max(first, bisect_left(scrapes, newest - horizon_s))
    while recent > first and newest - scrapes[recent - 1] <= horizon_s:
        recent -= 1
    while recent < len(scrapes) and newest - scrapes[recent] > horizon_s:
        recent += 1
    too_old = recent - first
    if recent >= len(scrapes):
        return NodeRead([], 0, newest, gap, too_old)
    if series.tainted:  # a series its windows need was garbage: none of them is whole
        return NodeRead([], len(scrapes) - recent, newest, gap, too_old)
    index = {t: i for i, t in enumerate(scrapes)}
    restarted = [False] + [series.info[t0][1] != series.info[t1][1] for t0, t1 in zip(scrapes, scrapes[1:])]
    counters: dict[int, list[tuple[tuple[str, str, str], int]]] = {}
    for key, samples in series.counters.items():
        for i, n in _deltas(samples, scrapes, index, recent, restarted):
            counters.setdefault(i, []).append((key, n))
        _check(deadline)
    buckets: dict[int, list[tuple[tuple[str, str, str, float], int]]] = {}
    for key4, samples in series.buckets.items():
        for i, n in _deltas(samples, scrapes, index, recent, restarted):
            buckets.setdefault(i, []).append((key4, n))
        _check(deadline)
    lost = dict(_deltas(series.lost, scrapes, index, recent, restarted))
    windows: list[Window] = []
    for i in range(recent, len(scrapes)):
        t0, t1 = scrapes[i - 1], scrapes[i]
        az, boot_id = series.info[t1]
        util = Utilisation(cpu=series.cpu.at(t1, 0.0), mem=series.mem.at(t1, 0.0))
        try:
            windows.append(_window(series.node, t0, t1, az, boot_id, util, counters.get(i, ()), buckets.get(i, ()),
                                   lost.get(i, 0)))
        except WindowError:
            garbage += 1
        _check(deadline)
    return NodeRead(windows, garbage, newest, gap, too_old)


def answer_windows(answer: ParsedAnswer, cursors: Mapping[str, float | None], horizon_s: float,
                   deadline: float = math.inf) -> dict[str, NodeRead]:
    """node_windows for every node of the answer, from its cursor (absent: None)."""
    return {key: node_windows(series, cursors.get(key), horizon_s, deadline) for key, series in answer.nodes.items()}


def _check(deadline: float) -> None:
    if deadline != math.inf and time.monotonic() > deadline:
        raise TimeoutError("turning the answer into windows took too long")


def _window(node: str, t0: float, t1: float, az: str, boot_id: str, util: Utilisation,
            counters: Iterable[tuple[tuple[str, str, str], int]],
            buckets: Iterable[tuple[tuple[str, str, str, float], int]], lost: int) -> Window:
    paths: dict[tuple[str, str], PathStats] = {}

    def path(src: str, dst: str) -> PathStats:
        p = paths.get((src, dst))
        if p is None:
            p = paths[(src, dst)] = PathStats(src=src, dst=dst)
        return p

    for (src, dst, name), n in counters:
        setattr(path(src, dst), name, n)
    per_bucket: dict[tuple[str, str, str], dict[float, int]] = {}
    for (src, dst, name, bound), n in buckets:
        per_bucket.setdefault((src, dst, name), {})[bound] = n
    for (src, dst, name), by_bound in per_bucket.items():
        setattr(path(src, dst), name, prom.histogram_from_deltas(by_bound))
    window = Window(node=node, az=az, boot_id=boot_id, seq=int(round(t1 * 1000)), start=t0, end=t1,
                    util=util, paths=sorted((p for p in paths.values() if _active(p)), key=lambda p: (p.src, p.dst)),
                    lost_events=lost)
    return parse_window(window.to_json())  # the one validator: a hostile answer fails here, not later


def _active(p: PathStats) -> bool:
    return any(getattr(p, n) for n in COUNTER_FIELDS) or any(getattr(p, n).counts for n in HISTOGRAM_FIELDS)
