"""The agent's /metrics: cumulative per-path totals in the names and buckets of
azprobe.contracts.prom, so a Prometheus scraping agents carries what the controller's
model needs (connect outcomes, SYN retransmits, retransmits, RTOs, RTT and connect
latency histograms), and the controller's Prometheus source can rebuild windows from it.

Cardinality is bounded by the topology: labels are the node's name and AZ names (at most
16 ids plus "other" per side), never addresses or ports.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from azprobe.contracts import prom
from azprobe.contracts.sketch import Histogram
from azprobe.contracts.window import HISTOGRAM_FIELDS, Utilisation


class MetricsSource(Protocol):
    """What the collector reads from the agent (agent.main.Agent implements it)."""

    def path_totals(self) -> dict[tuple[str, str], dict[str, int]]: ...
    def path_histograms(self) -> dict[tuple[str, str], dict[str, Histogram]]: ...
    def identity(self) -> dict[str, str]: ...
    def latest_util(self) -> Utilisation | None: ...
    def event_totals(self) -> dict[str, int]: ...
    def gauges(self) -> dict[str, float]: ...  # keys ending in `_total` are counters (contracts.prom)
    def program_stats(self) -> dict[str, tuple[int, int]]: ...


_KINDS = {prom.COUNTER: CounterMetricFamily, prom.GAUGE: GaugeMetricFamily}


def _family(family: prom.Family, **kwargs: float) -> CounterMetricFamily | GaugeMetricFamily:
    """An empty family (or, with `value=`, a one-sample unlabelled one) as defined."""
    labels = {"labels": list(family.labels)} if family.labels else {}
    return _KINDS[family.kind](family.name, family.help, **labels, **kwargs)


class AgentCollector:
    """Prometheus view of the agent's cumulative totals (read at scrape time). Names,
    types and help texts come from azprobe.contracts.prom."""

    def __init__(self, state: MetricsSource) -> None:
        self.state = state

    def collect(self) -> Iterable:
        ident = self.state.identity()
        node = ident["node"]
        info = _family(prom.INFO)
        info.add_metric([node, ident["az"], ident["boot_id"]], 1.0)
        yield info
        util = self.state.latest_util()
        if util is not None:
            for family, value in ((prom.CPU, util.cpu), (prom.MEM, util.mem)):
                gauge = _family(family)
                gauge.add_metric([node], value)
                yield gauge
        scalars = self.state.gauges()
        for key, family in prom.NODE_SCALARS.items():
            labelled = _family(family)
            labelled.add_metric([node], scalars.get(key, 0.0))
            yield labelled
        yield from self._paths(node)
        events = _family(prom.EVENTS)
        for kind, n in sorted(self.state.event_totals().items()):
            events.add_metric([kind], n)
        yield events
        run_time, run_count = _family(prom.BPF_RUN_TIME), _family(prom.BPF_RUN_COUNT)
        for prog, (ns, count) in sorted(self.state.program_stats().items()):
            run_time.add_metric([prog], ns / 1e9)
            run_count.add_metric([prog], count)
        yield run_time
        yield run_count
        for key, value in sorted(scalars.items()):
            if key not in prom.NODE_SCALARS:
                yield _family(prom.agent_scalar(key), value=value)

    def _paths(self, node: str) -> Iterable:
        totals = self.state.path_totals()
        names = sorted({name for values in totals.values() for name in values})
        for name in names:
            family = _family(prom.PATH_COUNTERS[name])
            for (src, dst), values in sorted(totals.items()):
                family.add_metric([node, src, dst], values.get(name, 0))
            yield family
        hists = self.state.path_histograms()
        for field_name in HISTOGRAM_FIELDS:
            defined = prom.PATH_HISTOGRAMS[field_name]
            family = HistogramMetricFamily(defined.name, defined.help, labels=list(defined.labels))
            for (src, dst), by_field in sorted(hists.items()):
                hist = by_field[field_name]
                # sum_value: µs -> s from the bucket lower bounds (the exact sum is not kept).
                approx_sum = sum(lower * n for lower, n in hist.counts.items()) / 1e6
                family.add_metric([node, src, dst], prom.cumulative_buckets(hist), sum_value=approx_sum)
            yield family
            hits = _family(prom.PATH_HITS[field_name])
            for (src, dst), by_field in sorted(hists.items()):
                for upper, n in prom.bucket_hits(by_field[field_name]):
                    hits.add_metric([node, src, dst, upper], n)
            yield hits
