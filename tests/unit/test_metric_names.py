"""The naming rules of both daemons' /metrics (azprobe/contracts/prom.py): derived names
come out right for fields and scalars nobody has written yet, every exported family is
defined there with a help text, and docs/contracts.md lists every defined series."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from azprobe.agent.config import load_agent_config
from azprobe.agent.main import Agent
from azprobe.agent.prom import AgentCollector
from azprobe.agent.windows import BPF_COUNTER_FIELDS
from azprobe.contracts import prom
from azprobe.contracts.sketch import Histogram
from azprobe.contracts.weights import ZoneWeights
from azprobe.contracts.window import Utilisation
from azprobe.controller.window_source import CollectCounters
from azprobe.controller.detector import DetectorResult
from azprobe.controller.metrics import ControllerMetrics
from azprobe.controller.publish import PublishCounters
from azprobe.controller.topology import TopologyCounters

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "docs/contracts.md"


def _stub_agent(tmp_path: Path) -> Agent:
    """The real Agent (its gauges() and totals) on a stub collector."""
    config = tmp_path / "agent.toml"
    config.write_text('[node]\nname = "n1"\naz = "az-a"\n[topology]\naz-a = ["198.18.0.0/24"]\n'
                      'az-b = ["198.18.1.0/24"]\n')
    probe = SimpleNamespace(lost_events=2, untracked_connects=1, rtt_sample_ticks=4, hooks="btf",
                            program_stats=lambda: {"tcp_probe": (1_500, 3)})
    return Agent(load_agent_config(config), probe=probe)  # type: ignore[arg-type]


class _FullState:
    """An agent state with every kind of series: the Agent's own scalars, path totals of
    every counter, filled histograms, events and BPF stats."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def path_totals(self) -> dict:
        return {("az-a", "az-b"): {name: 3 for name in BPF_COUNTER_FIELDS}}

    def path_histograms(self) -> dict:
        return {("az-a", "az-b"): {"rtt_us": Histogram({1024: 2, 20_000: 1}), "connect_us": Histogram({300: 1})}}

    def identity(self) -> dict[str, str]:
        return self.agent.identity()

    def latest_util(self) -> Utilisation:
        return Utilisation(0.25, 0.5)

    def event_totals(self) -> dict[str, int]:
        return {"conn_refused": 1, "rto": 2}

    def gauges(self) -> dict[str, float]:
        return self.agent.gauges()

    def program_stats(self) -> dict[str, tuple[int, int]]:
        return self.agent.program_stats()


def agent_scrape(tmp_path: Path) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(_FullState(_stub_agent(tmp_path))))
    return generate_latest(registry).decode()


def controller_scrape() -> str:
    metrics = ControllerMetrics()
    metrics.add_totals({prom.COLLECT_PREFIX: CollectCounters, prom.KV_PREFIX: PublishCounters,
                        prom.TOPOLOGY_PREFIX: TopologyCounters})
    metrics.observe_zones({"az-a": ZoneWeights(weight=1.0, share=100, health=1.0, success=1.0, p95_ms=12.5, util=0.1,
                                                samples=100, state="ok", reasons=())})
    metrics.observe_spikes({"az-a": DetectorResult(spike=True, reason="", current=3, lam=1.0, p95=2.0,
                                                   upper_band=3.0, warm=True)})
    metrics.agents.labels("up").set(1)
    metrics.cycle.observe(0.1)
    metrics.pull.observe(0.01)
    return metrics.render().decode()


def _families(text: str) -> dict[str, tuple[str, str]]:
    return {f.name: (f.type, f.documentation) for f in text_string_to_metric_families(text)}


DEFINED = {f.name: f for f in prom.defined_families()}


def test_defined_families_are_unique_and_follow_the_rules():
    families = prom.defined_families()
    assert len(DEFINED) == len(families)
    for f in families:
        assert re.fullmatch(r"azprobe_[a-z0-9_]+", f.name) and f.kind in (prom.COUNTER, prom.GAUGE, prom.HISTOGRAM)
        assert not f.name.endswith("_total"), f.name  # a counter's family name; the exposition adds it
        assert not re.search(r"_(ms|us|ns)(_|$)", f.name), f.name  # base units only
        assert f.help and f.help.replace(" ", "_").lower() != f.name.removeprefix("azprobe_"), f.name


@pytest.mark.parametrize("scrape", ["agent", "controller"])
def test_every_exported_family_is_defined_with_its_type_and_help(scrape, tmp_path):
    text = agent_scrape(tmp_path) if scrape == "agent" else controller_scrape()
    scraped = _families(text)
    assert len(scraped) > 15
    for name, (kind, text_help) in scraped.items():
        assert name in DEFINED, f"{name} is not defined in azprobe.contracts.prom"
        assert (kind, text_help) == (DEFINED[name].kind, DEFINED[name].help), name


