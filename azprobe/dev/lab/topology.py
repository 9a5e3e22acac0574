"""The lab's address plan: pure data, no kernel access.

One lab owns one /20 of 198.18.0.0/15 (32 slots, chosen by `index`) and, with IPv6, the
matching /56 of the benchmarking range 2001:2::/48. Two labs up at once therefore never
share an address, which matters because the BPF probe is global across namespaces: equal
addresses in two labs would mix their statistics.

Inside the /20, AZ number k (0-based) owns the /24 number k+1:

    198.18.0.0/15 + index*4096 + (k+1)*256
      .0/25    servers, one /30 link each: server j has router .4j+1, server .4j+2
               (namespace <name>-srv-<az> for server 0, <name>-srv-<az>-<j> after)
      .128/25  client nodes, one /30 link each: node i has router .128+4i+1, client
               .128+4i+2 (namespace <name>-cli-<az> for node 0, <name>-cli-<az>-<i> after)

IPv6, AZ k of lab `index` owns the /60 2001:2:0:GGG0::/60 with GGG = index<<4 | (k+1):
      ...:GGG0::/64 servers, one /120 each: server j has router ::j01, server ::j02 (hex)
      ...:GGG1::/64 client nodes, one /120 each: node i has router ::i01, client ::i02 (hex)

Node 0 and server 0 keep the addresses of a one-node, one-server lab (.130 and .2). Every client node is a
namespace of its own with its own addresses, so one agent per node can count only its
node's sockets (`[node] addresses`): the lab's vantage points.

So a client of AZ X and the servers of AZ X are both inside X's CIDRs, which is what the
agent's topology needs: every path the probe sees is (client AZ -> server AZ).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from azprobe.errors import ConfigError

V4_SPACE = ipaddress.IPv4Network("198.18.0.0/15")
V6_SPACE = ipaddress.IPv6Network("2001:2::/48")
LAB_SLOTS = 32  # /20s in the /15
MAX_AZS = 15  # /24s left in a /20 after the reserved first one
MAX_NODES_PER_AZ = 16  # /30 client links in the /25; the BCC agents, not addresses, are the real limit
MAX_SERVERS_PER_AZ = 32  # /30 server links in the /25
# `lab up` and the demo: enough vantage points for the controller's production quorum
# (>= max(3, 30 %) of the reporting nodes, over >= 2 source AZs) with one AZ's uplink
# sick; small enough for one agent + one generator per node on a 2-core box (docs/lab.md).
DEFAULT_NODES_PER_AZ = 3
NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,9}$")
DEFAULT_NAME = "azp"
DEFAULT_PORT = 7000
HTTP_PORT = 8080  # every AZ's HTTP/1.1 server (azprobe.dev.lab.http), for Envoy and the drill


def validate_name(name: str) -> str:
    """A lab name prefixes every namespace and the nft table; no '-' so prefixes never nest."""
    if not NAME_RE.match(name):
        raise ConfigError("name", f"bad lab name {name!r}",
                          "use 1-10 characters: a lowercase letter, then letters or digits")
    return name


def az_names(count: int) -> list[str]:
    """az-a, az-b, ... for `--azs N`."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_AZS:
        raise ConfigError("azs", f"{count!r} is not a number of AZs in 1..{MAX_AZS}", "for example --azs 3")
    return [f"az-{chr(ord('a') + k)}" for k in range(count)]


@dataclass(frozen=True)
class Link:
    """One veth between the router and a host namespace (router side named `router_ifname`)."""

    router_ifname: str
    host_ifname: str
    router_v4: ipaddress.IPv4Interface
    host_v4: ipaddress.IPv4Interface
    router_v6: ipaddress.IPv6Interface | None
    host_v6: ipaddress.IPv6Interface | None

    @property
    def host_ip4(self) -> str:
        return str(self.host_v4.ip)

    @property
    def host_ip6(self) -> str | None:
        return str(self.host_v6.ip) if self.host_v6 else None


def _validate_count(count: int, flag: str, what: str, most: int, example: int) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= most:
        raise ConfigError(flag, f"{count!r} is not a number of {what} in 1..{most}", f"for example --{flag} {example}")
    return count


def validate_nodes_per_az(count: int) -> int:
    return _validate_count(count, "nodes-per-az", "client nodes", MAX_NODES_PER_AZ, 3)


def validate_servers_per_az(count: int) -> int:
    return _validate_count(count, "servers-per-az", "servers", MAX_SERVERS_PER_AZ, 2)


