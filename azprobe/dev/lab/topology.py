"""The lab's address plan: pure data, no kernel access.

One lab owns one /20 of 198.18.0.0/15 (32 slots, chosen by `index`) and, with IPv6, the
matching /56 of the benchmarking range 2001:2::/48. Two labs up at once therefore never
share an address, which matters because the BPF probe is global across namespaces: equal
addresses in two labs would mix their statistics.

Inside the /20, AZ number k (0-based) owns the /24 number k+1:

    198.18.0.0/15 + index*4096 + (k+1)*256
      .0/25    server link: router .1, server .2      (namespace <name>-srv-<az>)
      .128/25  client link: router .129, client .130  (namespace <name>-cli-<az>)

IPv6, AZ k of lab `index` owns the /60 2001:2:0:GGG0::/60 with GGG = index<<4 | (k+1):
      ...:GGG0::/64 server link (router ::1, server ::2)
      ...:GGG1::/64 client link (router ::1, client ::2)

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


@dataclass(frozen=True)
class ZonePlan:
    """One AZ: its CIDRs, its server namespace and its client namespace."""

    az: str
    number: int  # 0-based position, also the delay line's NFQUEUE number minus 1
    cidr_v4: ipaddress.IPv4Network
    cidr_v6: ipaddress.IPv6Network | None
    server_ns: str
    client_ns: str
    server_link: Link
    client_link: Link

    @property
    def cidrs(self) -> list[str]:
        return [str(self.cidr_v4)] + ([str(self.cidr_v6)] if self.cidr_v6 else [])

    @property
    def server_v4(self) -> str:
        return str(self.server_link.host_v4.ip)

    @property
    def server_v6(self) -> str | None:
        return str(self.server_link.host_v6.ip) if self.server_link.host_v6 else None

    @property
    def client_v4(self) -> str:
        return str(self.client_link.host_v4.ip)

    @property
    def client_v6(self) -> str | None:
        return str(self.client_link.host_v6.ip) if self.client_link.host_v6 else None

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
        return [self.router_ns] + [z.server_ns for z in self.zones] + [z.client_ns for z in self.zones]

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
        r6 = ipaddress.IPv6Interface((int(net6.network_address) + 1, 64))
        h6 = ipaddress.IPv6Interface((int(net6.network_address) + 2, 64))
    return Link(router_ifname, "eth0", r4, h4, r6, h6)


def plan_lab(name: str, index: int, azs: int, ipv6: bool) -> LabPlan:
    """The complete address and naming plan of one lab."""
    validate_name(name)
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
            server_ns=f"{name}-srv-{az}", client_ns=f"{name}-cli-{az}",
            server_link=_link(f"s-{az}", server4, server6),
            client_link=_link(f"c-{az}", client4, client6),
        ))
    return LabPlan(name=name, index=index, ipv6=ipv6, zones=tuple(zones))
