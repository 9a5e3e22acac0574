"""The same decisions from both sources: identical traffic (agents served by the real
agent HTTP code, tests.promagent) reaches one controller by the direct pull and another
through a real Prometheus server scraping the same agents; both must reach the same zone
states in every view, healthy and with az-b sick."""

from __future__ import annotations

import asyncio
import shutil
import time
import urllib.error

import pytest

from azprobe.controller.config import parse_config
from azprobe.controller.main import Controller
from azprobe.dev.promserver import PrometheusServer
from tests.fakeagent import PathSpec
from tests.promagent import SyntheticAgent


@pytest.fixture(autouse=True)
def _prometheus_installed() -> None:
    # A failure, not a skip: `make test` must run the Prometheus path (make setup installs it).
    assert shutil.which("prometheus"), "prometheus missing: run `make setup` (Debian package prometheus)"


AZS = ["az-a", "az-b", "az-c"]
TICK_S = 0.5  # agent windows and Prometheus scrapes
CYCLE_S = 0.5


def _config(agents: dict, prometheus: dict | None = None) -> Controller:
    doc = {
        "controller": {"name": "ctl", "listen": "127.0.0.1:9", "interval_s": CYCLE_S, "evaluation_window_s": 3.0},
        "consul": {"address": "http://127.0.0.1:9"},
        "agents": agents,
        "safety": {"drain_dwell_s": 0, "max_decrease_points": 100, "max_increase_points": 100, "stale_after_s": 5},
        "topology": {"azs": ["az-a", "az-b", "az-c"]},
    }
    if prometheus:
        doc["prometheus"] = prometheus
    return Controller(parse_config(doc))


def _states(outcome) -> dict[str, dict[str, str]]:
    return {view: {az: z.state for az, z in v.zones.items()} for view, v in outcome.views.items()}


async def _until_same(direct: Controller, via_prom: Controller, want, timeout_s: float, hold: int) -> dict:
    """Cycle both until their states are equal and satisfy `want` for `hold` cycles in a
    row; returns those states. Fails with both states at the deadline."""
    deadline = time.monotonic() + timeout_s
    in_a_row, last = 0, ({}, {})
    while time.monotonic() < deadline:
        a, b = _states(await direct.cycle()), _states(await via_prom.cycle())
        last = (a, b)
        in_a_row = in_a_row + 1 if a == b and a and want(a) else 0
        if in_a_row >= hold:
            return a
        await asyncio.sleep(CYCLE_S)  # the controllers' cycle pace, not a synchronisation
    raise AssertionError(f"no agreement within {timeout_s}s: direct {last[0]} vs prometheus {last[1]}")


def _dashboard_answers(prom: PrometheusServer) -> dict[str, dict]:
    """Every PromQL expression of the shipped dashboard, run against the real server."""
    from tests.unit.test_monitoring import _dashboard_exprs

    out = {}
    for expr in _dashboard_exprs():
        query = expr.replace("$__rate_interval", "3s")
        try:
            out[expr] = prom.api("/api/v1/query", query=query)
        except urllib.error.HTTPError as exc:  # 400: Prometheus says why in the body
            out[expr] = {"status": "error", "error": exc.read().decode(errors="replace")}
    return out


def test_direct_and_prometheus_sources_decide_the_same(tmp_path):
    specs = {az: [PathSpec(dst, rtt_ms=0.5, connect_ms=0.4) for dst in AZS] for az in AZS}
    agents = [SyntheticAgent(f"node-{az}", az, specs[az]) for az in AZS]
    urls = [a.serve(TICK_S) for a in agents]
    try:
        with PrometheusServer(tmp_path / "prom", [u.removeprefix("http://") for u in urls],
                              scrape_interval_s=TICK_S) as prom:
            direct = _config({"static": urls})
            via_prom = _config({"source": "prometheus"}, {"url": prom.url, "lookback_s": 5, "query_timeout_s": 2})

            async def run() -> tuple[dict, dict]:
                try:
                    healthy = await _until_same(direct, via_prom, lambda s: all(
                        st == "ok" for st in s[""].values()) and set(s[""]) == set(AZS), timeout_s=60, hold=4)
                    for az in AZS:  # az-b turns sick on every node's path to it
                        for spec in specs[az]:
                            if spec.dst == "az-b":
                                spec.failures, spec.rtt_ms, spec.syn_retrans = 30, 210.0, 20
                    sick = await _until_same(direct, via_prom, lambda s: s[""]["az-b"] != "ok", timeout_s=60, hold=4)
                    return healthy, sick
                finally:
                    await direct.collector.close()
                    await via_prom.collector.close()

            healthy, sick = asyncio.run(run())
            answers = _dashboard_answers(prom)
    finally:
        for a in agents:
            a.stop()
    assert set(healthy) == {"", *AZS}  # the global view and one per source AZ, from both sources
    assert sick[""]["az-b"] == "degraded" and sick[""]["az-a"] == sick[""]["az-c"] == "ok", sick
    # The dashboard's queries are valid PromQL, and the per-path P95 panel shows real paths.
    assert all(a["status"] == "success" for a in answers.values()), answers
    p95 = next(a for e, a in answers.items() if "azprobe_path_rtt_seconds_bucket" in e)["data"]["result"]
    by_path = {(r["metric"]["src_az"], r["metric"]["dst_az"]): float(r["value"][1]) for r in p95}
    assert by_path[("az-a", "az-b")] > 0.1 > by_path[("az-a", "az-c")], by_path  # 210 ms vs 0.5 ms
    # Every scrape was read: the adaptive query range never lost a node's previous scrape.
    assert via_prom.collector.counters.gap_events == 0 and via_prom.collector.counters.windows_garbage == 0
    # The node counts the Prometheus source saw are the agents themselves.
    assert {c.node for c in via_prom.collector.cursors.values()} == {f"node-{az}" for az in AZS}
