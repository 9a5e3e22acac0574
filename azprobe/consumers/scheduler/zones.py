"""Which zone a node is in.

With full Node objects (kube-scheduler's `nodeCacheCapable: false`) the node says so
itself: label `topology.kubernetes.io/zone`, else the deprecated
`failure-domain.beta.kubernetes.io/zone`.

With names only (`nodeCacheCapable: true`) the request carries no labels, and the
extender asks no Kubernetes API: that would need a client, credentials and RBAC on
Nodes for a process that otherwise needs nothing but Consul, and a list/watch of every
Node is the very load nodeCacheCapable exists to avoid. So, in this order:

1. the zone label of a full Node seen with that name before (a profile that sends full
   objects teaches the others), at most `capacity` names kept, oldest dropped first;
2. `[nodes.zones]`: the operator's name -> zone table;
3. `nodes.name_patterns`: regular expressions with a `(?P<zone>...)` group, tried in
   order against the whole name (node pools are commonly named after their zone).

A name none of them knows has no zone: neutral score, never filtered.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence

ZONE_LABEL = "topology.kubernetes.io/zone"
LEGACY_ZONE_LABEL = "failure-domain.beta.kubernetes.io/zone"
MAX_ZONE_CHARS = 63  # a label value's limit


def checked_zone(zone: str) -> str | None:
    """A zone label's value, or None when it is empty or longer than a label value may be."""
    return zone if 0 < len(zone) <= MAX_ZONE_CHARS else None


class NodeZones:
    """Name -> zone for the NodeNames mode (module doc); thread-safe."""

    def __init__(self, static: Mapping[str, str] | None = None, patterns: Sequence[re.Pattern[str]] = (),
                 capacity: int = 20_000) -> None:
        self._static = dict(static or {})
        self._patterns = tuple(patterns)
        self._capacity = capacity
        self._learned: OrderedDict[str, str] = OrderedDict()
        # The configured answer (table, then patterns) of each name seen, None included:
        # kube-scheduler sends the same names in every request, and trying the patterns
        # on 5,000 names was most of a names-only answer. Dropped whole past capacity.
        self._configured: dict[str, str | None] = dict(self._static)
        self._lock = threading.Lock()

    def learn(self, names_zones: Sequence[tuple[str, str | None]]) -> None:
        """Remember the zones full Node objects carried."""
        with self._lock:
            learned = self._learned
            for name, zone in names_zones:
                if zone is None:
                    continue
                if learned.get(name) != zone:
                    learned[name] = zone
                learned.move_to_end(name)
            while len(learned) > self._capacity:
                learned.popitem(last=False)

    def _match(self, name: str) -> str | None:
        zone = None
        for pattern in self._patterns:
            match = pattern.fullmatch(name)
            if match and match["zone"]:
                zone = match["zone"]
                break
        configured = self._configured
        if len(configured) >= len(self._static) + self._capacity:
            configured = self._configured = dict(self._static)  # a swap: readers hold the old dict
        configured[name] = zone
        return zone

    def zone_of(self, name: str) -> str | None:
        return self.zones_of((name,))[0]

    def zones_of(self, names: Sequence[str]) -> list[str | None]:
        # Dict reads are atomic; learn() holds the lock to change _learned.
        learned, configured, out = self._learned, self._configured, []
        for name in names:
            zone = learned.get(name)
            if zone is None:
                zone = configured[name] if name in configured else self._match(name)
            out.append(zone)
        return out

    @property
    def learned(self) -> int:
        return len(self._learned)
