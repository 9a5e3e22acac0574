"""The one rendering of a weights document onto a service's endpoints: which localities,
with which weight and priority. The file renderer (azprobe.consumers.envoy) and the xDS
server (azprobe.consumers.xds) both turn this plan into their own encoding, so the two
doors cannot disagree on where traffic goes.

Weight policy (Envoy rejects a whole update if any locality weight is 0, so none is):
- fresh document: each AZ gets its `share` (an integer >= 1 by contract);
- an AZ with endpoints but absent from the document gets the smallest share of the
  document: no evidence against it, so not drained, but not favoured over zones that
  earned their share either;
- no usable document (None: expired, or the key absent): every AZ gets weight 1 (equal
  spread), the design's fallback, never "everything down".
AZs in the document without endpoints are skipped: there is nothing to route to.

Drained zones (azprobe.consumers.failover) go to priority 1, the others stay at
priority 0 (docs/dataplane.md). The caller decides expiry: a stale document is passed
as None.

Sick hosts (the controller's sick-hosts document, azprobe.contracts.weights_hosts) mark
their endpoints degraded: Envoy and gRPC then use them only when the zone's healthy
endpoints are not enough, so a wrong call costs little. At most a third of a zone's
endpoints (rounded down) at once, the worst host first (as Envoy's max_ejection_percent
bounds its own ejections); a degraded endpoint keeps its place and its locality its
weight, so no endpoint list is ever empty and no weight 0.

Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from azprobe.consumers.failover import FAILOVER_PRIORITY, failover_zones
from azprobe.contracts.weights import WeightsDoc
from azprobe.contracts.weights_hosts import HostsDoc

Endpoint = tuple[str, int]  # (ip, port)
PRIMARY_PRIORITY = 0


@dataclass(frozen=True)
class Locality:
    zone: str
    weight: int  # >= 1
    priority: int  # PRIMARY_PRIORITY or FAILOVER_PRIORITY
    endpoints: tuple[Endpoint, ...]  # non-empty, in the given order
    degraded: frozenset[Endpoint] = frozenset()  # of `endpoints`: fewer than a third of them


class NoEndpoints(ValueError):
    """No AZ has an endpoint: there is nothing to render (never an empty assignment)."""


def locality_weights(zones: Sequence[str], weights: WeightsDoc | None) -> dict[str, int]:
    """The weight policy of the module doc; every value is an int >= 1."""
    if weights is None:
        return {az: 1 for az in zones}
    floor = max(1, min(z.share for z in weights.zones.values()))
    return {az: max(1, weights.zones[az].share) if az in weights.zones else floor for az in zones}


def _canonical(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address


def degraded_endpoints(endpoints: Sequence[Endpoint], sick: Sequence[str]) -> frozenset[Endpoint]:
    """The endpoints of the sick addresses (worst first) to mark degraded: whole hosts,
    while they fit in a third of the zone's endpoints."""
    budget = len(endpoints) // 3
    if not sick or not budget:
        return frozenset()
    by_addr: dict[str, list[Endpoint]] = {}
    for ep in endpoints:
        by_addr.setdefault(_canonical(ep[0]), []).append(ep)
    out: set[Endpoint] = set()
    for addr in sick:
        mine = [ep for ep in by_addr.get(_canonical(addr), ()) if ep not in out]
        if len(out) + len(mine) > budget:
            break  # the worst go first: a lesser host never takes a worse one's place
        out.update(mine)
    return frozenset(out)


def plan_localities(endpoints: Mapping[str, Sequence[Endpoint]], weights: WeightsDoc | None,
                    sick: Mapping[str, Sequence[str]] | None = None) -> list[Locality]:
    """One Locality per AZ with endpoints, sorted by zone name. `sick`: zone -> the
    addresses of its sick hosts, worst first (None or absent: none). Raises NoEndpoints
    when no AZ has one."""
    zones = sorted(az for az, hosts in endpoints.items() if hosts)
    if not zones:
        raise NoEndpoints("no AZ has endpoints")
    weight_of = locality_weights(zones, weights)
    failover = failover_zones(weights, zones)
    sick = sick or {}
    return [Locality(zone=az, weight=weight_of[az],
                     priority=FAILOVER_PRIORITY if az in failover else PRIMARY_PRIORITY,
                     endpoints=tuple(endpoints[az]), degraded=degraded_endpoints(endpoints[az], sick.get(az, ())))
            for az in zones]


def sick_addresses(hosts: HostsDoc | None, source_az: str | None = None) -> dict[str, list[str]]:
    """zone -> sick addresses, worst first, from a fresh sick-hosts document (None: none)."""
    if hosts is None:
        return {}
    view = hosts.sick(source_az)
    return {az: [h.addr for h in entries] for az, entries in view.items()}
