"""Which zones a data plane should treat as failover-only: the rule envoy-eds renders as
Envoy priority 1, and `azprobe weights` reports, so both tell the same story.

Why a priority and not just a small weight: a locality weight of 1 out of 100 still sends
~1 % of requests into a zone the controller has judged bad, and 1 % is exactly where a
P99 lives (docs/dataplane.md has the figures). A drained zone at priority 1 gets no
requests while priority 0 is healthy, and gets them back by itself, without azprobe, when
Envoy's health checks or outlier detection say priority 0 cannot take the load
(fail-static: azprobe never removes a zone's endpoints, it only ranks them).

Pure: no I/O, imports only the weights contract.
"""

from __future__ import annotations

from collections.abc import Iterable

from azprobe.contracts.weights import WeightsDoc

# A zone is drained (failover only) when the controller marked it degraded or an operator
# shifted it, *and* its share has been cut to at most this many points of 100. A degraded
# zone still inside its drain dwell keeps its full share and stays at priority 0: the
# controller has not decided to drain it yet.
DRAINED_MAX_SHARE = 5
DRAINED_STATES = frozenset({"degraded", "shifted"})
FAILOVER_PRIORITY = 1


def failover_zones(weights: WeightsDoc | None, zones: Iterable[str]) -> set[str]:
    """The zones among `zones` (the ones with endpoints) to render as failover only.
    Never all of them: with nothing left at priority 0 there would be nothing to fail
    over from, so in that case (and without a usable document) none is."""
    if weights is None:
        return set()
    candidates = set(zones)
    drained = {az for az in candidates
               if az in weights.zones and weights.zones[az].state in DRAINED_STATES
               and weights.zones[az].share <= DRAINED_MAX_SHARE}
    return drained if drained != candidates else set()


def effective_shares(weights: WeightsDoc) -> dict[str, float]:
    """The percentage of requests each zone of the document gets while every zone at
    priority 0 is healthy: drained zones 0, the others their shares renormalised."""
    drained = failover_zones(weights, weights.zones)
    live = {az: z.share for az, z in weights.zones.items() if az not in drained}
    total = sum(live.values())
    return {az: (100.0 * live[az] / total if az in live else 0.0) for az in weights.zones}
