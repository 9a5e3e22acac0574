"""The weight models: seed-v1 exactly as the documents say, the default model's required
behaviour (documents' example, drain, noise), shares rounding, stats parsing, config."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from azprobe.config import Section
from azprobe.errors import ConfigError
from azprobe.contracts.stats import StatsError, ZoneStats, parse_stats_document
from azprobe.contracts.weights import MIN_WEIGHT
from azprobe.controller.models import (
    DefaultModel,
    DefaultModelConfig,
    SeedV1Model,
    equal_shares,
    load_model,
    shares_from_weights,
)

DATA = Path(__file__).resolve().parent.parent / "data"


def model_shares(model, zones):
    verdicts = model.evaluate(zones)
    return shares_from_weights({az: v.share_raw for az, v in verdicts.items()}), verdicts


def load_stats(name: str) -> dict[str, ZoneStats]:
    return parse_stats_document(json.loads((DATA / name).read_text()))


# ------------------------------------------------------------------ seed-v1


@pytest.mark.parametrize(
    "success,p95,util",
    [(1.0, 10.0, 0.0), (0.9992, 12.3, 0.4), (0.95, 212.0, 0.38), (0.5, 425.0, 0.9), (0.0, 5000.0, 1.0)],
)
def test_seed_v1_is_the_documents_formula(success, p95, util):
    v = SeedV1Model().evaluate({"z": ZoneStats(success, p95, util, 0.0, 0.0, 100)})["z"]
    lnorm = min(max((800 - p95) / 750, 0.0), 1.0)
    h = 0.40 * success + 0.35 * lnorm + 0.25 * (1 - util)
    assert v.health == pytest.approx(h, abs=1e-12)
    assert v.weight == pytest.approx(math.exp(-2 * (1 - h)), abs=1e-12)
    assert v.share_raw == v.weight  # the documents' shares are proportional to the weight


def test_seed_v1_lnorm_saturates_inside_a_region():
    # The reason the default model exists: 12 ms and 42 ms are the same to seed-v1.
    m = SeedV1Model()
    a = m.evaluate({"a": ZoneStats(1.0, 12.0, 0.4)})["a"]
    b = m.evaluate({"b": ZoneStats(1.0, 42.0, 0.4)})["b"]
    assert a.health == b.health


def test_seed_v1_keeps_most_weight_on_a_sick_zone():
    # +200 ms / 5 % loss keeps ~85 % of a healthy zone's weight under seed-v1
    # (docs/design.md "The model and its calibration").
    out = SeedV1Model().evaluate({"ok": ZoneStats(1.0, 12.0, 0.4), "sick": ZoneStats(0.95, 212.0, 0.4)})
    ratio = out["sick"].weight / out["ok"].weight
    assert 0.80 < ratio < 0.90


def test_seed_v1_unknown_inputs_are_neutral_not_fatal():
    v = SeedV1Model().evaluate({"z": ZoneStats(None, None, None)})["z"]
    assert v.health == pytest.approx(1.0)
    assert any("unknown" in r for r in v.reasons)


# ------------------------------------------------------------------ default model


def test_default_reproduces_the_documents_example():
    shares, verdicts = model_shares(DefaultModel(), load_stats("stats_documents_example.json"))
    assert abs(shares["az-a"] - 85) <= 5 and abs(shares["az-b"] - 15) <= 5, shares
    assert verdicts["az-a"].health > verdicts["az-b"].health
    assert any("mostly failures" in r for r in verdicts["az-b"].reasons)


def test_default_drains_200ms_5pct_zone_to_at_most_10():
    shares, verdicts = model_shares(DefaultModel(), load_stats("stats_drain_200ms_5pct.json"))
    assert shares["az-c"] <= 10, shares
    assert sum(shares.values()) == 100
    assert verdicts["az-c"].weight >= MIN_WEIGHT


HEALTHY = {"az-a": ZoneStats(0.9995, 10.0, 0.35, 0.001, 0.0, 5000),
           "az-b": ZoneStats(0.9993, 13.0, 0.45, 0.001, 0.0, 5000)}


@pytest.mark.parametrize(
    "sick",
    [
        ZoneStats(0.95, 213.0, 0.4, 0.0, 0.0, 5000),  # 5 % connect failures + 200 ms
        ZoneStats(1.0, 213.0, 0.4, 0.05, 0.05, 5000),  # 5 % packet loss seen as retransmits only
        ZoneStats(0.95, 12.0, 0.4, 0.05, 0.0, 5000),  # loss alone
        ZoneStats(0.9995, 213.0, 0.4, 0.0, 0.0, 5000),  # +200 ms alone
    ],
    ids=["fail+latency", "retrans+latency", "loss-only", "latency-only"],
)
def test_default_drains_each_form_of_the_sick_zone(sick):
    shares, _ = model_shares(DefaultModel(), {**HEALTHY, "az-c": sick})
    assert shares["az-c"] <= 10, shares


def test_default_noise_on_healthy_zones_moves_no_share_more_than_3_points():
    """+-20 % noise on every input of 2..5 healthy zones (10-15 ms), 3000 seeded draws."""
    rng = random.Random(20251130)
    model = DefaultModel()
    worst = 0
    for _ in range(3000):
        n = rng.randint(2, 5)
        base = {f"z{i}": ZoneStats(1 - rng.uniform(0, 0.001), rng.uniform(10, 15), rng.uniform(0.2, 0.55),
                                   rng.uniform(0, 0.002), rng.uniform(0, 0.001), 5000) for i in range(n)}

        def jitter(x: float) -> float:
            return x * rng.uniform(0.8, 1.2)

        noisy = {az: ZoneStats(1 - jitter(1 - z.success), jitter(z.p95_ms), jitter(z.util),
                               jitter(z.syn_retrans_per_conn), jitter(z.rto_per_conn), 5000)
                 for az, z in base.items()}
        before, _ = model_shares(model, base)
        after, _ = model_shares(model, noisy)
        worst = max(worst, max(abs(before[az] - after[az]) for az in base))
    assert worst <= 3


def test_default_equal_inputs_give_equal_shares():
    z = ZoneStats(0.999, 12.0, 0.4, 0.0, 0.0, 1000)
    shares, verdicts = model_shares(DefaultModel(), {"a": z, "b": z, "c": z, "d": z})
    assert sorted(shares.values()) == [25, 25, 25, 25]
    assert len({v.health for v in verdicts.values()}) == 1


def test_default_health_falls_with_each_signal():
    m = DefaultModel()
    base = ZoneStats(0.999, 12.0, 0.4, 0.0, 0.0, 1000)
    ref = {"ref": base}
    h0 = m.evaluate({**ref, "x": base})["x"].health
    worse = [
        ZoneStats(0.98, 12.0, 0.4, 0.0, 0.0, 1000),
        ZoneStats(0.999, 80.0, 0.4, 0.0, 0.0, 1000),
        ZoneStats(0.999, 12.0, 0.95, 0.0, 0.0, 1000),
        ZoneStats(0.999, 12.0, 0.4, 0.05, 0.0, 1000),
        ZoneStats(0.999, 12.0, 0.4, 0.0, 0.05, 1000),
    ]
    for w in worse:
        assert m.evaluate({**ref, "x": w})["x"].health < h0, w


def test_default_latency_is_relative_to_the_baseline_zone():
    # A service whose healthy P95 is ~100 ms (e.g. cross-region) raises the baseline cap;
    # then 100 ms is fine when everyone is at ~100 ms, bad when others are at 10.
    m = DefaultModel(DefaultModelConfig(latency_baseline_max_ms=150.0))
    far = m.evaluate({"a": ZoneStats(1.0, 95.0), "b": ZoneStats(1.0, 100.0)})
    near = m.evaluate({"a": ZoneStats(1.0, 10.0), "b": ZoneStats(1.0, 100.0)})
    assert far["b"].health == pytest.approx(1.0)
    assert near["b"].health < 0.95


def test_default_latency_baseline_does_not_follow_every_zone_up():
    """The all-zones drill: every zone +200 ms (and noisy 5 % loss). With the baseline =
    the best zone's P95 the latency stopped counting ("p95 204.2 ms vs baseline 204.2 ms
    ... penalty 0.00") and a zone whose loss read low for a cycle scored 1.000. The
    baseline is capped at latency_baseline_max_ms, so uniform +200 ms degrades them all."""
    model = DefaultModel()
    rng = random.Random(7)
    for _ in range(500):
        zones = {az: ZoneStats(1 - rng.uniform(0.0, 0.08), 200 + rng.uniform(2, 15), rng.uniform(0.2, 0.5),
                               rng.uniform(0, 0.08), rng.uniform(0, 0.05), 5000) for az in ("az-a", "az-b", "az-c")}
        # the noisy cycle: az-a's loss reads zero and it has the lowest P95
        zones["az-a"] = ZoneStats(1.0, 201.0, 0.3, 0.0, 0.0, 5000)
        verdicts = model.evaluate(zones)
        assert all(v.health < model.degraded_below for v in verdicts.values()), verdicts
        assert any("capped at latency_baseline_max_ms 50" in r for r in verdicts["az-a"].reasons)
    # the cap only matters when the best zone is slow: intra-region baselines are unchanged
    v = model.evaluate(load_stats("stats_documents_example.json"))["az-b"]
    assert any("vs baseline 12.3 ms" in r for r in v.reasons)


def test_default_latency_baseline_cap_comes_from_config():
    cfg = DefaultModelConfig.from_section(Section({"latency_baseline_max_ms": 400.0}, "model.default"))
    assert cfg.latency_baseline_max_ms == 400.0
    assert DefaultModelConfig().latency_baseline_max_ms == 50.0
    uniform = {az: ZoneStats(1.0, 204.0, 0.3, 0.0, 0.0, 5000) for az in ("a", "b")}
    assert all(v.health == pytest.approx(1.0) for v in DefaultModel(cfg).evaluate(uniform).values())
    with pytest.raises(ConfigError) as err:
        DefaultModelConfig.from_section(Section({"latency_baseline_max_ms": -1}, "model.default"))
    assert err.value.field == "model.default.latency_baseline_max_ms"


def test_default_missing_inputs_never_drain():
    out = DefaultModel().evaluate({"a": ZoneStats(None, None, None), "b": ZoneStats(float("nan"), float("inf"), None)})
    assert out["a"].health == pytest.approx(1.0) and out["b"].health == pytest.approx(1.0)


def test_default_weight_stays_in_contract_range_even_when_share_raw_is_tiny():
    v = DefaultModel().evaluate({"a": ZoneStats(1.0, 10.0), "b": ZoneStats(0.0, 10_000.0, 1.0, 5.0, 5.0)})["b"]
    assert v.health == 0.0
    assert v.weight == pytest.approx(MIN_WEIGHT)
    assert 0 < v.share_raw < v.weight


def test_default_coefficients_come_from_config():
    cfg = DefaultModelConfig.from_section(Section({"share_exponent": 2.0, "failure_scale": 0.2}, "model.default"))
    assert cfg.share_exponent == 2.0 and cfg.failure_scale == 0.2
    softer = DefaultModel(cfg)
    shares, _ = model_shares(softer, load_stats("stats_documents_example.json"))
    assert shares["az-b"] > 30  # the same example is much gentler with these knobs


@pytest.mark.parametrize(
    "table,field",
    [
        ({"share_exponnt": 3}, "model.default.share_exponnt"),
        ({"w_failure": 0.9}, "model.default.w_failure"),
        ({"failure_scale": 0}, "model.default.failure_scale"),
        ({"util_knee": "high"}, "model.default.util_knee"),
    ],
)
def test_default_config_errors_name_the_field(table, field):
    with pytest.raises(ConfigError) as err:
        load_model("default", Section(table, "model.default"))
    assert err.value.field == field
    assert err.value.exit_code == 2


def test_load_model_names():
    assert load_model("default").name == "default"
    assert load_model("seed-v1").name == "seed-v1"
    with pytest.raises(ConfigError, match="unknown model 'fancy'"):
        load_model("fancy")
    with pytest.raises(ConfigError):
        load_model("seed-v1", Section({"w": 1}, "model.seed-v1"))  # the documents' formula has no knobs


# ------------------------------------------------------------------ shares


def test_shares_largest_remainder():
    assert shares_from_weights({"a": 1, "b": 1, "c": 1}) == {"a": 34, "b": 33, "c": 33}
    assert shares_from_weights({"a": 2, "b": 1}) == {"a": 67, "b": 33}
    assert shares_from_weights({"a": 0.855, "b": 0.145}) == {"a": 86, "b": 14}  # 85.5 / 14.5: tie -> name


def test_shares_floor_at_one_taken_from_the_largest():
    shares = shares_from_weights({"a": 1.0, "b": 1e-9, "c": 0.0})
    assert shares == {"a": 98, "b": 1, "c": 1}


def test_shares_degenerate_inputs_split_equally():
    for bad in ({"a": 0, "b": 0}, {"a": float("nan"), "b": -1}, {"a": float("inf"), "b": float("-inf")}):
        assert shares_from_weights(bad) == {"a": 50, "b": 50}
    assert shares_from_weights({}) == {}
    assert equal_shares(["c", "a", "b"]) == {"a": 34, "b": 33, "c": 33}


def test_shares_non_finite_weight_counts_as_zero_and_huge_ones_do_not_overflow():
    assert shares_from_weights({"a": float("inf"), "b": 1.0}) == {"a": 1, "b": 99}
    assert shares_from_weights({"a": 1e308, "b": 1e308, "c": 1e308}) == {"a": 34, "b": 33, "c": 33}


def test_shares_refuse_more_than_100_zones():
    with pytest.raises(ValueError):
        shares_from_weights({f"z{i}": 1.0 for i in range(101)})
    assert set(shares_from_weights({f"z{i}": 1.0 for i in range(100)}).values()) == {1}


# ------------------------------------------------------------------ stats documents


def test_stats_round_trip():
    z = ZoneStats(0.99, 12.5, 0.3, 0.01, 0.002, 42)
    assert ZoneStats.from_json(z.to_json()) == z
    assert ZoneStats.from_json({"samples": 3}) == ZoneStats(samples=3)


@pytest.mark.parametrize(
    "doc,field",
    [
        ({"zones": {"a": {"success": 1.5}}}, "zones.a.success"),
        ({"zones": {"a": {"p95_ms": -1}}}, "zones.a.p95_ms"),
        ({"zones": {"a": {"util": "x"}}}, "zones.a.util"),
        ({"zones": {"a": {"samples": 1.5}}}, "zones.a.samples"),
        ({"zones": {"a": {"samples": True}}}, "zones.a.samples"),
        ({"zones": {"a": {"sucess": 1}}}, "zones.a.sucess"),
        ({"zones": {"a": []}}, "zones.a"),
        ({"zones": {}}, "zones"),
        ({"zone": {}}, "zones"),
        ([], "stats"),
    ],
)
def test_stats_errors_name_the_field(doc, field):
    with pytest.raises(StatsError) as err:
        parse_stats_document(doc)
    assert err.value.field == field


def test_is_evidence_needs_samples_and_a_signal():
    assert ZoneStats(0.99, None, None, samples=20).is_evidence(20)
    assert not ZoneStats(0.99, 10.0, samples=19).is_evidence(20)
    assert not ZoneStats(None, None, 0.4, samples=500).is_evidence(20)
    assert not ZoneStats(float("nan"), float("nan"), samples=500).is_evidence(20)
