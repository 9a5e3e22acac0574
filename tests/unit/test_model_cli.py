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
AZPROBE = [sys.executable, "-m", "azprobe.cli"]


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
