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
    def gauges(self) -> dict[str, float]: ...
    def program_stats(self) -> dict[str, tuple[int, int]]: ...


class AgentCollector:
    """Prometheus view of the agent's cumulative totals (read at scrape time)."""

    def __init__(self, state: MetricsSource) -> None:
        self.state = state

    def collect(self) -> Iterable:
        ident = self.state.identity()
        node = ident["node"]
        info = GaugeMetricFamily(prom.INFO_SERIES, "The agent's identity (value 1)",
                                 labels=["node", "az", "boot_id"])
        info.add_metric([node, ident["az"], ident["boot_id"]], 1.0)
        yield info
        util = self.state.latest_util()
        if util is not None:
            for series, value, what in ((prom.CPU_SERIES, util.cpu, "CPU"), (prom.MEM_SERIES, util.mem, "memory")):
                gauge = GaugeMetricFamily(series, f"Node {what} utilisation (0..1) of the latest window",
                                          labels=["node"])
                gauge.add_metric([node], value)
                yield gauge
        gauges = self.state.gauges()
        lost = CounterMetricFamily(prom.LOST_FAMILY, "Probe events the ring buffer had no room for", labels=["node"])
        lost.add_metric([node], gauges.get("lost_events_total", 0.0))
        yield lost
        yield from self._paths(node)
        events = CounterMetricFamily("azprobe_events", "events sent on the ring buffer", labels=["kind"])
        for kind, n in sorted(self.state.event_totals().items()):
            events.add_metric([kind], n)
        yield events
        stats = self.state.program_stats()
        run_time = CounterMetricFamily("azprobe_bpf_run_time_ns", "BPF handler run time (needs "
                                       "sysctl kernel.bpf_stats_enabled=1)", labels=["prog"])
        run_count = CounterMetricFamily("azprobe_bpf_run_count", "BPF handler runs (needs "
                                        "sysctl kernel.bpf_stats_enabled=1)", labels=["prog"])
        for prog, (ns, count) in sorted(stats.items()):
            run_time.add_metric([prog], ns)
            run_count.add_metric([prog], count)
        yield run_time
        yield run_count
        for name, value in sorted(gauges.items()):
            yield GaugeMetricFamily(f"azprobe_{name}", name.replace("_", " "), value=value)

    def _paths(self, node: str) -> Iterable:
        totals = self.state.path_totals()
        names = sorted({name for values in totals.values() for name in values})
        for name in names:
            family = CounterMetricFamily(f"azprobe_path_{name}", f"{name} per path (src AZ -> dst AZ)",
                                         labels=list(prom.PATH_LABELS))
            for (src, dst), values in sorted(totals.items()):
                family.add_metric([node, src, dst], values.get(name, 0))
            yield family
        hists = self.state.path_histograms()
        for field_name in HISTOGRAM_FIELDS:
            family = HistogramMetricFamily(prom.HISTOGRAM_FAMILY[field_name],
                                           f"{field_name} per path, seconds (loglin-16 coarsened to "
                                           f"{prom.BUCKETS_PER_OCTAVE} buckets per octave)",
                                           labels=list(prom.PATH_LABELS))
            for (src, dst), by_field in sorted(hists.items()):
                hist = by_field[field_name]
                # sum_value: µs -> s from the bucket lower bounds (the exact sum is not kept).
                approx_sum = sum(lower * n for lower, n in hist.counts.items()) / 1e6
                family.add_metric([node, src, dst], prom.cumulative_buckets(hist), sum_value=approx_sum)
            yield family
            hits = CounterMetricFamily(prom.HITS_FAMILY[field_name],
                                       f"{field_name} samples per bucket of {prom.HISTOGRAM_FAMILY[field_name]}, "
                                       "not cumulative, only buckets with samples (the controller's Prometheus source)",
                                       labels=[*prom.PATH_LABELS, prom.LABEL_UPPER])
            for (src, dst), by_field in sorted(hists.items()):
                for upper, n in prom.bucket_hits(by_field[field_name]):
                    hits.add_metric([node, src, dst, upper], n)
            yield hits
