"""The model-input contract: evidence about one destination AZ (`ZoneStats`).

The controller's merge produces one `ZoneStats` per destination AZ and view; a model
turns them into health and weight (azprobe.controller.models); `azprobe model` reads
them as a JSON document ``{"zones": {az: {...}}}``, or per vantage point as
``{"nodes": [{"node", "az", "zones"}]}`` (docs/contracts.md "Model input").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from azprobe.contracts.weights import MAX_ZONES
from azprobe.contracts.window import (MAX_AZ_NAME, MAX_HOSTS, MAX_NODE_NAME, HostStats, WindowError,
                                      is_canonical_address, name_problem, parse_host, printable)


class StatsError(ValueError):
    """A model-input document that breaks the contract; the message names the field."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


def finite(value: float | None) -> float | None:
    """None for None/NaN/inf: a broken input is a missing input, never a verdict."""
    if type(value) is float:  # nearly every call, at ~10^5 calls per cycle
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class ZoneStats:
    """Evidence about one destination AZ over the evaluation window.

    success: connect success rate ok/(ok+refused+timeout), None when nothing completed.
    p95_ms: P95 smoothed RTT from the merged histogram, None without RTT samples.
    util: weighted CPU+memory utilisation of the AZ's nodes, None without agents there.
    syn_retrans_per_conn / rto_per_conn: per connect attempt.
    samples: completed connections + RTT samples (how much evidence this is).
    """

    success: float | None = None
    p95_ms: float | None = None
    util: float | None = None
    syn_retrans_per_conn: float = 0.0
    rto_per_conn: float = 0.0
    samples: int = 0

    def is_evidence(self, min_samples: int) -> bool:
        """Enough samples, and at least one usable signal, to act on."""
        if self.samples < min_samples:
            return False
        return finite(self.success) is not None or finite(self.p95_ms) is not None

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, doc: object, where: str = "zone") -> "ZoneStats":
        """Validate one zone's stats; raises StatsError naming the field (e.g. zones.az-a.success)."""
        if not isinstance(doc, Mapping):
            raise StatsError(where, "expected an object")
        known = {f.name for f in fields(cls)}
        for key in doc:
            if key not in known:
                raise StatsError(f"{where}.{key}", f"unknown field (known: {', '.join(sorted(known))})")

        def number(key: str, lo: float, hi: float, optional: bool, default: float | None) -> float | None:
            value = doc.get(key, default)
            if value is None and optional:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise StatsError(f"{where}.{key}", f"expected a number, got {value!r:.40}")
            value = float(value)
            if not math.isfinite(value) or not lo <= value <= hi:
                raise StatsError(f"{where}.{key}", f"{value} is outside {lo}..{hi}")
            return value

        samples = doc.get("samples", 0)
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise StatsError(f"{where}.samples", f"expected an integer >= 0, got {samples!r:.40}")
        return cls(
            success=number("success", 0.0, 1.0, True, None),
            p95_ms=number("p95_ms", 0.0, 1e9, True, None),
            util=number("util", 0.0, 1.0, True, None),
            syn_retrans_per_conn=number("syn_retrans_per_conn", 0.0, 1e9, False, 0.0) or 0.0,
            rto_per_conn=number("rto_per_conn", 0.0, 1e9, False, 0.0) or 0.0,
            samples=samples,
        )


MAX_VANTAGE_POINTS = 100_000  # nodes in one per-node document (the daemon's design fleet is 5,000)


def _zones(doc: object, where: str) -> dict[str, ZoneStats]:
    """An object of AZ name -> stats: at most MAX_ZONES, names as agents report them."""
    if not isinstance(doc, Mapping):
        raise StatsError(where, "expected an object of AZ name -> stats")
    if len(doc) > MAX_ZONES:
        raise StatsError(where, f"{len(doc)} zones exceed {MAX_ZONES}")
    out: dict[str, ZoneStats] = {}
    for az, zone in doc.items():
        problem = name_problem(az, MAX_AZ_NAME)
        if problem:
            raise StatsError(where, f"AZ name {printable(az, 70)!r} {problem}")
        out[az] = ZoneStats.from_json(zone, f"{where}.{az}")
    return out