@pytest.mark.parametrize("scrape", ["agent", "controller"])
def test_a_full_synthetic_scrape_passes_promtool(scrape, tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run `make setup` (Debian package prometheus)"
    text = agent_scrape(tmp_path) if scrape == "agent" else controller_scrape()
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_lost_events_is_one_series_with_the_node_label(tmp_path):
    text = agent_scrape(tmp_path)
    lost = [s for f in text_string_to_metric_families(text) for s in f.samples if "lost_events" in s.name]
    assert [(s.name, s.labels, s.value) for s in lost] == [(prom.LOST.series, {"node": "n1"}, 2.0)]


def test_bpf_run_time_is_exported_in_seconds(tmp_path):
    samples = {s.name: s.value for f in text_string_to_metric_families(agent_scrape(tmp_path)) for s in f.samples}
    assert samples[prom.BPF_RUN_TIME.series] == pytest.approx(1.5e-6)
    assert samples[prom.BPF_RUN_COUNT.series] == 3


def test_zone_rtt_p95_is_exported_in_seconds():
    samples = {s.name: s.value for f in text_string_to_metric_families(controller_scrape()) for s in f.samples}
    assert samples[prom.ZONE_RTT_P95.series] == pytest.approx(0.0125)
    assert not any(name.endswith("_created") for name in samples)


def test_agent_scalars_follow_one_rule():
    counter, gauge = prom.agent_scalar("untracked_connects_total"), prom.agent_scalar("window_seq")
    assert (counter.name, counter.kind, counter.series) == ("azprobe_untracked_connects", "counter",
                                                            "azprobe_untracked_connects_total")
    assert (gauge.name, gauge.kind, gauge.series) == ("azprobe_window_seq", "gauge", "azprobe_window_seq")
    with pytest.raises(KeyError, match="'http_busy_total' has no help text: add it to azprobe.contracts.prom"):
        prom.agent_scalar("http_busy_total")


def test_every_scalar_the_agent_reports_has_a_defined_family(tmp_path):
    for key in _stub_agent(tmp_path).gauges():
        assert prom.agent_scalar(key).name in DEFINED


def test_every_counter_field_the_agent_keeps_is_a_defined_path_counter():
    assert set(BPF_COUNTER_FIELDS) == set(prom.PATH_COUNTERS)


def test_a_new_totals_field_comes_out_right(monkeypatch):
    @dataclasses.dataclass
    class Counters:
        reads: int = 4
        busy_total: int = 1  # an author who wrote the suffix gets it once
        label: str = "not a counter"

    monkeypatch.setitem(prom._TOTALS_HELP, "azprobe_test", {"reads": "Reads", "busy_total": "Busy answers"})
    metrics = ControllerMetrics()
    metrics.add_totals({"azprobe_test": Counters})
    samples = {s.name: s.value for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}
    assert (samples["azprobe_test_reads_total"], samples["azprobe_test_busy_total"]) == (4, 1)
    assert not any("total_total" in name or "label" in name for name in samples)


def test_a_totals_field_without_help_fails_at_registration():
    @dataclasses.dataclass
    class Counters:
        windows_ingested: int = 0
        undocumented: int = 0

    metrics = ControllerMetrics()
    with pytest.raises(KeyError, match=r"azprobe_controller_collect_undocumented: no help text; add 'undocumented' "
                                       r"to azprobe.contracts.prom._TOTALS_HELP\['azprobe_controller_collect'\]"):
        metrics.add_totals({prom.COLLECT_PREFIX: Counters})


def test_the_controllers_counters_all_have_help():
    for prefix, counters in ((prom.COLLECT_PREFIX, CollectCounters()), (prom.KV_PREFIX, PublishCounters()),
                             (prom.TOPOLOGY_PREFIX, TopologyCounters())):
        defined = {name.removeprefix(f"{prefix}_") for name in DEFINED if name.startswith(f"{prefix}_")}
        assert defined == {f.name for f in dataclasses.fields(counters)}, prefix


def _documented() -> dict[str, str]:
    """Series named in the first column of docs/contracts.md's "Metrics" tables -> type column."""
    section = CONTRACTS.read_text().split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`azprobe_"):
            for name in re.findall(r"`(azprobe_[a-z0-9_]+)`", cells[0]):
                out[name] = cells[1]
    return out


def test_the_contracts_doc_lists_every_defined_series_with_its_type():
    documented = _documented()
    assert set(documented) == {f.series for f in DEFINED.values()}
    for f in DEFINED.values():
        assert documented[f.series].startswith(f.kind), (f.series, documented[f.series])


def _documented_labels() -> dict[str, set[str]]:
    """Series of docs/contracts.md's "Metrics" tables -> the label names of their labels
    column: backticked names outside parentheses, and `path` for node, src_az, dst_az."""
    section = CONTRACTS.read_text().split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) >= 3 and cells[0].startswith("`azprobe_"):
            column = re.sub(r"\([^()]*\)", "", cells[2])
            labels = set(re.findall(r"`([a-z_]+)`", column))
            if re.search(r"(?<![`\w])path(?![`\w])", column):
                labels |= set(prom.PATH_LABELS)
            for name in re.findall(r"`(azprobe_[a-z0-9_]+)`", cells[0]):
                out[name] = labels
    return out


def test_the_contracts_doc_gives_every_series_its_labels():
    documented = _documented_labels()
    wrong = {f.series: (sorted(documented.get(f.series, ())), sorted(f.labels)) for f in DEFINED.values()
             if documented.get(f.series) != set(f.labels)}
    assert not wrong, f"docs/contracts.md labels (documented, defined): {wrong}"
