"""One cycle's decision for every view: vantage points -> quorum -> safety rules (pure).

    rules = DecisionRules(model, quorum_config, safety_config)
    views = decide_views(nodes, seen, rules=rules, states=states, now=now, controls=controls, spikes=spikes)
    for name, view in views.items():          # GLOBAL_VIEW, then each source AZ
        states[name] = view.decision.safety_state   # unless view.error: keep the old state

Per view (the global view: every node; a source AZ's view: that AZ's nodes):

1. `quorum.judge`: every node judged on its own evidence by the model, combined by quorum,
   healthy zones within `healthy_band` of the best levelled (docs/quorum.md); then the
   operator's host switches (`hosts.host_controls`: control/hosts-off, control/host/<addr>);
2. the zones the view knows of (`seen`) without any vote join without evidence, so a zone
   nobody can judge is held or neutral, never drained;
3. `safety.apply_safety` with that view's SafetyState (docs/design.md "Safety rules").

A view with a SafetyState but no node any more (a source AZ gone silent) is decided on no
input: held, then equal shares. This is the only place quorum and safety meet: the daemon
(controller/main.py), `azprobe model eval --safety` (controller/model_cli.py),
bench/liars.py and the property tests all decide through `decide_views`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from azprobe.contracts.stats import ZoneStats
from azprobe.contracts.weights import WeightsError
from azprobe.controller.hosts import host_controls, without_host_evidence
from azprobe.controller.models import Model
from azprobe.controller.quorum import NodeEvidence, QuorumConfig, ViewJudgement, judge
from azprobe.controller.safety import Controls, Decision, SafetyConfig, SafetyState, apply_safety

GLOBAL_VIEW = ""  # the global view's name (as quorum.judge names it); a source view is named by its AZ


@dataclass(frozen=True)
class DecisionRules:
    """What decides: the model, the [quorum] table and the [safety] table."""

    model: Model
    quorum: QuorumConfig = QuorumConfig()
    safety: SafetyConfig = SafetyConfig()

    def __post_init__(self) -> None:
        # "degraded" is on the model's scale unless [safety] degraded_below says otherwise
        if self.safety.degraded_below is None:
            object.__setattr__(self, "safety", replace(self.safety, degraded_below=self.model.degraded_below))


@dataclass(frozen=True)
class ViewDecision:
    judgement: ViewJudgement | None  # None: no node reports for this view any more
    decision: Decision | None  # None only with `error`
    error: WeightsError | None = None  # not a valid weights document (a bug upstream): never publish it


def decide_views(
    nodes: Iterable[NodeEvidence],
    seen: Mapping[str, Mapping[str, ZoneStats]],
    *,
    rules: DecisionRules,
    states: Mapping[str, SafetyState],
    now: float,
    controls: Controls = Controls(),
    spikes: Mapping[str, bool] | None = None,
) -> dict[str, ViewDecision]:
    """Decide the global view and each source AZ's view.

    `nodes`: each vantage point's evidence over the evaluation window.
    `seen`: view name -> the zones that view knows of (the daemon's `ZonesSeen`); only their
    names and `util` are read (the evidence is the nodes'), and the global view's utils
    are the zones' utilisation for the quorum's figures.
    `states`: the SafetyState of each view from the last cycle (missing: a new view).
    Pass the same clock (wall seconds) as `now` every cycle: the rules' timers run on it.
    """
    known = seen.get(GLOBAL_VIEW, {})
    judgements = judge(without_host_evidence(nodes, controls), rules.model, rules.safety.degraded_threshold,
                       rules.quorum, {az: z.util for az, z in known.items()})
    judgements = {name: host_controls(j, controls, now) for name, j in judgements.items()}
    out: dict[str, ViewDecision] = {}
    for name in [*judgements, *(n for n in states if n not in judgements)]:
        judgement = judgements.get(name)
        zones = {az: ZoneStats(util=z.util) for az, z in seen.get(name, {}).items()} if judgement else {}
        verdicts = judgement.verdicts if judgement else {}
        if judgement:
            zones.update(judgement.stats)
        try:
            decision = apply_safety(zones, verdicts, now=now, state=states.get(name, SafetyState()),
                                    config=rules.safety, controls=controls, spikes=spikes)
        except WeightsError as exc:
            out[name] = ViewDecision(judgement, None, exc)
            continue
        out[name] = ViewDecision(judgement, decision)
    return out
