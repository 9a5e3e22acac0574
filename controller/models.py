"""Weight models: per-AZ evidence (`ZoneStats`) in, health / weight / share out.

A model turns each destination AZ's stats into a *health* H in [0, 1] and the contract's
*decay weight* ``exp(-2 * (1 - H))`` in [e^-2, 1], plus a ``share_raw`` that
``shares_from_weights`` normalises into integer percents. Models are pure: same input,
same output, no clock, no I/O. Missing inputs (None, NaN) are neutral: whether a zone has
enough evidence is the safety rules' call, not the model's.

``seed-v1``: the source documents' formula, exactly (share_raw = weight)::

    H = 0.40*S + 0.35*Lnorm + 0.25*(1-U),  Lnorm = clip((800 - P95_ms) / 750, 0, 1)

``default``: failures (SYN retransmits and RTOs as partial failures), latency against the
best zone's P95 capped at ``latency_baseline_max_ms``, utilisation above a knee; every
coefficient a key of ``[model.default]``; share_raw = weight ** share_exponent (6).
The formula and its calibration, why the baseline is capped and why shares use weight^6:
docs/design.md, sections "The model and its calibration", "The latency baseline cap"
and "The share exponent".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Protocol

from azprobe.config import Section
from azprobe.contracts.stats import ZoneStats, finite
from azprobe.contracts.weights import DECAY_RATE, MAX_WEIGHT, MIN_WEIGHT, TOTAL_SHARE
from azprobe.errors import ConfigError

DEGRADED_BELOW = 0.90  # the default model's scale: health under this is "degraded"

# -------------------------------------------------------------------------- output


@dataclass(frozen=True)
class ZoneHealth:
    """A model's verdict on one AZ. `weight` in [e^-2, 1]; `share_raw` > 0, finite."""

    health: float
    weight: float
    share_raw: float
    reasons: tuple[str, ...]


class Model(Protocol):
    name: str
    degraded_below: float  # the model's own scale: health under this is "degraded"

    def evaluate(self, zones: Mapping[str, ZoneStats], *, explain: bool = True) -> dict[str, ZoneHealth]:
        """Health of every given AZ (all of them, whatever their inputs). explain=False may
        leave `reasons` empty: the quorum judges every node but shows only the median's."""
        ...


def fmt(value: float, decimals: int = 1) -> str:
    """A number for a reason string: fixed point, or 3 significant digits when huge."""
    return f"{value:.{decimals}f}" if abs(value) < 1e6 else f"{value:.3g}"


def _clip(value: float, lo: float = 0.0, hi: float = 1.0) -> float:
    return lo if value < lo else hi if value > hi else value


def decay_weight(health: float) -> float:
    """The contract's weight: exp(-2 (1 - H)), clamped into [e^-2, 1]."""
    h = finite(health)
    h = 1.0 if h is None else _clip(h)
    return _clip(math.exp(-DECAY_RATE * (1.0 - h)), MIN_WEIGHT, MAX_WEIGHT)


# ------------------------------------------------------------------------- seed-v1


class SeedV1Model:
    """The documents' formula, exactly (module docstring). Missing S/P95/U are neutral."""

    name = "seed-v1"
    # Utilisation alone costs up to 0.25 of H here (a healthy zone at U=0.4 scores 0.90),
    # so "degraded" must sit lower than on the default model's scale.
    degraded_below = 0.70

    def evaluate(self, zones: Mapping[str, ZoneStats], *, explain: bool = True) -> dict[str, ZoneHealth]:
        out: dict[str, ZoneHealth] = {}
        for az, z in zones.items():
            reasons: list[str] = []
            s = finite(z.success)
            if s is None:
                s = 1.0
                reasons.append("success unknown: counted as 1.0")
            s = _clip(s)
            p95 = finite(z.p95_ms)
            if p95 is None:
                lnorm = 1.0
                reasons.append("p95 unknown: Lnorm 1.0")
            else:
                lnorm = _clip((800.0 - p95) / 750.0)
            u = finite(z.util)
            if u is None:
                u = 0.0
                reasons.append("util unknown: counted as 0")
            u = _clip(u)
            health = _clip(0.40 * s + 0.35 * lnorm + 0.25 * (1.0 - u))
            weight = decay_weight(health)
            reasons.insert(0, f"seed-v1: H = 0.40*S {s:.4f} + 0.35*Lnorm {lnorm:.3f} + 0.25*(1-U {u:.2f}) = {health:.3f}")
            out[az] = ZoneHealth(health=health, weight=weight, share_raw=weight, reasons=tuple(reasons))
        return out


# ------------------------------------------------------------------------- default


