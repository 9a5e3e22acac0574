"""One cycle of policy for the daemon: model -> safety rules, in one call.

    policy = Policy.from_config(model_section, safety_section)   # or Policy(model, SafetyConfig())
    state = SafetyState()
    decision = policy.decide(merged.zones, now=now, state=state, controls=..., spikes=...)
    state = decision.safety_state            # keep for the next cycle
    if decision.publishable:                 # decision.zones are the document's ZoneWeights
        views[name] = WeightsView(state=decision.state, zones=decision.zones, source_az=...)

The rules' timers (drain dwell, recovery dwell, panic exit; azprobe.controller.safety) live in
the SafetyState and are measured on `now`: pass the same clock (wall seconds) every cycle.

Only zones with evidence (``ZoneStats.is_evidence(min_samples)``) reach the model, so a
zone with three samples cannot set the latency baseline of the others. Use one `Policy`
and one `SafetyState` per view (the global view and each weights/from/<src> view).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from azprobe.config import Section
from azprobe.contracts.stats import ZoneStats
from azprobe.controller.models import Model, load_model
from azprobe.controller.safety import Controls, Decision, SafetyConfig, SafetyState, apply_safety


@dataclass(frozen=True)
class Policy:
    model: Model
    safety: SafetyConfig = SafetyConfig()

    @classmethod
    def from_config(cls, model_section: Section | None = None, safety_section: Section | None = None) -> "Policy":
        """From the [model] and [safety] tables. Reads [model].name and [model.<name>];
        unknown keys are rejected in [model.<name>] only (the caller owns [model]/[safety])."""
        model_section = model_section or Section({}, "model")
        name = model_section.string("name", "default")
        model = load_model(name, model_section.section(name))
        safety = SafetyConfig.from_section(safety_section, reject_unknown=False) if safety_section else SafetyConfig()
        return cls(model, safety)

    def __post_init__(self) -> None:
        # "degraded" is on the model's scale unless [safety] degraded_below says otherwise
        if self.safety.degraded_below is None:
            object.__setattr__(self, "safety", replace(self.safety, degraded_below=self.model.degraded_below))

    def decide(
        self,
        zones: Mapping[str, ZoneStats],
        *,
        now: float,
        state: SafetyState,
        controls: Controls = Controls(),
        spikes: Mapping[str, bool] | None = None,
    ) -> Decision:
        evidence = {az: z for az, z in zones.items() if z.is_evidence(self.safety.min_samples)}
        verdicts = self.model.evaluate(evidence) if evidence else {}
        return apply_safety(zones, verdicts, now=now, state=state, config=self.safety,
                            controls=controls, spikes=spikes)


def zones_json(decision: Decision) -> dict[str, Any]:
    """The `zones` object of the weights document."""
    return {az: z.to_json() for az, z in sorted(decision.zones.items())}
