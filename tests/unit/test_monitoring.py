"""What ships next to Prometheus (monitoring/): the alerting rules pass `promtool check
rules` and their unit tests (`promtool test rules`), and every metric the rules and the
Grafana dashboard name is one the controller or the agent really exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from azprobe.agent.prom import AgentCollector
from azprobe.contracts import prom
from azprobe.contracts.weights import ZoneWeights
from azprobe.controller.window_source import CollectCounters
from azprobe.controller.detector import DetectorResult
from azprobe.controller.metrics import ControllerMetrics
from azprobe.controller.publish import PublishCounters
from azprobe.controller.topology import TopologyCounters
from tests.fakeagent import PathSpec
from tests.promagent import SyntheticAgent

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "monitoring/prometheus/azprobe-rules.yml"
RULES_TEST = ROOT / "monitoring/prometheus/azprobe-rules.test.yml"
DASHBOARD = ROOT / "monitoring/grafana/azprobe.json"
PROMETHEUS_OWN = {"up"}  # series Prometheus itself makes for every target
METRIC_NAME = re.compile(r"\b(azprobe[_:][a-z0-9_:]*)\b")
STRING = re.compile(r'"[^"]*"')  # label values such as job="azprobe-agent" are not names


def names_in(expr: str) -> set[str]:
    return set(METRIC_NAME.findall(STRING.sub('""', expr)))


def _promtool(*args: str) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run `make setup` (Debian package prometheus)"
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, cwd=RULES.parent)


def test_rules_pass_promtool_check():
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_rules_pass_their_promtool_unit_tests():
    result = _promtool("test", "rules", str(RULES_TEST))
    assert result.returncode == 0, result.stdout + result.stderr
    # Every alert the rules define is exercised by at least one test case.
    tested = set(re.findall(r"alertname: (\w+)", RULES_TEST.read_text()))
    assert tested == set(_alerts()), set(_alerts()) - tested


def _alerts() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"] if "alert" in r}


def _rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r["expr"] for g in groups for r in g["rules"]]


def _recorded() -> set[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["record"] for g in groups for r in g["rules"] if "record" in r}


def _dashboard_exprs() -> list[str]:
    out: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr" and isinstance(value, str):
                    out.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(json.loads(DASHBOARD.read_text()))
    return out


def exported_names() -> set[str]:
    """Series names the controller's and the agent's /metrics really expose."""
    metrics = ControllerMetrics()
    metrics.add_totals({prom.COLLECT_PREFIX: CollectCounters, prom.KV_PREFIX: PublishCounters,
                        prom.TOPOLOGY_PREFIX: TopologyCounters})
    metrics.observe_zones({"az-a": ZoneWeights(weight=1.0, share=100, health=1.0, success=1.0, p95_ms=1.0, util=0.1,
                                                samples=100, state="ok", reasons=())})
    metrics.observe_spikes({"az-a": DetectorResult(spike=True, reason="", current=3, lam=1.0, p95=2.0,
                                                   upper_band=3.0, warm=True)})
    metrics.agents.labels("up").set(1)
    metrics.cycle.observe(0.1)
    texts = [metrics.render().decode()]
    agent = SyntheticAgent("n1", "az-a", [PathSpec("az-b")])
    agent.tick()
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agent))
    texts.append(generate_latest(registry).decode())
    names = set()
    for text in texts:
        for family in text_string_to_metric_families(text):
            names |= {s.name for s in family.samples}
    return names


def test_dashboard_parses_and_has_the_promised_panels():
    doc = json.loads(DASHBOARD.read_text())
    titles = " | ".join(p["title"] for p in doc["panels"])
    for promised in ("share", "Health", "P95", "Detection"):
        assert promised in titles, titles
    assert all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in doc["panels"])


def test_every_metric_named_by_rules_and_dashboard_exists():
    names = exported_names() | PROMETHEUS_OWN
    assert "azprobe_path_rtt_seconds_bucket" in names and "azprobe_controller_leader" in names
    known = names | _recorded()
    exprs = _rule_exprs() + _dashboard_exprs()
    assert len(exprs) > 15
    used = set().union(*(names_in(e) for e in exprs))
    assert used and used <= known, sorted(used - known)
    assert "up" in " ".join(exprs)


@pytest.mark.parametrize("expr", ["azprobe_nope_total", "rate(azprobe_path_rtt_us_bucket[1m])"])
def test_the_name_check_would_catch_a_typo(expr):
    assert names_in(expr) - (exported_names() | _recorded())