@dataclass(frozen=True)
class DefaultModelConfig:
    """Coefficients of the default model; every field is a key of [model.default]."""

    w_failure: float = 0.50
    w_latency: float = 0.30
    w_util: float = 0.20
    failure_tolerance: float = 0.001
    failure_scale: float = 0.05
    syn_cost: float = 0.5
    rto_cost: float = 0.3
    latency_tolerance_ms: float = 10.0
    latency_tolerance_frac: float = 0.25
    latency_span_ms: float = 200.0
    latency_baseline_max_ms: float = 50.0  # the baseline never exceeds this (docs/design.md)
    util_knee: float = 0.70
    share_exponent: float = 6.0
    degraded_below: float = DEGRADED_BELOW  # health under this is "degraded" for the safety rules

    @classmethod
    def from_section(cls, section: Section) -> "DefaultModelConfig":
        values: dict[str, float] = {}
        limits = {
            "failure_scale": (1e-6, 1.0),
            "latency_span_ms": (1e-3, 1e6),
            "util_knee": (0.0, 0.99),
            "share_exponent": (1.0, 50.0),
            "latency_tolerance_ms": (0.0, 1e6),
            "latency_baseline_max_ms": (0.0, 1e6),
            "degraded_below": (0.0, 1.0),
        }
        defaults = cls()
        for f in fields(cls):
            lo, hi = limits.get(f.name, (0.0, 1e3))
            values[f.name] = section.number(f.name, getattr(defaults, f.name), min=lo, max=hi)
        section.reject_unknown()
        total = values["w_failure"] + values["w_latency"] + values["w_util"]
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ConfigError(section.field("w_failure"), f"w_failure + w_latency + w_util = {total:g}, must be 1",
                              "adjust the three weights so they sum to 1")
        return cls(**values)


class DefaultModel:
    """Health relative to the healthy baseline, steep failure penalty::

        F    = (1 - S) + syn_cost * syn_retrans_per_conn + rto_cost * rto_per_conn
        Fpen = clip((F - failure_tolerance) / failure_scale)
        Lpen = clip((P95 - baseline - latency_tolerance_ms - latency_tolerance_frac * baseline)
                    / latency_span_ms),  baseline = min(best P95, latency_baseline_max_ms)
        Upen = clip((U - util_knee) / (1 - util_knee))
        H    = 1 - (w_failure * Fpen + w_latency * Lpen + w_util * Upen)

    Why each term: docs/design.md "The model and its calibration".
    """

    name = "default"

    def __init__(self, config: DefaultModelConfig | None = None) -> None:
        self.config = config or DefaultModelConfig()
        self.degraded_below = self.config.degraded_below

    def evaluate(self, zones: Mapping[str, ZoneStats], *, explain: bool = True) -> dict[str, ZoneHealth]:
        c = self.config
        latencies = [p for p in (finite(z.p95_ms) for z in zones.values()) if p is not None and p >= 0]
        best = min(latencies) if latencies else None
        # capped: when every zone slows down together, the baseline must not follow them up
        baseline, baseline_text = None, ""
        if best is not None:
            baseline = min(best, c.latency_baseline_max_ms)
            if best > baseline:
                baseline_text = f" (best zone {fmt(best)} ms, capped at latency_baseline_max_ms " \
                                f"{c.latency_baseline_max_ms:g})"
        out: dict[str, ZoneHealth] = {}
        # The quorum evaluates every node's zones each cycle (15,000 at 5,000 nodes): the
        # coefficients are read once per call, not once per zone.
        syn_cost, rto_cost, tolerance, scale = c.syn_cost, c.rto_cost, c.failure_tolerance, c.failure_scale
        w_failure, w_latency, w_util, knee = c.w_failure, c.w_latency, c.w_util, c.util_knee
        share_rate = DECAY_RATE * c.share_exponent
        for az, z in zones.items():
            reasons: list[str] = []
            s = finite(z.success)
            fail = 0.0 if s is None else 1.0 - _clip(s)
            syn = _clip(finite(z.syn_retrans_per_conn) or 0.0, 0.0, 1e6)
            rto = _clip(finite(z.rto_per_conn) or 0.0, 0.0, 1e6)
            effective = fail + syn_cost * syn + rto_cost * rto
            fpen = _clip((effective - tolerance) / scale)
            if explain and s is None:
                reasons.append("success unknown: no connect failures counted")
            if explain:
                reasons.append(
                    f"failures {100 * fail:.2f}% + syn {fmt(syn, 3)}/conn + rto {fmt(rto, 3)}/conn"
                    f" = effective {fmt(100 * effective, 2)}% -> penalty {fpen:.2f}"
                )

            lpen = self._latency_penalty(finite(z.p95_ms), baseline, baseline_text, reasons if explain else None)

            u = finite(z.util)
            if u is None:
                upen = 0.0
            else:
                upen = _clip((_clip(u) - knee) / (1.0 - knee))
                if upen > 0 and explain:
                    reasons.append(f"util {u:.2f} above knee {knee:.2f} -> penalty {upen:.2f}")

            health = _clip(1.0 - (w_failure * fpen + w_latency * lpen + w_util * upen))
            weight = decay_weight(health)
            # share_raw = weight**gamma, computed from H directly so it never underflows to 0
            share_raw = max(math.exp(-share_rate * (1.0 - health)), 1e-300)
            if explain:
                decided = max(
                    (w_failure * fpen, "failures"), (w_latency * lpen, "latency"), (w_util * upen, "utilisation")
                )
                summary = f"health {health:.3f}"
                if decided[0] > 0:
                    summary += f" (mostly {decided[1]})"
                reasons.insert(0, summary)
            out[az] = ZoneHealth(health=health, weight=weight, share_raw=share_raw, reasons=tuple(reasons))
        return out

    def _latency_penalty(self, p95: float | None, baseline: float | None, baseline_text: str,
                         reasons: list[str] | None) -> float:
        """The p95 latency's penalty against the baseline; its reason goes to `reasons` (None: not explained)."""
        c = self.config
        if p95 is None or baseline is None:
            if reasons is not None:
                reasons.append("p95 unknown: no latency penalty")
            return 0.0
        p95 = max(p95, 0.0)
        excess = p95 - baseline
        allowed = c.latency_tolerance_ms + c.latency_tolerance_frac * baseline
        lpen = _clip((excess - allowed) / c.latency_span_ms)
        if reasons is not None:
            reasons.append(f"p95 {fmt(p95)} ms vs baseline {fmt(baseline)} ms{baseline_text}"
                           f" (+{fmt(excess)}, tolerance {fmt(allowed)}) -> penalty {lpen:.2f}")
        return lpen