def parse_stats_document(doc: object) -> dict[str, ZoneStats]:
    """``{"zones": {az: {...}}}`` -> {az: ZoneStats}; raises StatsError naming the field."""
    if not isinstance(doc, Mapping):
        raise StatsError("stats", "expected a JSON object with a 'zones' object")
    zones = doc.get("zones")
    if not isinstance(zones, Mapping) or not zones:
        raise StatsError("zones", "expected a non-empty object of AZ name -> stats")
    return _zones(zones, "zones")


@dataclass(frozen=True)
class VantageStats:
    """What one node (in AZ `az`) saw of each destination AZ."""

    node: str
    az: str
    zones: dict[str, ZoneStats]
    hosts: tuple[HostStats, ...] = ()  # optional: the node's per-address sums, as the window's hosts section


def _hosts(doc: object, where: str, az: str) -> tuple[HostStats, ...]:
    """A node's host summaries (the window contract's form); each (dst, addr) once, src its AZ."""
    if not isinstance(doc, list) or len(doc) > MAX_HOSTS:
        raise StatsError(where, f"expected a list of at most {MAX_HOSTS} host summaries")
    out = []
    for i, raw in enumerate(doc):
        try:
            host = parse_host(raw, f"{where}[{i}]")
        except WindowError as exc:
            raise StatsError(f"{where}[{i}]", str(exc)) from None
        if not is_canonical_address(host.addr):
            raise StatsError(f"{where}[{i}].addr", "expected an IPv4 or IPv6 address in canonical form")
        if host.src != az:
            raise StatsError(f"{where}[{i}].src", f"{host.src!r} is not the node's AZ {az!r}")
        out.append(host)
    if len({(h.dst, h.addr) for h in out}) != len(out):
        raise StatsError(where, "a (dst, addr) host appears twice")
    return tuple(out)


def parse_nodes_document(doc: object) -> list[VantageStats]:
    """``{"nodes": [{"node": N, "az": AZ, "zones": {az: {...}}, "hosts": [...]}, ...]}`` -> one
    VantageStats per node, in order (`hosts` optional); raises StatsError naming the field
    (e.g. nodes[3].zones.az-a.success)."""
    if not isinstance(doc, Mapping):
        raise StatsError("stats", "expected a JSON object with a 'nodes' list")
    nodes = doc.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise StatsError("nodes", "expected a non-empty list of {node, az, zones}")
    if len(nodes) > MAX_VANTAGE_POINTS:
        raise StatsError("nodes", f"{len(nodes)} nodes exceed {MAX_VANTAGE_POINTS}")
    out: list[VantageStats] = []
    names: set[str] = set()
    for i, entry in enumerate(nodes):
        where = f"nodes[{i}]"
        if not isinstance(entry, Mapping):
            raise StatsError(where, "expected an object {node, az, zones}")
        for key in entry:
            if key not in ("node", "az", "zones", "hosts"):
                raise StatsError(f"{where}.{printable(key, 40)}", "unknown field (known: az, hosts, node, zones)")
        node, az = entry.get("node"), entry.get("az")
        for key, value, limit in (("node", node, MAX_NODE_NAME), ("az", az, MAX_AZ_NAME)):
            problem = name_problem(value, limit)
            if problem:
                raise StatsError(f"{where}.{key}", problem)
        assert isinstance(node, str) and isinstance(az, str)
        if node in names:
            raise StatsError(f"{where}.node", f"{node!r} appears twice: every node counts once")
        names.add(node)
        out.append(VantageStats(node, az, _zones(entry.get("zones", {}), f"{where}.zones"),
                                _hosts(entry.get("hosts", []), f"{where}.hosts", az)))
    return out
