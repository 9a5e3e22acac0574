"""`azprobe model eval`: run a weight model on a stats file and print the weights.

The operators' what-if ("what would the controller do with these numbers?") and the way
tests drive the models. STATS.json is the model-input document (docs/contracts.md "Model input")::

    {"zones": {"az-a": {"success": 0.9992, "p95_ms": 12.3, "util": 0.4,
                        "syn_retrans_per_conn": 0.0, "rto_per_conn": 0.0, "samples": 5000}}}

Output: ``{"model": NAME, "state": ..., "zones": {az: <weights-document zone>}}``. By
default only the model speaks (shares from its share_raw, state ok/degraded by the
model's degraded_below threshold, or [safety] degraded_below when set); ``--safety``
runs one cycle of the safety rules as a fresh controller would (evidence, panic, max drained zones -- no history, so no caps).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from azprobe.config import MAX_FILE_BYTES, Section, load_toml, read_file
from azprobe.contracts import bounded_json
from azprobe.errors import ConfigError
from azprobe.contracts.stats import StatsError, parse_stats_document
from azprobe.contracts.weights import MAX_WEIGHT, MIN_WEIGHT
from azprobe.controller.models import shares_from_weights
from azprobe.controller.policy import Policy, zones_json
from azprobe.controller.safety import SafetyState


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number")


def read_stats(path: str) -> dict:
    p = Path(path)
    raw = read_file(p, str(p))
    try:
        doc = bounded_json.loads(raw, max_bytes=MAX_FILE_BYTES, what="stats file", parse_constant=_reject_constant)
    except ValueError as exc:  # JsonRefused, or _reject_constant's refusal of NaN / Infinity
        raise ConfigError(str(p), str(exc)) from None
    try:
        return parse_stats_document(doc)
    except StatsError as exc:
        raise ConfigError(exc.field, exc.problem, "see docs/contracts.md 'Model input'") from None


@click.group("model")
def model_group() -> None:
    """Evaluate weight models on given stats."""


@model_group.command("eval")
@click.option("--model", "model_name", default=None,
              help="Model name: default or seed-v1 (default: from config, else 'default').")
@click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False),
              help="Controller config: [model], [model.<name>] and [safety] are read from it.")
@click.option("--safety/--no-safety", default=False, help="Also apply one cycle of the safety rules.")
@click.argument("stats_path", metavar="STATS.json")
def eval_command(model_name: str | None, config_path: str | None, safety: bool, stats_path: str) -> None:
    """Print the weights a model gives the zones of STATS.json (JSON on stdout)."""
    config = load_toml(config_path) if config_path else {}
    root = Section(config, "")
    model_section = root.section("model")
    safety_section = root.section("safety")
    if model_name is not None:
        model_section = Section({**model_section.data, "name": model_name}, "model")
    policy = Policy.from_config(model_section, safety_section)
    zones = read_stats(stats_path)

    if safety:
        decision = policy.decide(zones, now=0.0, state=SafetyState())
        out = {"model": policy.model.name, "state": decision.state, "zones": zones_json(decision)}
    else:
        verdicts = policy.model.evaluate(zones)
        shares = shares_from_weights({az: v.share_raw for az, v in verdicts.items()})
        threshold = policy.safety.degraded_threshold
        out_zones = {}
        for az in sorted(zones):
            v, z = verdicts[az], zones[az]
            state = "ok" if v.health >= threshold else "degraded"
            out_zones[az] = {
                "weight": min(max(round(v.weight, 9), MIN_WEIGHT), MAX_WEIGHT),
                "share": shares[az], "health": round(v.health, 6),
                "success": z.success, "p95_ms": z.p95_ms, "util": z.util, "samples": z.samples,
                "state": state,
                "reasons": [*v.reasons, f"health {v.health:.3f} vs degraded_below {threshold:.2f}: {state}"],
            }
        overall = "degraded" if any(z["state"] != "ok" for z in out_zones.values()) else "ok"
        out = {"model": policy.model.name, "state": overall, "zones": out_zones}
    json.dump(out, sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")
