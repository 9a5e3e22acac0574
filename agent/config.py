"""The agent's TOML config (notes/CONTRACTS.md "Agent config"), parsed strictly."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from azprobe.config import Section, load_toml, parse_host_port, parse_topology
from azprobe.errors import ConfigError

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
DEFAULT_LISTEN = "0.0.0.0:9740"
# "auto": the BPF probe, or the sock_diag sampler where the probe cannot load.
COLLECTORS = ("auto", "bpf", "sockdiag")


@dataclass(frozen=True)
class AgentConfig:
    node: str
    az: str
    listen: tuple[str, int]
    interval_s: float
    ring_size: int
    topology: dict[str, list[IPNetwork]]
    collector: str = "auto"


def parse_agent_config(doc: Mapping[str, Any]) -> AgentConfig:
    """Validate a parsed TOML document; raises ConfigError naming the bad field."""
    root = Section(doc, "")
    node = root.section("node")
    agent = root.section("agent")
    topology = parse_topology(root.section("topology"))
    name = node.string("name", socket.gethostname())
    az = node.string("az", required=True)
    node.reject_unknown()
    listen = parse_host_port(agent.string("listen", DEFAULT_LISTEN), agent.field("listen"))
    interval_s = agent.number("interval_s", 1.0, min=0.1, max=60.0)
    ring_size = agent.integer("ring_size", 300, min=1, max=100_000)
    collector = agent.string("collector", "auto")
    if collector not in COLLECTORS:
        raise ConfigError(agent.field("collector"), f"{collector!r} is not a collector",
                          f"use one of {', '.join(COLLECTORS)}")
    agent.reject_unknown()
    root.reject_unknown()
    if not topology:
        raise ConfigError("topology", "no AZs defined", 'add e.g. az-a = ["198.18.1.0/24"]')
    if az not in topology:
        raise ConfigError("node.az", f"{az!r} is not an AZ of [topology]",
                          f"use one of {', '.join(sorted(topology))}")
    return AgentConfig(node=name, az=az, listen=listen, interval_s=interval_s,
                       ring_size=ring_size, topology=topology, collector=collector)


def load_agent_config(path: str | Path) -> AgentConfig:
    return parse_agent_config(load_toml(path))
