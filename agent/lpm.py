"""Topology -> LPM trie entries, with AZ ids that stay stable for the agent's lifetime.

One trie serves IPv4 and IPv6: an IPv4 network a.b.c.d/n is stored as ::ffff:a.b.c.d/(96+n),
which is also how the tracepoints report IPv4 addresses in their 16-byte fields.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from azprobe import bpf
from azprobe.errors import ConfigError
from azprobe.contracts.window import OTHER_AZ

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
V4_MAPPED_PREFIX = bytes(10) + b"\xff\xff"


@dataclass(frozen=True)
class TrieEntry:
    prefixlen: int
    addr: bytes  # 16 bytes
    az_id: int


class AzRegistry:
    """AZ name <-> small integer id. Ids are never reused while the agent runs, so the
    cumulative BPF counters of a path keep meaning the same AZs across SIGHUP reloads."""

    def __init__(self, max_az: int | None = None) -> None:
        self.max_az = max_az if max_az is not None else bpf.constant("MAX_AZ")
        self._ids: dict[str, int] = {}

    def assign(self, names: Iterable[str]) -> dict[str, int]:
        """Ids for `names`, allocating new ones in sorted order; raises ConfigError when full."""
        new = [n for n in sorted(set(names)) if n not in self._ids]
        if len(self._ids) + len(new) > self.max_az - 1:
            raise ConfigError("topology", f"more than {self.max_az - 1} AZs over this agent's life",
                              "restart the agent to reset AZ ids")
        for name in new:
            self._ids[name] = len(self._ids) + 1
        return {n: self._ids[n] for n in names}

    def name_of(self, az_id: int) -> str:
        if az_id == bpf.constant("AZ_OTHER"):
            return OTHER_AZ
        for name, i in self._ids.items():
            if i == az_id:
                return name
        return f"az-id-{az_id}"  # only if the map holds an id we never assigned

    @property
    def names(self) -> dict[int, str]:
        return {i: n for n, i in self._ids.items()}


def address_key(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bytes:
    """16-byte trie address: IPv6 as is, IPv4 as ::ffff:a.b.c.d."""
    if address.version == 4:
        return V4_MAPPED_PREFIX + address.packed
    return address.packed


def trie_entries(topology: Mapping[str, list[IPNetwork]], ids: Mapping[str, int]) -> list[TrieEntry]:
    entries = []
    for az, nets in topology.items():
        for net in nets:
            extra = 96 if net.version == 4 else 0
            entries.append(TrieEntry(net.prefixlen + extra, address_key(net.network_address), ids[az]))
    return entries
