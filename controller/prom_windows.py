"""Prometheus query answers -> per-node windows, the same `Window`s agents serve directly.

The Prometheus source reads *raw samples* (a range selector, `name[lookback]`), not
increase()/rate(): every scrape of one agent stamps all its series with one timestamp, so
consecutive scrapes (t0, t1] of a node give one synthetic window of exact integer counter
deltas and histogram bucket deltas, aligned to the scrapes. No extrapolation, no
fractional counts, and one window per node per scrape interval, which is what the
decision path (merge, per-node quorum, safety) already consumes from the direct pull.

Everything from the network is bounded here: series count, samples per series, label
lengths, AZ names per node, timestamps and values. A series that breaks a rule is
skipped and counted as garbage; a node whose windows break the window contract loses
those windows (each is checked by `parse_window`, the one validator). Pure code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from azprobe.contracts import prom
from azprobe.contracts.window import (COUNTER_FIELDS, HISTOGRAM_FIELDS, MAX_COUNT, PathStats, Utilisation, Window,
                                      WindowError, parse_window)

MAX_LABEL_LEN = 253
MAX_SAMPLES_PER_SERIES = 4000  # a lookback of an hour at 1 s scrapes
MAX_TIMESTAMP = 1e11
MAX_LABELS = 32
_SERIES_OWN_LABELS = {"__name__", "le", prom.LABEL_UPPER, prom.LABEL_NODE, prom.LABEL_SRC, prom.LABEL_DST,
                      prom.LABEL_AZ, prom.LABEL_BOOT_ID}

_COUNTER_BY_SERIES = {series: name for name, series in prom.COUNTER_SERIES.items()}
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


Samples = dict[float, float]  # timestamp (s) -> value


@dataclass
class NodeSeries:
    """The raw samples of one node (one scrape target), by kind."""

    node: str
    info: dict[float, tuple[str, str]] = field(default_factory=dict)  # t -> (az, boot_id)
    counters: dict[tuple[str, str, str], Samples] = field(default_factory=dict)  # (src, dst, field)
    buckets: dict[tuple[str, str, str, float], Samples] = field(default_factory=dict)  # (.., upper µs)
    cpu: Samples = field(default_factory=dict)
    mem: Samples = field(default_factory=dict)
    lost: Samples = field(default_factory=dict)
    azs: set[str] = field(default_factory=set)
    count: int = 0  # series read


@dataclass
class ParsedAnswer:
    nodes: dict[str, NodeSeries]  # key: instance + node
    garbage_series: int = 0
    newest: float | None = None  # the newest scrape of any node in the answer


def _label(labels: Mapping, key: str) -> str | None:
    value = labels.get(key)
    if not isinstance(value, str) or not value or len(value) > MAX_LABEL_LEN:
        return None
    return value


def _samples(values: object) -> Samples | None:
    """[[ts, "value"], ...] -> {ts: value}; None when any sample breaks a bound."""
    if not isinstance(values, list) or len(values) > MAX_SAMPLES_PER_SERIES:
        return None
    out: Samples = {}
    last = -math.inf
    for pair in values:
        if not isinstance(pair, list) or len(pair) != 2:
            return None
        ts, raw = pair
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not isinstance(raw, str) or len(raw) > 40:
            return None
        try:
            value = float(raw)
        except ValueError:
            return None
        ts = float(ts)
        if not (0 < ts < MAX_TIMESTAMP) or ts <= last or not math.isfinite(value) or not 0 <= value <= MAX_COUNT:
            return None
        last = ts
        out[round(ts, 3)] = value
    return out


def parse_answer(doc: object, *, max_series: int) -> ParsedAnswer:
    """Validate a /api/v1/query answer to `query_for(...)` and group it by scrape target.
    One node, one vantage point: when several targets carry the same `node` label, the
    first by target labels is kept and the others' series count as garbage."""
    if not isinstance(doc, dict) or doc.get("status") != "success":
        error = doc.get("error") if isinstance(doc, dict) else None
        raise PromAnswerError(f"query failed: {str(error)[:200] if error else 'status is not success'}")
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise PromAnswerError("data: expected {resultType: matrix, result: [...]}")
    result = data["result"]
    if len(result) > max_series:
        raise PromAnswerTooLarge(f"{len(result)} series, more than prometheus.max_series {max_series}")
    answer = ParsedAnswer(nodes={})
    for entry in result:
        if not _add_series(answer, entry):
            answer.garbage_series += 1
    claimed: set[str] = set()
    for key in sorted(answer.nodes):
        series = answer.nodes[key]
        if series.node in claimed:
            del answer.nodes[key]
            answer.garbage_series += series.count
        claimed.add(series.node)
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
    target = sorted((k, v) for k, v in labels.items() if k not in _SERIES_OWN_LABELS)
    samples = _samples(entry.get("values"))
    if not samples:
        return False
    key = "/".join(f"{k}={v}" for k, v in target) + f"/{node_name}"
    node = answer.nodes.get(key)
    if node is None:
        node = answer.nodes[key] = NodeSeries(node=node_name)
    node.count += 1
    if name == prom.INFO_SERIES:
        az, boot_id = _label(labels, prom.LABEL_AZ), _label(labels, prom.LABEL_BOOT_ID)
        if az is None or boot_id is None:
            return False
        for ts in samples:
            node.info[ts] = (az, boot_id)
        return True
    if name in (prom.CPU_SERIES, prom.MEM_SERIES, prom.LOST_SERIES):
        gauge = {prom.CPU_SERIES: node.cpu, prom.MEM_SERIES: node.mem, prom.LOST_SERIES: node.lost}[name]
        gauge.update(samples)
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