# -------------------------------------------------------------------------- shares


def equal_shares(zones: list[str] | tuple[str, ...]) -> dict[str, int]:
    """Split 100 evenly; the remainder goes to the first zones in sorted order."""
    names = sorted(zones)
    if not names:
        return {}
    return shares_from_weights({az: 1.0 for az in names})


def shares_from_weights(weights: Mapping[str, float]) -> dict[str, int]:
    """Integer percents, each >= 1, summing to exactly 100, proportional to `weights`.

    Largest-remainder rounding (ties broken by AZ name, so the output is deterministic),
    then any zone below 1 is raised to 1 by taking points from the largest share. A
    non-finite or negative weight counts as 0; all-zero weights give an equal split. At most
    100 zones can each hold >= 1 % (ValueError beyond).
    """
    names = sorted(weights)
    if not names:
        return {}
    if len(names) > TOTAL_SHARE:
        raise ValueError(f"{len(names)} zones cannot each get >= 1 of {TOTAL_SHARE}")
    values = [finite(weights[az]) for az in names]
    clean = [v if v is not None and v > 0 else 0.0 for v in values]
    peak = max(clean)
    if peak > 0:
        clean = [v / peak for v in clean]  # finite weights near 1e308 could sum to inf
    total = math.fsum(clean)
    if not total > 0:
        clean, total = [1.0] * len(names), float(len(names))
    exact = [TOTAL_SHARE * v / total for v in clean]
    floors = [int(math.floor(x)) for x in exact]
    left = TOTAL_SHARE - sum(floors)
    order = sorted(range(len(names)), key=lambda i: (-(exact[i] - floors[i]), names[i]))
    for i in order[:left]:
        floors[i] += 1
    for i in range(len(names)):
        while floors[i] < 1:
            donor = max(range(len(names)), key=lambda j: (floors[j], names[j]))
            floors[donor] -= 1
            floors[i] += 1
    return dict(zip(names, floors))


# ------------------------------------------------------------------------ registry

MODEL_NAMES = ("default", "seed-v1")


def load_model(name: str, section: Section | None = None) -> Model:
    """The model called `name`, its coefficients read from `section` ([model.<name>]).

    Raises ConfigError (exit 2) for an unknown name or a bad coefficient.
    """
    section = section or Section({}, f"model.{name}")
    if name == "default":
        return DefaultModel(DefaultModelConfig.from_section(section))
    if name == "seed-v1":
        section.reject_unknown()  # the documents' formula has no knobs, on purpose
        return SeedV1Model()
    raise ConfigError("model.name", f"unknown model {name!r}", f"use one of: {', '.join(MODEL_NAMES)}")
