"""The agent's TOML config (docs/contracts.md "Agent config"), parsed strictly."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from azprobe import bpf
from azprobe.config import Section, load_toml, parse_host_port, parse_topology, read_token_file
from azprobe.daemon.address_file import format_host_port
from azprobe.contracts.window import MAX_AZ_NAME, MAX_NODE_NAME, MIN_INTERVAL_S, name_problem, printable
from azprobe.errors import ConfigError
from azprobe.security.tls import TlsFiles, parse_tls_files

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
DEFAULT_LISTEN = "0.0.0.0:9740"
# Seconds per window: a fault shows in a published window half a second sooner than with
# 1 s windows, for twice the (small) cost of draining the maps (bench/loop.py --config shipped).
DEFAULT_INTERVAL_S = 0.5
# "auto": the BPF probe, or the sock_diag sampler where the probe cannot load.
COLLECTORS = ("auto", "bpf", "sockdiag")
# RTT sampling (docs/probe.md "RTT sampling"): tcp_probe takes the segments of one kernel
# tick in every `rtt_sample_ticks`. A power of two, so the program tests it with one AND.
RTT_SAMPLE_TICKS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_RTT_SAMPLE_TICKS = 4
# Per-destination-host summaries (docs/probe.md "Hosts"): the kernel table's size. 256
# covers a node talking to a few hundred backends; a window with all of them is ~40 KB
# of JSON, and a windows page carries at most MAX_HOSTS_LIMIT summaries (agent/main.py),
# ~0.5 MB, within the controller's 1 MiB bound. 0: no host evidence, no cost.
DEFAULT_MAX_HOSTS = 256
MAX_HOSTS_LIMIT = 2048


@dataclass(frozen=True)
class AgentConfig:
    node: str
    az: str
    listen: tuple[str, int]
    interval_s: float
    ring_size: int
    topology: dict[str, list[IPNetwork]]
    token_file: str = ""  # a bearer token every /v1/* request must carry (docs/scale.md)
    token: str = field(default="", repr=False)
    collector: str = "auto"
    # This node's local addresses; empty: every socket the kernel sees is this node's.
    addresses: tuple[IPAddress, ...] = ()
    rtt_sample_ticks: int = DEFAULT_RTT_SAMPLE_TICKS
    max_hosts: int = DEFAULT_MAX_HOSTS
    # [agent.tls]: HTTPS only, with this node's certificate; clients must present one
    # signed by ca_file, and carry the SAN client_identity when it is set.
    tls: TlsFiles | None = None
    client_identity: str = ""


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
    # The controller identifies an agent by these names (docs/quorum.md "Identity"): one
    # it would refuse is a config error here, not every window silently rejected there.
    for key, value, limit in (("name", name, MAX_NODE_NAME), ("az", az, MAX_AZ_NAME)):
        problem = name_problem(value, limit)
        if problem:
            raise ConfigError(node.field(key), f"{printable(value, 40)!r} {problem}",
                              f"use 1..{limit} of letters, digits, '.', '_', '-'"
                              + (" (set it explicitly: the host name does not fit)" if key == "name" else ""))
    listen = parse_host_port(agent.string("listen", DEFAULT_LISTEN), agent.field("listen"), listen=True)
    interval_s = agent.number("interval_s", DEFAULT_INTERVAL_S, min=MIN_INTERVAL_S, max=60.0)
    ring_size = agent.integer("ring_size", 300, min=1, max=100_000)
    token_file = agent.string("token_file", "")
    token = read_token_file(token_file, agent.field("token_file")) if token_file else ""
    collector = agent.string("collector", "auto")
    if collector not in COLLECTORS:
        raise ConfigError(agent.field("collector"), f"{collector!r} is not a collector",
                          f"use one of {', '.join(COLLECTORS)}")
    rtt_sample_ticks = agent.integer("rtt_sample_ticks", DEFAULT_RTT_SAMPLE_TICKS, min=1, max=RTT_SAMPLE_TICKS[-1])
    if rtt_sample_ticks not in RTT_SAMPLE_TICKS:
        raise ConfigError(agent.field("rtt_sample_ticks"), f"{rtt_sample_ticks} is not a power of two",
                          f"use one of {', '.join(map(str, RTT_SAMPLE_TICKS))} (1: every segment)")
    max_hosts = agent.integer("max_hosts", DEFAULT_MAX_HOSTS)
    if not 0 <= max_hosts <= MAX_HOSTS_LIMIT:
        raise ConfigError(agent.field("max_hosts"), f"{max_hosts} is outside 0..{MAX_HOSTS_LIMIT}",
                          f"use 1..{MAX_HOSTS_LIMIT} host summaries per node, or 0 for none")
    tls, client_identity = _agent_tls(agent)
    agent.reject_unknown()
    root.reject_unknown()
    if not topology:
        raise ConfigError("topology", "no AZs defined", 'add e.g. az-a = ["198.18.1.0/24"]')
    if az not in topology:
        raise ConfigError("node.az", f"{az!r} is not an AZ of [topology]",
                          f"use one of {', '.join(sorted(topology))}")
    return AgentConfig(node=name, az=az, listen=listen, interval_s=interval_s,
                       ring_size=ring_size, topology=topology, token_file=token_file, token=token,
                       collector=collector, addresses=addresses, rtt_sample_ticks=rtt_sample_ticks,
                       max_hosts=max_hosts, tls=tls, client_identity=client_identity)


def _agent_tls(agent: Section) -> tuple[TlsFiles | None, str]:
    """[agent.tls]: cert_file, key_file, ca_file (required: mutual TLS), client_identity."""
    if not agent.has("tls"):
        return None, ""
    table = agent.section("tls")
    client_identity = table.string("client_identity", "")
    files = parse_tls_files(table, table.name, server=True, extra=frozenset({"client_identity"}))
    if not files.ca_file:
        raise ConfigError(table.field("ca_file"), "is required: the agent serves only clients signed by it",
                          "set it to the CA that signs the controller's client certificate")
    return files, client_identity


def load_agent_config(path: str | Path) -> AgentConfig:
    return parse_agent_config(load_toml(path))


# What a reload (SIGHUP) keeps at its running value, by config field -> AgentConfig
# attribute: the node's name and AZ are how the controller knows its windows (one boot
# with two identities is refused), and the listener and the ring are built once at start;
# a changed TLS file's content is re-read, its path is not. A reload names each one that
# changed in one warning line, as the controller's does (controller/reload.py). Every
# other field is applied, the token file's content included; rtt_sample_ticks and
# max_hosts size the loaded probe, and agent.main warns of those on its own.
RESTART_FIELDS: dict[str, str] = {
    "node.name": "node", "node.az": "az", "agent.listen": "listen", "agent.ring_size": "ring_size",
    "agent.tls": "tls", "agent.tls.client_identity": "client_identity",
}


def _shown(value: object) -> str:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
        return repr(format_host_port(*value))
    if isinstance(value, TlsFiles):
        return f"cert_file {value.cert_file!r}, key_file {value.key_file!r}, ca_file {value.ca_file!r}"
    return repr(value) if isinstance(value, str) else printable(value, 200)


def running_config(old: AgentConfig, new: AgentConfig) -> tuple[AgentConfig, str]:
    """`new` with every RESTART_FIELDS field at its running value in `old`, and the reload's
    warning naming each of them that changed ("": none did). ConfigError when the running
    AZ is not in the new [topology]: the agent could not place its own sockets."""
    changed = [(path, attr) for path, attr in RESTART_FIELDS.items() if getattr(old, attr) != getattr(new, attr)]
    config = replace(new, **{attr: getattr(old, attr) for attr in RESTART_FIELDS.values()})
    if config.az not in config.topology:  # start's check, on the config that would run
        raise ConfigError("node.az", f"{config.az!r} is not an AZ of [topology], with the running node.az kept "
                                     "until a restart", f"keep {config.az!r} in [topology]; or restart the agent "
                                                        "to take the whole file")
    if not changed:
        return config, ""
    told = ", ".join(f"{path} changed from {_shown(getattr(old, attr))} to {_shown(getattr(new, attr))}"
                     for path, attr in changed)
    if len(changed) == 1:
        return config, f"reload: {told}: needs a restart, running on with {_shown(getattr(old, changed[0][1]))}"
    return config, f"reload: {told}: need a restart, running on with the old values"