@dataclass(frozen=True)
class LabHost:
    """One host of an AZ: a namespace with its own link (and addresses) to the router."""

    az: str
    number: int  # 0-based within its AZ
    ns: str
    link: Link

    @property
    def name(self) -> str:
        """The host's name (a client node's agent `[node] name`): its namespace's name."""
        return self.ns

    @property
    def v4(self) -> str:
        return self.link.host_ip4

    @property
    def v6(self) -> str | None:
        return self.link.host_ip6

    @property
    def addresses(self) -> list[str]:
        return [self.v4] + ([self.v6] if self.v6 else [])


@dataclass(frozen=True)
class ClientNode(LabHost):
    """One client node of an AZ."""


@dataclass(frozen=True)
class ServerHost(LabHost):
    """One server of an AZ."""

    @property
    def counter_prefix(self) -> str:
        """nft object names of faults aimed at this server: host_az_b_1."""
        return f"host_{self.az.replace('-', '_')}_{self.number}"


@dataclass(frozen=True)
class ZonePlan:
    """One AZ: its CIDRs, its server namespace and its client nodes."""

    az: str
    number: int  # 0-based position, also the delay line's NFQUEUE number minus 1
    cidr_v4: ipaddress.IPv4Network
    cidr_v6: ipaddress.IPv6Network | None
    servers: tuple[ServerHost, ...]
    clients: tuple[ClientNode, ...]

    @property
    def server_ns(self) -> str:
        """The first server's namespace (the only one in a one-server lab)."""
        return self.servers[0].ns

    @property
    def server_link(self) -> Link:
        return self.servers[0].link

    @property
    def server_ifname_prefix(self) -> str:
        """Router-side names of this AZ's server links all start with this (s-az-b, s-az-b-1,
        ...): traffic toward the AZ, as nft (`s-az-b*`) and iptables (`s-az-b+`) see it."""
        return f"s-{self.az}"

    @property
    def client_ns(self) -> str:
        """The first client node's namespace (the only one in a one-node lab)."""
        return self.clients[0].ns

    @property
    def client_link(self) -> Link:
        return self.clients[0].link

    @property
    def client_ifname_prefix(self) -> str:
        """Router-side names of this AZ's client links all start with this (c-az-b, c-az-b-1, ...):
        the AZ's uplink, as nft (`c-az-b*`) and iptables (`c-az-b+`) wildcards see it."""
        return f"c-{self.az}"

    @property
    def cidrs(self) -> list[str]:
        return [str(self.cidr_v4)] + ([str(self.cidr_v6)] if self.cidr_v6 else [])

    @property
    def server_v4(self) -> str:
        return self.server_link.host_ip4

    @property
    def server_v6(self) -> str | None:
        return self.server_link.host_ip6

    @property
    def client_v4(self) -> str:
        """The first client node's address (the only one in a one-node lab)."""
        return self.clients[0].v4

    @property
    def client_v6(self) -> str | None:
        return self.clients[0].v6

    @property
    def counter_prefix(self) -> str:
        # nft object names: keep to [a-z0-9_]
        return self.az.replace("-", "_")


@dataclass(frozen=True)
class LabPlan:
    name: str
    index: int
    ipv6: bool
    zones: tuple[ZonePlan, ...]

    @property
    def router_ns(self) -> str:
        return f"{self.name}-router"

    @property
    def nft_table(self) -> str:
        return self.name

    @property
    def namespaces(self) -> list[str]:
        return [self.router_ns] + [s.ns for s in self.servers] + [n.ns for n in self.client_nodes]

    @property
    def servers(self) -> list[ServerHost]:
        """Every server, AZ by AZ."""
        return [s for z in self.zones for s in z.servers]

    @property
    def servers_per_az(self) -> int:
        return len(self.zones[0].servers)

    def server(self, addr: str) -> ServerHost:
        """The server that has address `addr` (IPv4 or IPv6, any spelling)."""
        try:
            ip = ipaddress.ip_address(addr)
        except ValueError:
            raise ConfigError("host", f"{addr!r} is not an IP address",
                              "give a server's address as `azprobe lab status` lists it") from None
        for s in self.servers:
            if any(ipaddress.ip_address(a) == ip for a in s.addresses):
                return s
        raise ConfigError("host", f"{addr} is no server of lab {self.name!r}",
                          f"choose one of: {', '.join(s.v4 for s in self.servers)}")

    @property
    def client_nodes(self) -> list[ClientNode]:
        """Every client node, AZ by AZ."""
        return [n for z in self.zones for n in z.clients]

    @property
    def nodes_per_az(self) -> int:
        return len(self.zones[0].clients)

    def node(self, az: str, number: int = 0) -> ClientNode:
        """Client node `number` (0-based) of `az`."""
        clients = self.zone(az).clients
        if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < len(clients):
            raise ConfigError("node", f"{az} has no client node {number!r}", f"use 0..{len(clients) - 1}")
        return clients[number]

    @property
    def azs(self) -> list[str]:
        return [z.az for z in self.zones]

    @property
    def cidr_v4(self) -> ipaddress.IPv4Network:
        return lab_v4_block(self.index)

    def zone(self, az: str) -> ZonePlan:
        for z in self.zones:
            if z.az == az:
                return z
        raise ConfigError("az", f"no AZ {az!r} in lab {self.name!r}", f"choose one of: {', '.join(self.azs)}")

    def topology(self) -> dict[str, list[str]]:
        """AZ -> CIDRs, the agent config's [topology]."""
        return {z.az: z.cidrs for z in self.zones}


