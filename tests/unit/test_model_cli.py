"""`azprobe model eval`: the real command line, output validated by the weights contract."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from azprobe.contracts.weights import ZoneWeights

DATA = Path(__file__).resolve().parent.parent / "data"
AZPROBE = [sys.executable, "-m", "azprobe.commands.cli"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*AZPROBE, "model", "eval", *args], capture_output=True, text=True, timeout=60)


def zones_of(out: str) -> dict:
    doc = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in output"))
    for zone in doc["zones"].values():
        ZoneWeights(**zone)  # every zone is a valid weights-document zone
    assert sum(z["share"] for z in doc["zones"].values()) == 100
    return doc


def test_documents_example_default_model():
    r = run(str(DATA / "stats_documents_example.json"))
    assert r.returncode == 0, r.stderr
    doc = zones_of(r.stdout)
    assert doc["model"] == "default"
    a, b = doc["zones"]["az-a"], doc["zones"]["az-b"]
    assert abs(a["share"] - 85) <= 5 and abs(b["share"] - 15) <= 5
    assert b["state"] == "degraded" and a["state"] == "ok"
    assert any("failures 1.24%" in r for r in b["reasons"])


def test_drain_example_and_seed_v1_contrast(tmp_path):
    stats = str(DATA / "stats_drain_200ms_5pct.json")
    default = zones_of(run(stats).stdout)
    seed = zones_of(run("--model", "seed-v1", stats).stdout)
    assert default["zones"]["az-c"]["share"] <= 10
    assert seed["model"] == "seed-v1"
    assert seed["zones"]["az-c"]["share"] >= 25  # why the default model exists
    assert math.isclose(seed["zones"]["az-c"]["weight"], math.exp(-2 * (1 - seed["zones"]["az-c"]["health"])),
                        rel_tol=1e-6)


def test_safety_flag_runs_the_rules(tmp_path):
    stats = tmp_path / "s.json"
    stats.write_text(json.dumps({"zones": {
        "az-a": {"success": 0.5, "p95_ms": 300, "samples": 100},
        "az-b": {"success": 0.6, "p95_ms": 300, "samples": 100},
        "az-c": {"success": 0.999, "p95_ms": 10, "samples": 5}}}))
    doc = zones_of(run("--safety", str(stats)).stdout)
    assert doc["state"] == "panic"  # both zones with evidence degraded; az-c has too few samples
    assert {z["share"] for z in doc["zones"].values()} == {33, 34}


def test_config_file_coefficients(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\nname = "default"\n[model.default]\nshare_exponent = 1.0\n')
    doc = zones_of(run("--config", str(cfg), str(DATA / "stats_documents_example.json")).stdout)
    assert doc["zones"]["az-b"]["share"] > 40  # exponent 1: shares follow the decay weight


@pytest.mark.parametrize(
    "content,field",
    [
        ('{"zones": {"az-a": {"success": 2}}}', "zones.az-a.success"),
        ('{"zones": {"az-a": {"p95_ms": NaN}}}', "NaN"),
        ('{"zones": {}}', "zones"),
        ("not json", "not valid JSON"),
    ],
)
def test_bad_stats_exit_2_naming_the_field(tmp_path, content, field):
    stats = tmp_path / "bad.json"
    stats.write_text(content)
    r = run(str(stats))
    assert r.returncode == 2
    assert field in r.stderr
    assert r.stderr.startswith("azprobe: ") and r.stderr.count("\n") == 1


def test_bad_model_name_and_missing_file_exit_2(tmp_path):
    r = run("--model", "nope", str(DATA / "stats_documents_example.json"))
    assert r.returncode == 2 and "model.name" in r.stderr
    r = run(str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "missing.json" in r.stderr


def _stats(tmp_path, doc: dict, name: str = "s.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


SLOW_B = {"az-a": {"success": 1.0, "p95_ms": 10, "samples": 500}, "az-b": {"success": 1.0, "p95_ms": 40, "samples": 500},
          "az-c": {"success": 0.5, "p95_ms": 10, "samples": 500}}


def test_safety_decides_as_the_daemon_healthy_band_included(tmp_path):
    """az-b is healthy but slower (health ~0.97): the quorum's healthy band gives it az-a's
    weight, as the daemon does; [quorum] healthy_band = 0 from the config lets weight^6 split them."""
    stats = _stats(tmp_path, {"zones": SLOW_B})
    doc = zones_of(run("--safety", stats).stdout)
    shares = {az: z["share"] for az, z in doc["zones"].items()}
    assert abs(shares["az-a"] - shares["az-b"]) <= 1 and shares["az-c"] == 1, shares
    assert any(r.startswith("quorum: 0 of 1 nodes") for r in doc["zones"]["az-a"]["reasons"])
    cfg = tmp_path / "c.toml"
    cfg.write_text("[quorum]\nhealthy_band = 0.0\n")
    split = {az: z["share"] for az, z in zones_of(run("--safety", "--config", str(cfg), stats).stdout)["zones"].items()}
    assert split["az-a"] - split["az-b"] >= 10, split


def test_per_node_form_runs_the_quorum(tmp_path):
    healthy = {az: {"success": 1.0, "p95_ms": 10, "samples": 500} for az in ("az-a", "az-b", "az-c")}
    nodes = [{"node": f"n-{az}-{i}", "az": az, "zones": healthy} for az in ("az-a", "az-b", "az-c") for i in range(3)]
    nodes[0]["zones"] = {**healthy, "az-b": {"success": 0.0, "p95_ms": 2000, "samples": 500}}  # one liar
    doc = zones_of(run("--safety", _stats(tmp_path, {"nodes": nodes})).stdout)
    assert doc["state"] == "ok" and sorted(z["share"] for z in doc["zones"].values()) == [33, 33, 34]
    assert doc["zones"]["az-b"]["reasons"][0].startswith("quorum: 1 of 9 nodes see it degraded")


@pytest.mark.parametrize(
    "doc,args,field",
    [
        ({"nodes": [{"node": "n1", "az": "az-a", "zones": {}}]}, (), "nodes: the per-node form needs --safety"),
        ({"nodes": [{"node": "n1", "az": "az-a"}, {"node": "n1", "az": "az-b"}]}, ("--safety",), "nodes[1].node"),
        ({"nodes": [{"node": "n1", "az": "az a"}]}, ("--safety",), "nodes[0].az"),
        ({"nodes": [{"node": "n1", "az": "az-a", "zones": {"az-a": {"samples": -1}}}]}, ("--safety",),
         "nodes[0].zones.az-a.samples"),
        ({"nodes": [{"node": "n1", "az": "az-a", "extra": 1}]}, ("--safety",), "nodes[0].extra"),
        ({"nodes": [], "zones": {}}, ("--safety",), "both 'zones' and 'nodes'"),
        ({"zones": {f"z{i}": {} for i in range(65)}}, (), "65 zones exceed 64"),
        ({"zones": {"a" * 64: {}}}, (), "has 64 characters"),
    ],
)
def test_bad_model_input_exits_2_naming_the_field(tmp_path, doc, args, field):
    r = run(*args, _stats(tmp_path, doc))
    assert r.returncode == 2, r.stdout
    assert field in r.stderr and r.stderr.startswith("azprobe: ") and r.stderr.count("\n") == 1


def test_config_quorum_is_checked_like_the_daemons(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[quorum]\nhealthy_bnd = 0.1\n")
    r = run("--safety", "--config", str(cfg), str(DATA / "stats_documents_example.json"))
    assert r.returncode == 2 and "quorum.healthy_bnd" in r.stderr
