"""`azprobe model eval`: run a weight model on a stats file and print the weights.

The operators' what-if ("what would the controller do with these numbers?") and the way
tests drive the models. STATS.json is the model-input document (docs/contracts.md "Model
input"), per zone::

    {"zones": {"az-a": {"success": 0.9992, "p95_ms": 12.3, "util": 0.4,
                        "syn_retrans_per_conn": 0.0, "rto_per_conn": 0.0, "samples": 5000}}}

or per vantage point (``--safety`` only)::

    {"nodes": [{"node": "node-1", "az": "az-a", "zones": {"az-a": {...}, "az-b": {...}},
                "hosts": [<the window's host summaries, summed>]}, ...]}

Output: ``{"model": NAME, "state": ..., "zones": {az: <weights-document zone>}}``, and with
`hosts` given and a host named, ``"sick_hosts": {az: [{addr, reasons}]}``. By
default only the model speaks (shares from its share_raw, state ok/degraded by the
model's degraded_below threshold, or [safety] degraded_below when set). ``--safety``
decides the global view as the daemon does, through the same function
(controller/decide.py: quorum, healthy band, safety rules), one cycle from a fresh state
(no history, so no step caps), with the config's [model], [quorum] and [safety]. The
per-zone form is one vantage point that saw those zones: a quorum of one voter is that
voter, so the shares are those of a fleet whose every node reports these figures (as long
as `samples` reaches both [quorum] min_node_samples and [safety] min_samples: the daemon
adds up its nodes' samples).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from azprobe.config import MAX_FILE_BYTES, Section, load_toml, read_file
from azprobe.contracts import bounded_json
from azprobe.contracts.stats import StatsError, ZoneStats, parse_nodes_document, parse_stats_document
from azprobe.contracts.weights import MAX_WEIGHT, MIN_WEIGHT
from azprobe.controller.config import load_model_from, parse_model, parse_safety
from azprobe.controller.decide import GLOBAL_VIEW, DecisionRules, ViewDecision, decide_views
from azprobe.controller.models import shares_from_weights
from azprobe.controller.hosts import host_sums, sick_entries
from azprobe.controller.quorum import NodeEvidence, QuorumConfig
from azprobe.controller.safety import Decision
from azprobe.errors import AzprobeError, ConfigError

WHAT_IF_NODE = "what-if"  # the vantage point (node and AZ) a per-zone stats file stands for


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number")


def read_stats(path: str) -> tuple[dict[str, ZoneStats], list[NodeEvidence] | None]:
    """The zones of STATS.json and, in the per-node form, its vantage points (else None).
    A per-node document's zones are every zone a node saw, with the median of the nodes'
    `util` figures, as the daemon takes its AZs' utilisation (controller/merge.py)."""
    p = Path(path)
    raw = read_file(p, str(p))
    try:
        doc = bounded_json.loads(raw, max_bytes=MAX_FILE_BYTES, what="stats file", parse_constant=_reject_constant)
    except ValueError as exc:  # JsonRefused, or _reject_constant's refusal of NaN / Infinity
        raise ConfigError(str(p), str(exc)) from None
    try:
        if isinstance(doc, Mapping) and "nodes" in doc:
            if "zones" in doc:
                raise StatsError("stats", "has both 'zones' and 'nodes'; use one form")
            nodes = [NodeEvidence(v.node, v.az, v.zones, host_sums(v.hosts)) for v in parse_nodes_document(doc)]
            return _zones_seen(nodes), nodes
        return parse_stats_document(doc), None
    except StatsError as exc:
        raise ConfigError(exc.field, exc.problem, "see docs/contracts.md 'Model input'") from None


def _zones_seen(nodes: list[NodeEvidence]) -> dict[str, ZoneStats]:
    utils: dict[str, list[float]] = {}
    for n in nodes:
        for az, z in n.zones.items():
            utils.setdefault(az, [])
            if z.util is not None:
                utils[az].append(z.util)
    return {az: ZoneStats(util=statistics.median(u) if u else None) for az, u in sorted(utils.items())}


def _rules(config_path: str | None, model_name: str | None) -> DecisionRules:
    """[model], [quorum] and [safety] of a controller config, read by the daemon's parsers."""
    root = Section(load_toml(config_path) if config_path else {}, "")
    model_section = root.section("model")
    if model_name is not None:
        model_section = Section({**model_section.data, "name": model_name}, "model")
    safety, _ = parse_safety(root.section("safety"))
    quorum = QuorumConfig.from_section(root.section("quorum"))
    return DecisionRules(load_model_from(parse_model(model_section)), quorum, safety)


def what_if_view(rules: DecisionRules, zones: Mapping[str, ZoneStats],
                 nodes: list[NodeEvidence] | None = None) -> ViewDecision:
    """The global view, one cycle from a fresh state, through the daemon's function;
    `nodes` None: the per-zone form, one vantage point that saw `zones`."""
    nodes = nodes if nodes is not None else [NodeEvidence(WHAT_IF_NODE, WHAT_IF_NODE, zones)]
    view = decide_views(nodes, {GLOBAL_VIEW: zones}, rules=rules, states={}, now=0.0)[GLOBAL_VIEW]
    if view.decision is None:
        raise AzprobeError(f"the decision is not a valid weights document: {view.error}")
    return view


def what_if(rules: DecisionRules, zones: Mapping[str, ZoneStats], nodes: list[NodeEvidence] | None = None) -> Decision:
    """The global view's decision (what_if_view)."""
    decision = what_if_view(rules, zones, nodes).decision
    assert decision is not None
    return decision


def _decided(rules: DecisionRules, view: ViewDecision) -> dict[str, Any]:
    decision = view.decision
    assert decision is not None
    out: dict[str, Any] = {"model": rules.model.name, "state": decision.state,
                           "zones": {az: z.to_json() for az, z in sorted(decision.zones.items())}}
    sick = sick_entries(view.judgement, decision.zones)
    if sick:  # the sick-hosts document's global view, as the daemon would write it
        out["sick_hosts"] = {az: [h.to_json() for h in hosts] for az, hosts in sorted(sick.items())}
    return out


def _model_only(rules: DecisionRules, zones: dict[str, ZoneStats]) -> dict[str, Any]:
    verdicts = rules.model.evaluate(zones)
    shares = shares_from_weights({az: v.share_raw for az, v in verdicts.items()})
    threshold = rules.safety.degraded_threshold
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
    return {"model": rules.model.name, "state": overall, "zones": out_zones}


@click.group("model")
def model_group() -> None:
    """Evaluate weight models on given stats."""


@model_group.command("eval")
@click.option("--model", "model_name", default=None,
              help="Model name: default or seed-v1 (default: from config, else 'default').")
@click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False),
              help="Controller config: [model], [model.<name>], [quorum] and [safety] are read from it.")
@click.option("--safety/--no-safety", default=False,
              help="Decide as the daemon does: quorum, healthy band and one cycle of the safety rules.")
@click.argument("stats_path", metavar="STATS.json")
def eval_command(model_name: str | None, config_path: str | None, safety: bool, stats_path: str) -> None:
    """Print the weights a model gives the zones of STATS.json (JSON on stdout)."""
    rules = _rules(config_path, model_name)
    zones, nodes = read_stats(stats_path)
    if nodes is not None and not safety:
        raise ConfigError("nodes", "the per-node form needs --safety (the model alone judges one set of zones)",
                          "add --safety, or give the per-zone form {\"zones\": ...}")
    out = _decided(rules, what_if_view(rules, zones, nodes)) if safety else _model_only(rules, zones)
    json.dump(out, sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")
