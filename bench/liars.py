"""How many lying agents does it take to move a zone's share? (docs/quorum.md)

For fleets of 30, 90 and 300 agents (a third per AZ, az-a/az-b/az-c) this drives the
daemon's decision function (controller/decide.py: each node's evidence -> quorum ->
safety rules), 10 cycles of 1 s with the default [quorum] and [safety] settings - and
searches the smallest number of liars for each attack on the global view (`weights`)
and on each source view (`weights/from/<az>`):

- drain: liars (spread over az-a and az-c, the strongest placement) report az-b failing
  100 % at 2,000 ms while it is healthy;
- drain_one_az: the same liars, all in az-a;
- hide: az-b is really down; liars report it perfect (any volume: volume does not count);
- everything: liars report every zone failing while az-b is really down (a real drain
  that panic would cancel).

and on each source view `weights/from/<src>` (only src's nodes vote there, so the liars
are all in src): drain, hide and everything as above. A source view must hold until at
least half of its AZ's reporters lie (`source_views_hold`).

A share "moves" when any zone's final share differs by more than 3 points from the
all-honest run's. Prints one line per fleet, then ONE JSON line:
  {"min_liars": {"30": N, ...}, "by_attack": {...},
   "source_views": {"30": {"az-a": {"reporters": 10, "min_liars": N, "by_attack": {...}}, ...}, ...},
   "source_views_hold": true, ...}
(null: no number of liars up to the pool's size moves a share with that attack).

    .venv/bin/python bench/liars.py [--fleets 30,90,300]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from azprobe.contracts.stats import ZoneStats  # noqa: E402
from azprobe.controller.decide import GLOBAL_VIEW, DecisionRules, decide_views  # noqa: E402
from azprobe.controller.models import DefaultModel  # noqa: E402
from azprobe.controller.quorum import NodeEvidence  # noqa: E402
from azprobe.controller.safety import SafetyState  # noqa: E402

AZS = ("az-a", "az-b", "az-c")
OK = ZoneStats(success=1.0, p95_ms=10.0, util=0.3, samples=250)
DOWN = ZoneStats(success=0.0, p95_ms=2000.0, util=0.3, samples=250)
PERFECT = ZoneStats(success=1.0, p95_ms=1.0, util=0.3, samples=2**50)
CYCLES = 10
TOLERANCE = 3

Lie = Callable[[str, dict[str, ZoneStats]], dict[str, ZoneStats]]


def fleet(n: int, b_down: bool, liars: list[str], lie: Lie) -> list[NodeEvidence]:
    nodes = []
    for i in range(n):
        az = AZS[i % 3]
        name = f"{az}-{i // 3}"
        zones = {dst: (DOWN if b_down and dst == "az-b" else OK) for dst in AZS}
        if name in liars:
            zones = lie(az, zones)
        nodes.append(NodeEvidence(name, az, zones))
    return nodes


def shares(nodes: list[NodeEvidence], view_name: str = GLOBAL_VIEW) -> dict[str, int]:
    """One view's shares after CYCLES cycles of the daemon's decision (controller/decide.py)."""
    rules = DecisionRules(DefaultModel())
    seen = {GLOBAL_VIEW: {az: ZoneStats(util=0.3) for az in AZS}}
    states: dict[str, SafetyState] = {}
    decision = None
    for cycle in range(CYCLES):
        views = decide_views(nodes, seen, rules=rules, states=states, now=1000.0 + cycle)
        states = {name: v.decision.safety_state for name, v in views.items() if v.decision is not None}
        decision = views[view_name].decision
    assert decision is not None
    return decision.shares


def liar_names(n: int, count: int, sources: tuple[str, ...]) -> list[str]:
    pool = [f"{az}-{i}" for i in range(n // 3) for az in sources]  # alternating over the sources
    return pool[:count]


ATTACKS: dict[str, tuple[bool, tuple[str, ...], Lie]] = {
    "drain": (False, ("az-a", "az-c"), lambda az, z: {**z, "az-b": DOWN}),
    "drain_one_az": (False, ("az-a",), lambda az, z: {**z, "az-b": DOWN}),
    "hide": (True, ("az-a", "az-b", "az-c"), lambda az, z: {**z, "az-b": PERFECT}),
    "everything": (True, ("az-a", "az-c"), lambda az, z: {dst: DOWN for dst in z}),
}


def source_attacks(src: str) -> dict[str, tuple[bool, tuple[str, ...], Lie]]:
    """The attacks on weights/from/<src>: only src's nodes vote there, so the liars are all in src."""
    return {name: (b_down, (src,), lie) for name, (b_down, _, lie) in ATTACKS.items() if name != "drain_one_az"}


def moved(got: dict[str, int], want: dict[str, int]) -> bool:
    return any(abs(got[az] - want[az]) > TOLERANCE for az in want)


def smallest(n: int, attack: tuple[bool, tuple[str, ...], Lie], view_name: str = GLOBAL_VIEW) -> int | None:
    b_down, sources, lie = attack
    honest = shares(fleet(n, b_down, [], lie), view_name)
    limit = len(liar_names(n, n, sources))

    def moves(count: int) -> bool:
        return moved(shares(fleet(n, b_down, liar_names(n, count, sources), lie), view_name), honest)

    if not moves(limit):
        return None
    lo, hi = 0, limit  # moves(hi) holds; assume monotone in the number of liars, then check
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if moves(mid):
            hi = mid
        else:
            lo = mid
    assert not moves(hi - 1)
    return hi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleets", default="30,90,300")
    args = parser.parse_args()
    by_attack: dict[str, dict[str, int | None]] = {}
    source_views: dict[str, dict[str, dict]] = {}
    for n in (int(x) for x in args.fleets.split(",")):
        found = {name: smallest(n, attack) for name, attack in ATTACKS.items()}
        by_attack[str(n)] = found
        print(f"fleet {n}: " + ", ".join(f"{a} {show(v)}" for a, v in found.items()), flush=True)
        views = source_views[str(n)] = {}
        for src in AZS:
            in_view = {name: smallest(n, attack, src) for name, attack in source_attacks(src).items()}
            reporters = sum(1 for node in fleet(n, False, [], ATTACKS["drain"][2]) if node.az == src)
            views[src] = {"reporters": reporters, "min_liars": least(in_view), "by_attack": in_view}
            print(f"fleet {n} weights/from/{src} ({reporters} reporters): "
                  + ", ".join(f"{a} {show(v)}" for a, v in in_view.items()), flush=True)
    min_liars = {n: least(found) for n, found in by_attack.items()}
    holds = all(v["min_liars"] is None or 2 * v["min_liars"] >= v["reporters"]
                for views in source_views.values() for v in views.values())
    print(json.dumps({"min_liars": min_liars, "by_attack": by_attack, "source_views": source_views,
                      "source_views_hold": holds, "tolerance_points": TOLERANCE, "cycles": CYCLES},
                     sort_keys=True))


def least(found: dict[str, int | None]) -> int | None:
    return min((v for v in found.values() if v is not None), default=None)


def show(value: int | None) -> str:
    return "never" if value is None else str(value)


if __name__ == "__main__":
    main()