def lab_v4_block(index: int) -> ipaddress.IPv4Network:
    return list(V4_SPACE.subnets(new_prefix=20))[index]


def _v6_net(group: int, prefixlen: int) -> ipaddress.IPv6Network:
    base = int(V6_SPACE.network_address) + (group << 64)
    return ipaddress.IPv6Network((base, prefixlen))


def _link(router_ifname: str, net4: ipaddress.IPv4Network, net6: ipaddress.IPv6Network | None) -> Link:
    r4 = ipaddress.IPv4Interface((int(net4.network_address) + 1, net4.prefixlen))
    h4 = ipaddress.IPv4Interface((int(net4.network_address) + 2, net4.prefixlen))
    r6 = h6 = None
    if net6 is not None:
        r6 = ipaddress.IPv6Interface((int(net6.network_address) + 1, net6.prefixlen))
        h6 = ipaddress.IPv6Interface((int(net6.network_address) + 2, net6.prefixlen))
    return Link(router_ifname, "eth0", r4, h4, r6, h6)


def _client_nodes(name: str, az: str, client4: ipaddress.IPv4Network, client6: ipaddress.IPv6Network | None,
                  count: int) -> tuple[ClientNode, ...]:
    nodes = []
    for i in range(count):
        net4 = ipaddress.IPv4Network((int(client4.network_address) + 4 * i, 30))
        net6 = ipaddress.IPv6Network((int(client6.network_address) + 256 * i, 120)) if client6 else None
        suffix = f"-{i}" if i else ""
        nodes.append(ClientNode(az=az, number=i, ns=f"{name}-cli-{az}{suffix}",
                                link=_link(f"c-{az}{suffix}", net4, net6)))
    return tuple(nodes)


def _servers(name: str, az: str, server4: ipaddress.IPv4Network, server6: ipaddress.IPv6Network | None,
             count: int) -> tuple[ServerHost, ...]:
    servers = []
    for j in range(count):
        net4 = ipaddress.IPv4Network((int(server4.network_address) + 4 * j, 30))
        net6 = ipaddress.IPv6Network((int(server6.network_address) + 256 * j, 120)) if server6 else None
        suffix = f"-{j}" if j else ""
        servers.append(ServerHost(az=az, number=j, ns=f"{name}-srv-{az}{suffix}",
                                  link=_link(f"s-{az}{suffix}", net4, net6)))
    return tuple(servers)


def plan_lab(name: str, index: int, azs: int, ipv6: bool, nodes_per_az: int = 1,
             servers_per_az: int = 1) -> LabPlan:
    """The complete address and naming plan of one lab."""
    validate_name(name)
    validate_nodes_per_az(nodes_per_az)
    validate_servers_per_az(servers_per_az)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < LAB_SLOTS:
        raise ConfigError("index", f"{index!r} is outside 0..{LAB_SLOTS - 1}", "leave it unset to pick a free one")
    block = lab_v4_block(index)
    zones = []
    for k, az in enumerate(az_names(azs)):
        cidr4 = ipaddress.IPv4Network((int(block.network_address) + (k + 1) * 256, 24))
        server4, client4 = cidr4.subnets(new_prefix=25)
        cidr6 = server6 = client6 = None
        if ipv6:
            group = (index << 8) | ((k + 1) << 4)
            cidr6 = _v6_net(group, 60)
            server6, client6 = _v6_net(group, 64), _v6_net(group | 1, 64)
        zones.append(ZonePlan(
            az=az, number=k, cidr_v4=cidr4, cidr_v6=cidr6,
            servers=_servers(name, az, server4, server6, servers_per_az),
            clients=_client_nodes(name, az, client4, client6, nodes_per_az),
        ))
    return LabPlan(name=name, index=index, ipv6=ipv6, zones=tuple(zones))
