"""Fault scenarios as data: which AZs a scenario hurts, how, and when.

A scenario is a pure description; `Scenario.timeline(fault_s)` expands it into the
ordered steps the runner executes, with offsets from the start of the fault phase. The
runner knows nothing about what a scenario means; the metrics know only which AZs are
sick and when the fault started and ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from azprobe.errors import ConfigError
from azprobe.dev.lab.faults import Fault

# A step's action: apply a fault to an AZ, clear all faults, or SIGKILL the leading
# controller (the failover scenario).
Action = Literal["fault", "clear", "kill-leader"]

ALL_AZS = "*"  # a FaultSpec.az meaning "every AZ of the lab"


@dataclass(frozen=True)
class FaultSpec:
    """One fault of a scenario: the lab's `Fault`, aimed at one AZ (or ALL_AZS); uplink: at
    everything that AZ's client nodes send (`lab fault --from`), not traffic toward it;
    server: at that one server (0-based) of the AZ only (`lab fault --host`)."""

    az: str
    fault: Fault
    uplink: bool = False
    server: int | None = None

    def __post_init__(self) -> None:
        if self.server is not None and self.uplink:
            raise ConfigError("server", "a fault aims at one server or at an uplink, not both",
                              "drop uplink or server")

    def describe(self) -> str:
        target = "every AZ" if self.az == ALL_AZS else self.az
        if self.uplink:
            target = f"uplink of {target}"
        if self.server is not None:
            target = f"server {self.server} of {target}"
        return f"{target}: {self.fault.describe()}"


@dataclass(frozen=True)
class Step:
    at_s: float  # offset from the start of the fault phase
    action: Action
    faults: tuple[FaultSpec, ...] = ()


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    faults: tuple[FaultSpec, ...]
    # The fault is toggled on and off every flap_period_s (None: held for the whole phase).
    flap_period_s: float | None = None
    controllers: int = 1
    # Fraction of the fault phase after which the leader is SIGKILLed (None: never).
    kill_leader_at: float | None = None
    # Controller heartbeat (None: the controller's default). The failover scenario writes
    # every cycle (heartbeat < interval), so a gap in KV generations measures the
    # takeover, not a quiet spell.
    heartbeat_s: float | None = None
    # What a passing run looks like (ScenarioResult.checks reads these).
    expect_drain: bool = True   # the sick AZ's share falls below the detect threshold
    expect_panic: bool = False  # every zone sick: spread evenly, state "panic"
    default_fault_s: float = 20.0
    # Servers per AZ the scenario's lab needs (a fault on one server needs at least two).
    servers_per_az: int = 1
    # AZs whose servers the faults hit for the most part: sick as zones although every
    # fault aims at one server (the host judgement is meant to drain them).
    sick_zones: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for f in self.faults:
            if f.server is not None and not 0 <= f.server < self.servers_per_az:
                raise ConfigError("servers_per_az", f"scenario {self.name!r} aims at server {f.server} "
                                  f"with {self.servers_per_az} server(s) per AZ", f"set servers_per_az > {f.server}")

    def sick_azs(self, lab_azs: list[str]) -> list[str]:
        """The AZs this scenario hurts as destinations, resolved against the lab's AZ
        names (an uplink fault hurts what a source sends, no destination; a fault on one
        server is a sick host, not a sick AZ)."""
        toward = [f for f in self.faults if not f.uplink and f.server is None]
        if any(f.az == ALL_AZS for f in toward):
            return list(lab_azs)
        named = [f.az for f in toward] + [az for az in self.sick_zones if az not in {f.az for f in toward}]
        return [az for az in named if az in lab_azs]

    def timeline(self, fault_s: float) -> list[Step]:
        """Ordered steps for a fault phase of fault_s seconds; always ends with a clear."""
        if fault_s <= 0:
            raise ConfigError("--fault-s", f"{fault_s:g} must be > 0", "for example --fault-s 15")
        steps: list[Step] = []
        if self.flap_period_s:
            t, on = 0.0, True
            while t < fault_s:
                steps.append(Step(t, "fault", self.faults) if on else Step(t, "clear"))
                t += self.flap_period_s
                on = not on
        else:
            steps.append(Step(0.0, "fault", self.faults))
        if self.kill_leader_at is not None:
            steps.append(Step(round(fault_s * self.kill_leader_at, 3), "kill-leader"))
        steps.append(Step(fault_s, "clear"))
        return sorted(steps, key=lambda s: s.at_s)


_DELAY_LOSS_B = FaultSpec("az-b", Fault(delay_ms=200, loss_pct=5))

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("delay-loss", "the documents' fault: az-b gets +200 ms and 5 % loss",
                 (_DELAY_LOSS_B,)),
        Scenario("blackhole", "az-b drops every packet (connects time out)",
                 (FaultSpec("az-b", Fault(blackhole=True)),)),
        Scenario("syn-loss", "az-b drops 50 % of SYNs (slow, retried connects)",
                 (FaultSpec("az-b", Fault(syn_loss_pct=50)),)),
        Scenario("all-zones", "every AZ degraded at once: panic mode spreads evenly, no drain",
                 (FaultSpec(ALL_AZS, Fault(delay_ms=200, loss_pct=5)),),
                 expect_drain=False, expect_panic=True),
        Scenario("uplink", "az-b's uplink (all its clients send) gets +200 ms and 5 % loss: a sick "
                 "source, no sick destination; nothing drains, no panic",
                 (FaultSpec("az-b", Fault(delay_ms=200, loss_pct=5), uplink=True),), expect_drain=False),
        Scenario("gray-host", "one of az-b's 3 servers gets +200 ms and 5 % loss: a sick host, not a sick "
                 "zone; az-b should stay in play",
                 (FaultSpec("az-b", Fault(delay_ms=200, loss_pct=5), server=1),), expect_drain=False,
                 servers_per_az=3),
        Scenario("gray-zone", "4 of az-b's 6 servers get +200 ms and 5 % loss: the sickness spans the zone; "
                 "az-b drains as under the documents' fault",
                 tuple(FaultSpec("az-b", Fault(delay_ms=200, loss_pct=5), server=j) for j in range(1, 5)),
                 servers_per_az=6, sick_zones=("az-b",)),
        Scenario("flap", "az-b's fault toggles every 5 s: hysteresis, not oscillation",
                 (_DELAY_LOSS_B,), flap_period_s=5.0, default_fault_s=30.0, expect_drain=False),
        # The kill comes once the drain is in place; the fault outlasts the takeover, so
        # the new leader must hold the drain from its warm state.
        Scenario("controller-failover", "two controllers; the leader is SIGKILLed mid-run",
                 (_DELAY_LOSS_B,), controllers=2, kill_leader_at=0.25, heartbeat_s=0.5, default_fault_s=40.0),
    )
}
DEFAULT_SCENARIO = "delay-loss"


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ConfigError("--scenario", f"unknown scenario {name!r}",
                          f"one of: {', '.join(SCENARIOS)}") from None