def _delta(samples: Samples, t0: float, t1: float, restarted: bool) -> int:
    """The counter's increase over (t0, t1]: a series born after t0 counts from 0, a value
    below the previous one (or a new boot) means the counter restarted from 0."""
    if t1 not in samples:
        return 0
    v1 = samples[t1]
    v0 = samples.get(t0)
    if v0 is None:
        # Absent from the scrape at t0: born since, unless an earlier sample says it
        # existed (a sample missing from the answer): then count from that one.
        earlier = [t for t in samples if t < t1]
        v0 = samples[max(earlier)] if earlier else 0.0
    if restarted or v1 < v0:
        return int(round(v1))
    return int(round(v1 - v0))


@dataclass
class NodeRead:
    windows: list[Window]
    garbage: int  # scrape pairs dropped as garbage
    newest: float | None  # the newest scrape read: the node's next cursor
    gap: bool  # the scrape at the cursor is not in the answer: counts since it are lost


def node_windows(series: NodeSeries, after: float | None) -> NodeRead:
    """Windows for each pair of consecutive scrapes (t0, t1] with t1 > `after` (the
    node's cursor). The node's scrapes are the samples of its info series (present in
    every scrape)."""
    scrapes = sorted(series.info)
    windows: list[Window] = []
    garbage = 0
    newest = after
    gap = after is not None and bool(scrapes) and scrapes[-1] > after and after not in series.info
    if scrapes and (after is None or scrapes[-1] > after):
        newest = scrapes[-1]  # a lone first scrape still sets the cursor: the next delta starts there
    for t0, t1 in zip(scrapes, scrapes[1:]):
        if after is not None and t1 <= after:
            continue
        az, boot_id = series.info[t1]
        restarted = series.info[t0][1] != boot_id
        try:
            windows.append(_window(series, t0, t1, az, boot_id, restarted))
        except WindowError:
            garbage += 1
    return NodeRead(windows, garbage, newest, gap)


def _window(series: NodeSeries, t0: float, t1: float, az: str, boot_id: str, restarted: bool) -> Window:
    paths: dict[tuple[str, str], PathStats] = {}

    def path(src: str, dst: str) -> PathStats:
        p = paths.get((src, dst))
        if p is None:
            p = paths[(src, dst)] = PathStats(src=src, dst=dst)
        return p

    for (src, dst, name), samples in series.counters.items():
        n = _delta(samples, t0, t1, restarted)
        if n:
            setattr(path(src, dst), name, n)
    per_bucket: dict[tuple[str, str, str], dict[float, int]] = {}
    for (src, dst, name, bound), samples in series.buckets.items():
        n = _delta(samples, t0, t1, restarted)
        if n:
            per_bucket.setdefault((src, dst, name), {})[bound] = n
    for (src, dst, name), by_bound in per_bucket.items():
        setattr(path(src, dst), name, prom.histogram_from_deltas(by_bound))
    lost = _delta(series.lost, t0, t1, restarted)
    util = Utilisation(cpu=series.cpu.get(t1, 0.0), mem=series.mem.get(t1, 0.0))
    window = Window(node=series.node, az=az, boot_id=boot_id, seq=int(round(t1 * 1000)), start=t0, end=t1,
                    util=util, paths=sorted((p for p in paths.values() if _active(p)), key=lambda p: (p.src, p.dst)),
                    lost_events=lost)
    return parse_window(window.to_json())  # the one validator: a hostile answer fails here, not later


def _active(p: PathStats) -> bool:
    return any(getattr(p, n) for n in COUNTER_FIELDS) or any(getattr(p, n).counts for n in HISTOGRAM_FIELDS)
