"""The agent's TOML config (notes/CONTRACTS.md "Agent config"), parsed strictly."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from azprobe import bpf
from azprobe.config import Section, load_toml, parse_host_port, parse_topology
from azprobe.errors import ConfigError

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
DEFAULT_LISTEN = "0.0.0.0:9740"


@dataclass(frozen=True)
class AgentConfig:
    node: str
    az: str
    listen: tuple[str, int]
    interval_s: float
    ring_size: int
    topology: dict[str, list[IPNetwork]]
    # This node's local addresses; empty: every socket the kernel sees is this node's.
    addresses: tuple[IPAddress, ...] = ()


def parse_node_addresses(section: Section, key: str = "addresses") -> tuple[IPAddress, ...]:
    """`[node] addresses`: unicast IPv4/IPv6 addresses (not networks), at most
    AZP_MAX_NODE_ADDRS of them; IPv4-mapped IPv6 counts as its IPv4 address."""
    field = section.field(key)
    limit = bpf.constant("MAX_NODE_ADDRS")
    values = section.string_list(key)
    if len(values) > limit:
        raise ConfigError(field, f"{len(values)} addresses, at most {limit}", "list only this node's own addresses")
    out: list[IPAddress] = []
    for value in values:
        try:
            addr = ipaddress.ip_address(value.strip())
        except ValueError:
            raise ConfigError(field, f"{value!r:.60} is not an IP address",
                              'list this node\'s own addresses, e.g. ["10.0.1.5", "fd00::5"]') from None
        if addr.version == 6 and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if addr.is_unspecified or addr.is_multicast:
            raise ConfigError(field, f"{value!r} is not a unicast address", "list this node's own addresses")
        if addr not in out:
            out.append(addr)
    return tuple(out)


def parse_agent_config(doc: Mapping[str, Any]) -> AgentConfig:
    """Validate a parsed TOML document; raises ConfigError naming the bad field."""
    root = Section(doc, "")
    node = root.section("node")
    agent = root.section("agent")
    topology = parse_topology(root.section("topology"))
    name = node.string("name", socket.gethostname())
    az = node.string("az", required=True)
    addresses = parse_node_addresses(node)
    node.reject_unknown()
    listen = parse_host_port(agent.string("listen", DEFAULT_LISTEN), agent.field("listen"))
    interval_s = agent.number("interval_s", 1.0, min=0.1, max=60.0)
    ring_size = agent.integer("ring_size", 300, min=1, max=100_000)
    agent.reject_unknown()
    root.reject_unknown()
    if not topology:
        raise ConfigError("topology", "no AZs defined", 'add e.g. az-a = ["198.18.1.0/24"]')
    if az not in topology:
        raise ConfigError("node.az", f"{az!r} is not an AZ of [topology]",
                          f"use one of {', '.join(sorted(topology))}")
    return AgentConfig(node=name, az=az, listen=listen, interval_s=interval_s,
                       ring_size=ring_size, topology=topology, addresses=addresses)


def load_agent_config(path: str | Path) -> AgentConfig:
    return parse_agent_config(load_toml(path))
