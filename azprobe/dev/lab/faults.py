"""Faults in the router's forward path, per AZ, with nftables. Two directions:

- toward an AZ (`lab fault --az az-b`): packets leaving the router toward the AZ's
  *servers* (`oifname s-<az>`), so "delay 50 ms on az-b" moves only the paths that end in
  az-b: replies flowing back to az-b's clients are untouched, and every path's RTT stays
  attributable.
- an AZ's uplink (`lab fault --from az-b`): packets the AZ's *client nodes* send, to every
  destination (`iifname c-<az>*`, every client link of the AZ). Every path that starts in
  az-b degrades, the other AZs' paths do not: a source-side fault that must not drain the
  destinations (the controller's quorum sets such nodes aside). Replies toward az-b's
  clients are untouched.
- toward one server (`lab fault --host ADDR`): packets leaving the router toward that
  server only (`oifname s-<az>-<j>`, every address of the server): a gray failure, one
  sick host of a healthy AZ. Host chains run after the AZ chains.

Every rule counts into a named nft counter; those counters are the ground truth tests
compare the probe against. Counters are cumulative since `lab up` (fault/clear never
reset them), so take a delta around what you measure. Counter kinds per AZ and direction
(uplink counters are named from_<az>_<kind>, host counters host_<az>_<j>_<kind>):

    packets    every packet forwarded toward the AZ's servers
    syns       pure SYNs (SYN without ACK) among them
    blackhole  packets dropped by --blackhole
    refuse     SYNs answered with a TCP reset by --refuse
    syn_loss   SYNs dropped by --syn-loss-pct
    loss       packets dropped by --loss-pct
    delay      packets handed to the delay line by --delay-ms

Rule order in a fault chain: blackhole, refuse, syn_loss, loss, then a counter-only
`delay` rule. The kernel here has xt_NFQUEUE but no nft_queue, so the queue itself is an
iptables/ip6tables rule (`-o s-<az>+`, `-i c-<az>+` or `-o s-<az>-<j>` `-j NFQUEUE --queue-bypass`) in the
router's FORWARD chain (table ip/ip6 filter, priority 0). The lab's table runs before it
(priority -10): packets it drops are never queued, and every packet counted as `delay`
reaches the queue. With --queue-bypass, packets pass undelayed if the delay line is gone.
Uplink chains run before the toward chains, so a packet both faults match meets its
uplink's loss first; a packet both delay lines would take is delayed once, by whichever
queue rule was added first (delays do not add up).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from azprobe.errors import ConfigError
from azprobe.dev.lab.netns import run_in_ns
from azprobe.dev.lab.topology import MAX_SERVERS_PER_AZ, LabPlan, ServerHost, ZonePlan

COUNTER_KINDS = ("packets", "syns", "blackhole", "refuse", "syn_loss", "loss", "delay")
PURE_SYN = "tcp flags & (syn | ack) == syn"
MAX_DELAY_MS = 10_000.0
QUEUE_BASE = 100  # NFQUEUE number of AZ k is QUEUE_BASE + k (queues are per namespace)
UPLINK_QUEUE_BASE = 200  # ... and of AZ k's uplink, UPLINK_QUEUE_BASE + k
HOST_QUEUE_BASE = 1000  # ... and of server j of AZ k, HOST_QUEUE_BASE + k * MAX_SERVERS_PER_AZ + j
# A fault point: an AZ (toward its servers, or with uplink=True its client nodes' uplink)
# or one server.
Target = ZonePlan | ServerHost


@dataclass(frozen=True)
class Fault:
    """The complete fault of one AZ; `lab fault` replaces the previous one."""

    delay_ms: float = 0.0
    loss_pct: float = 0.0
    syn_loss_pct: float = 0.0
    blackhole: bool = False
    refuse: bool = False

    def __post_init__(self) -> None:
        for field, value, top in (("delay-ms", self.delay_ms, MAX_DELAY_MS), ("loss-pct", self.loss_pct, 100.0),
                                  ("syn-loss-pct", self.syn_loss_pct, 100.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
                    or not 0 <= value <= top:
                raise ConfigError(field, f"{value!r} is outside 0..{top:g}")
        if self.blackhole and (self.refuse or self.delay_ms or self.loss_pct or self.syn_loss_pct):
            raise ConfigError("blackhole", "drops everything, so combining it with other faults means nothing",
                              "pass --blackhole alone")
        if self.is_empty():
            raise ConfigError("fault", "no fault given",
                              "pass --delay-ms, --loss-pct, --syn-loss-pct, --blackhole or --refuse; "
                              "`azprobe lab clear` removes faults")

    def is_empty(self) -> bool:
        return not (self.delay_ms or self.loss_pct or self.syn_loss_pct or self.blackhole or self.refuse)

    def to_json(self) -> dict[str, float | bool]:
        return asdict(self)

    def describe(self) -> str:
        parts = []
        if self.blackhole:
            parts.append("blackhole")
        if self.refuse:
            parts.append("refuse")
        if self.syn_loss_pct:
            parts.append(f"syn-loss {self.syn_loss_pct:g}%")
        if self.loss_pct:
            parts.append(f"loss {self.loss_pct:g}%")
        if self.delay_ms:
            parts.append(f"delay {self.delay_ms:g} ms")
        return ", ".join(parts)


def _prefix(target: Target, uplink: bool) -> str:
    """nft object names of one fault point: az_b (toward az-b), from_az_b (az-b's uplink)
    or host_az_b_1 (toward server 1 of az-b)."""
    if isinstance(target, ServerHost):
        return target.counter_prefix
    return f"from_{target.counter_prefix}" if uplink else target.counter_prefix


def counter_name(target: Target, kind: str, uplink: bool = False) -> str:
    return f"{_prefix(target, uplink)}_{kind}"


def queue_number(target: Target, uplink: bool = False) -> int:
    if isinstance(target, ServerHost):
        return HOST_QUEUE_BASE + _zone_number(target) * MAX_SERVERS_PER_AZ + target.number
    return (UPLINK_QUEUE_BASE if uplink else QUEUE_BASE) + target.number


def _zone_number(server: ServerHost) -> int:
    return ord(server.az[-1]) - ord("a")  # az-a, az-b, ... (topology.az_names)


def _forward_match(target: Target, uplink: bool) -> str:
    if isinstance(target, ServerHost):
        return f'oifname "{target.link.router_ifname}"'
    if uplink:
        return f'iifname "{target.client_ifname_prefix}*"'
    return f'oifname "{target.server_ifname_prefix}*"'


def _per_10000(pct: float) -> int:
    # numgen works on integers: basis points keep 0.01 % resolution
    return int(round(pct * 100))


def _sample(pct: float) -> str:
    """nft match for `pct` % of packets (nothing at 100 %: numgen's range ends at 9999)."""
    return "" if _per_10000(pct) >= 10000 else f"numgen random mod 10000 < {_per_10000(pct)} "


def base_ruleset(plan: LabPlan) -> str:
    """The lab's table: observation counters per AZ and an empty fault chain per AZ."""
    t = plan.nft_table
    # uplinks first, then toward each AZ, then toward each server
    points: list[tuple[Target, bool]] = [(zone, uplink) for uplink in (True, False) for zone in plan.zones]
    points += [(server, False) for server in plan.servers]
    lines = [f"table inet {t}", f"delete table inet {t}", f"table inet {t} {{"]
    for zone, uplink in points:
        for kind in COUNTER_KINDS:
            lines.append(f"  counter {counter_name(zone, kind, uplink)} {{ }}")
    lines.append("  chain forward {")
    lines.append("    type filter hook forward priority -10; policy accept;")
    for zone, uplink in points:
        lines.append(f"    {_forward_match(zone, uplink)} jump to_{_prefix(zone, uplink)}")
    lines.append("  }")
    for zone, uplink in points:
        p = _prefix(zone, uplink)
        lines += [f"  chain to_{p} {{",
                  f'    counter name "{counter_name(zone, "packets", uplink)}"',
                  f'    {PURE_SYN} counter name "{counter_name(zone, "syns", uplink)}"',
                  f"    jump fault_{p}",
                  "  }",
                  f"  chain fault_{p} {{ }}"]
    lines.append("}")
    return "\n".join(lines) + "\n"


def fault_rules(plan: LabPlan, zone: Target, fault: Fault | None, uplink: bool = False) -> str:
    """nft script that replaces the fault chain toward `zone` (uplink: of `zone`'s uplink;
    a ServerHost: toward that server); None: no fault."""
    chain = f"inet {plan.nft_table} fault_{_prefix(zone, uplink)}"
    lines = [f"flush chain {chain}"]
    if fault is not None:
        def rule(match: str, kind: str, verdict: str) -> None:
            lines.append(f'add rule {chain} {match}counter name "{counter_name(zone, kind, uplink)}" {verdict}')
        if fault.blackhole:
            rule("", "blackhole", "drop")
        if fault.refuse:
            rule(f"{PURE_SYN} ", "refuse", "reject with tcp reset")
        if fault.syn_loss_pct:
            rule(f"{PURE_SYN} {_sample(fault.syn_loss_pct)}", "syn_loss", "drop")
        if fault.loss_pct:
            rule(_sample(fault.loss_pct), "loss", "drop")
        if fault.delay_ms:
            rule("", "delay", "")
    return "\n".join(lines) + "\n"


def nft_apply(plan: LabPlan, script: str) -> None:
    run_in_ns(plan.router_ns, ["nft", "-f", "-"], input=script)


def _queue_rule(zone: Target, uplink: bool = False) -> list[str]:
    if isinstance(zone, ServerHost):
        match = ["-o", zone.link.router_ifname]
    elif uplink:
        match = ["-i", f"{zone.client_ifname_prefix}+"]
    else:
        match = ["-o", f"{zone.server_ifname_prefix}+"]
    return ["FORWARD", *match, "-j", "NFQUEUE", "--queue-num", str(queue_number(zone, uplink)), "--queue-bypass"]


def set_delay_queue(plan: LabPlan, zone: Target, enabled: bool, uplink: bool = False) -> None:
    """Add or remove the NFQUEUE rule(s) toward `zone`'s servers, or (uplink) from its
    client nodes, or toward one server (idempotent)."""
    rule = _queue_rule(zone, uplink)
    tools = ["iptables"] + (["ip6tables"] if plan.ipv6 else [])
    for tool in tools:
        present = run_in_ns(plan.router_ns, [tool, "-w", "-C", *rule], check=False).returncode == 0
        if enabled and not present:
            run_in_ns(plan.router_ns, [tool, "-w", "-A", *rule])
        elif not enabled and present:
            run_in_ns(plan.router_ns, [tool, "-w", "-D", *rule])


def _counters_by_name(plan: LabPlan) -> dict[str, int]:
    out = run_in_ns(plan.router_ns, ["nft", "-j", "list", "counters", "table", "inet", plan.nft_table]).stdout
    return {c["name"]: int(c.get("packets", 0))
            for c in (item.get("counter") for item in json.loads(out).get("nftables", [])) if c}


def read_counters(plan: LabPlan, uplink: bool = False) -> dict[str, dict[str, int]]:
    """AZ -> counter kind -> packets toward the AZ's servers (uplink: from its client
    nodes), read from the router namespace."""
    by_name = _counters_by_name(plan)
    return {zone.az: {kind: by_name.get(counter_name(zone, kind, uplink), 0) for kind in COUNTER_KINDS}
            for zone in plan.zones}


def read_host_counters(plan: LabPlan) -> dict[str, dict[str, int]]:
    """Server namespace -> counter kind -> packets toward that server."""
    by_name = _counters_by_name(plan)
    return {s.ns: {kind: by_name.get(counter_name(s, kind), 0) for kind in COUNTER_KINDS} for s in plan.servers}
