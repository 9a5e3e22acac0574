"""The extender's decision, pure: which nodes a filter keeps and what each node scores.

A zone's standing is read from a weights document by the rule every consumer uses
(azprobe.consumers.failover): `failover_zones` says which zones are failover only,
`effective_shares` what share each zone gets. So the extender, envoy-eds and
`azprobe weights` tell one story:

- prioritize: a zone scores MAX_EXTENDER_PRIORITY * its effective share / the largest
  effective share, rounded: the healthiest zone 10, a failover-only zone 0, a zone in
  between in proportion. A node without a zone, or with a zone the document does not
  list, scores NEUTRAL_SCORE: no evidence for or against it.
- filter: removes the nodes of the failover-only zones among the request's own zones
  (`failover_zones` never names all of them), never a node without a known zone.

Fail static: without a usable document (`weights` None) or when a filter would leave no
node, nothing is removed and every node scores NEUTRAL_SCORE; the caller says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from azprobe.consumers.failover import effective_shares, failover_zones
from azprobe.contracts.weights import WeightsDoc

# k8s.io/kube-scheduler/extender/v1: MinExtenderPriority, MaxExtenderPriority.
MIN_EXTENDER_PRIORITY = 0
MAX_EXTENDER_PRIORITY = 10
# Halfway: a node the weights say nothing about ranks below a healthy zone's nodes and
# above a failover-only zone's. With no usable document every node gets it, so the
# extender adds the same to every node's total and changes no choice.
NEUTRAL_SCORE = 5

WOULD_LEAVE_NO_NODE = "would_leave_no_node"


@dataclass(frozen=True)
class FilterDecision:
    kept: tuple[int, ...]  # indices into the request's nodes, in request order
    removed: tuple[int, ...]
    failover: frozenset[str]  # the zones whose nodes were removed
    neutral_reason: str | None  # set when the filter removed nothing although it could not act


def zone_scores(weights: WeightsDoc | None) -> dict[str, int]:
    """Score of each zone the document lists; empty without a document."""
    if weights is None:
        return {}
    shares = effective_shares(weights)
    top = max(shares.values())
    return {az: _score(MAX_EXTENDER_PRIORITY * share / top) for az, share in shares.items()}


def _score(value: float) -> int:
    return max(MIN_EXTENDER_PRIORITY, min(MAX_EXTENDER_PRIORITY, int(value + 0.5)))


def prioritize(weights: WeightsDoc | None, node_zones: Sequence[str | None]) -> list[int]:
    """One score per node, in request order."""
    scores = zone_scores(weights)
    return [scores.get(az, NEUTRAL_SCORE) if az is not None else NEUTRAL_SCORE for az in node_zones]


def filter_nodes(weights: WeightsDoc | None, node_zones: Sequence[str | None]) -> FilterDecision:
    """Keep every node except those of the failover-only zones (module doc)."""
    everything = FilterDecision(tuple(range(len(node_zones))), (), frozenset(), None)
    if weights is None or not node_zones:
        return everything
    present = {az for az in node_zones if az is not None and az in weights.zones}
    failover = frozenset(failover_zones(weights, present))
    if not failover:
        return everything
    kept = tuple(i for i, az in enumerate(node_zones) if az not in failover)
    if not kept:  # failover_zones never names every zone; a guard, not a path
        return FilterDecision(everything.kept, (), frozenset(), WOULD_LEAVE_NO_NODE)
    removed = tuple(i for i, az in enumerate(node_zones) if az in failover)
    return FilterDecision(kept, removed, failover, None)
