"""`azprobe explain` against a weights document in a real devconsul."""

from __future__ import annotations

import json
import subprocess
import sys

from azprobe.clients.consul import ConsulSettings, make_client
from azprobe.contracts.weights import ZoneWeights
from azprobe.controller.leader import LeaderElection
from azprobe.controller.publish import GLOBAL_VIEW, Publisher, WeightsView
from tests.controller_harness import ROOT


def _explain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "explain", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)


def _publish(url: str) -> None:
    settings = ConsulSettings(address=url)
    client = make_client(settings)
    election = LeaderElection(client, settings, name="ctl-1", address="127.0.0.1:9741", lock_delay_s=1)
    election.tick()
    zones = {
        "az-a": ZoneWeights(weight=1.0, share=85, health=0.98, success=0.9992, p95_ms=12.3, util=0.4, samples=5000,
                            state="ok", reasons=("health 0.980", "health 0.980 >= 0.90: ok")),
        "az-b": ZoneWeights(weight=0.6, share=15, health=0.74, success=0.9876, p95_ms=41.7, util=None, samples=4800,
                            state="degraded", reasons=("health 0.740 (mostly failures)", "failures 1.24%")),
    }
    publisher = Publisher(client, settings, leader_name="ctl-1", model_name="default")
    publisher.start_term()
    views = {GLOBAL_VIEW: WeightsView("degraded", zones), "az-a": WeightsView("degraded", zones, source_az="az-a")}
    assert publisher.publish(election.session_id, views) is not None


def test_explain_prints_inputs_and_reasons(devconsul):
    _publish(devconsul.url)
    out = _explain("--consul", devconsul.url)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "generation 1 by ctl-1" in text and "state degraded" in text
    assert "az-b: share 15 %, weight 0.600, health 0.740, state degraded" in text
    assert "success 98.76 %, p95 41.7 ms, util unknown, samples 4800" in text
    assert "    - failures 1.24%" in text and "    - health 0.980 >= 0.90: ok" in text

    one = _explain("az-b", "--json", "--consul", devconsul.url)
    assert one.returncode == 0, one.stderr
    doc = json.loads(one.stdout)
    assert list(doc["zones"]) == ["az-b"] and doc["effective_state"] == "degraded"
    assert doc["zones"]["az-b"]["reasons"][0] == "health 0.740 (mostly failures)"

    view = _explain("--from", "az-a", "--consul", devconsul.url)
    assert view.returncode == 0 and "as seen from az-a" in view.stdout


def test_explain_errors_are_one_line(devconsul):
    missing = _explain("--consul", devconsul.url)
    assert missing.returncode == 1 and "no weights document at 'azprobe/v1/weights'" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    _publish(devconsul.url)
    unknown = _explain("az-z", "--consul", devconsul.url)
    assert unknown.returncode == 2 and "AZ: 'az-z' is not in the document" in unknown.stderr
    assert "az-a, az-b" in unknown.stderr
    down = _explain("--consul", "http://127.0.0.1:9")
    assert down.returncode == 1 and "cannot reach Consul" in down.stderr
