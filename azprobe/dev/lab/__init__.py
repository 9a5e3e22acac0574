"""The lab: simulated availability zones in network namespaces, with injectable faults
whose nftables counters are ground truth.

Layout (lab name "azp", 3 AZs, 1 client node per AZ; see topology.py for the address plan):

    azp-cli-az-a ─┐                      ┌─ azp-srv-az-a  (echo server :7000)
    azp-cli-az-b ─┼── azp-router (nft ───┼─ azp-srv-az-b
    azp-cli-az-c ─┘   table inet azp)    └─ azp-srv-az-c

With nodes_per_az N, each AZ has N client nodes (azp-cli-az-a, azp-cli-az-a-1, ...), each
a namespace with its own addresses and its own agent config (docs/lab.md).

Every client node runs a traffic generator toward every AZ's server, so the probe sees
every (src AZ -> dst AZ) path. Faults act in the router's forward path on packets toward
one AZ's servers (one-way: a 50 ms delay adds exactly 50 ms to RTT), or (uplink=True) on
everything one AZ's client nodes send.

Python API (stable; acceptance tests use it):

    from azprobe.dev.lab import Lab, LabSpec, TrafficSpec, unique_lab_name

    Lab.up(spec: LabSpec = LabSpec()) -> Lab          build; on failure removes what it built
    Lab.load(state_dir: Path | str) -> Lab            attach to a lab that is up
    lab.down() -> list[str]                            idempotent teardown
    with Lab.up(spec) as lab: ...                      teardown on exit, exception, Ctrl-C
    teardown(name: str, state_dir: Path | None = None) -> list[str]
                                                       crash cleanup by name prefix

    LabSpec(name="azp", azs=3, nodes_per_az=1, ipv6=False, state_dir=None, index=None,
            traffic=True | TrafficSpec(...), server_ports=(7000,))
    TrafficSpec(rate=5.0, conns=2, interval_ms=50.0, port=7000, clients=None, families=None)

    lab.fault(az, *, delay_ms=0.0, loss_pct=0.0, syn_loss_pct=0.0,
              blackhole=False, refuse=False, uplink=False) -> Fault
                                  replaces az's previous fault of that direction; uplink:
                                  on what az's client nodes send, toward every AZ
    lab.set_faults({az: Fault(...)}, *, uplink=False) -> None   several AZs at once
                                  (delay lines start in parallel, rules change together)
    lab.clear(az: str | None = None, *, uplink: bool | None = None) -> None   None: both
    lab.faults(uplink=False) -> dict[str, dict]            az -> current fault
    lab.delay_line_stats(az) -> dict | None   {"packets", "late_us_p50", "late_us_p99",
                                               "late_us_max"}: release minus due time
    lab.counters(az) -> dict[str, int]     {"packets", "syns", "blackhole", "refuse",
                                            "syn_loss", "loss", "delay"}: nft packet
                                            counts toward az's servers, cumulative since up
    lab.counters() -> dict[str, dict[str, int]]            every AZ
    lab.counters(az, uplink=True)          the same for packets from az's client nodes

    lab.start_traffic(spec: TrafficSpec = TrafficSpec()) -> None   (re)start generators
    lab.stop_traffic() -> None
    lab.traffic_stats() -> {client_az: {target: {"ok", "refused", "timeout", "reset",
                            "error", "requests", "long_lived_up"}}}   target "az-b" or "az-b/ipv6"
                            (summed over the AZ's client nodes)
    lab.node_traffic_stats() -> {node name: {target: {...}}}      per client node

    lab.exec(ns, argv, *, input=None, timeout=30.0, check=True) -> CompletedProcess[str]
    lab.netstat(ns) -> dict[str, int]        {"TcpExtTCPTimeouts": n, "TcpRetransSegs": n, ...}
    lab.connect_probe(src_az, dst_az, *, count=10, timeout_s=1.0, ipv6=False,
                      port=None, interval_s=0.0, node=0) -> ProbeResult(ok, refused, timeout,
                                                     error, connect_ms, median_ms)

    lab.name, lab.azs, lab.namespaces, lab.router_ns, lab.state_dir, lab.plan
    lab.client_ns(az), lab.server_ns(az), lab.server_addr(az, ipv6=False),
    lab.client_addr(az, ipv6=False), lab.zone(az) -> ZonePlan (cidrs, ...)
    lab.agent_config_path -> Path            agent TOML (node az = az-a, all AZ CIDRs,
                                             listen 127.0.0.1:9740+index): sees every node
    lab.nodes -> list[ClientNode]            every client node: .name (= .ns), .az, .number,
                                             .addresses
    lab.node_agent_config_path(node) -> Path that node's agent TOML ([node] addresses)
    lab.info() -> dict                       what `lab up --json` prints
    lab.status() -> dict                     info + namespaces/processes alive + counters

Errors: an unknown AZ raises ConfigError (exit 2) whose field is "az" and whose message
lists the lab's AZs; not being root raises PrerequisiteError.

Several labs at once (tests run concurrently on one box): give each a unique name, e.g.
`LabSpec(name=unique_lab_name("t"), state_dir=tmp_path)`; its address slot (a distinct
/20 of 198.18.0.0/15, /56 of 2001:2::/48) is claimed automatically in
/run/azprobe-lab-slots, so two labs never share an address (the BPF probe is global
across namespaces). Every namespace is "<name>-...", the nft table is "inet <name>"
inside "<name>-router", so nothing is left in the root namespace.
"""

from azprobe.dev.lab.faults import COUNTER_KINDS, Fault
from azprobe.dev.lab.lab import Lab, LabSpec, ProbeResult, TrafficSpec, teardown, unique_lab_name
from azprobe.dev.lab.topology import ClientNode, LabPlan, ZonePlan, plan_lab

__all__ = ["COUNTER_KINDS", "ClientNode", "Fault", "Lab", "LabPlan", "LabSpec", "ProbeResult", "TrafficSpec", "ZonePlan",
           "plan_lab", "teardown", "unique_lab_name"]
