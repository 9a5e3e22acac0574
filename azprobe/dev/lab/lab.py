"""The Lab object: bring a lab up, inject faults, read ground truth, tear it down."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from azprobe.errors import ConfigError
from azprobe.dev.lab import faults as nft
from azprobe.dev.lab import netns, state
from azprobe.dev.lab.agentconfig import agent_listen, node_agent_listen, render_agent_config, render_node_agent_config
from azprobe.dev.lab.faults import Fault
from azprobe.dev.lab.processes import spawn_in_ns, wait_ready
from azprobe.dev.lab.faults import Target
from azprobe.dev.lab.topology import (DEFAULT_NAME, DEFAULT_PORT, HTTP_PORT, ClientNode, LabPlan, ServerHost, ZonePlan,
                                      az_names, plan_lab, validate_name, validate_nodes_per_az,
                                      validate_servers_per_az)

SCHEMA = 1
TRAFFIC_MODULE = "azprobe.dev.lab.traffic"
DELAYLINE_MODULE = "azprobe.dev.lab.delayline"
HTTP_MODULE = "azprobe.dev.lab.http"  # HTTP/1.1 on HTTP_PORT in every AZ, next to the echo ports
_name_counter = itertools.count(1)


def unique_lab_name(prefix: str = "t") -> str:
    """A lab name no other process on this box uses: prefix + pid + a per-process counter.
    Tests use it so that labs of concurrent test runs never share namespaces."""
    return validate_name(f"{prefix}{os.getpid():x}{next(_name_counter)}"[:10])


@dataclass(frozen=True)
class TrafficSpec:
    """Traffic generators, one per client node, toward every AZ's server.

    rate:        new connections per second per (client node, target)
    conns:       long-lived request/response connections per (client node, target)
    interval_ms: pause between requests on a long-lived connection
    port:        server port to use (one of LabSpec.server_ports)
    clients:     AZs whose client nodes run a generator (None: all)
    families:    (4,), (6,) or (4, 6); None: 4, plus 6 when the lab has IPv6
    connect_timeout_s: a new connection not up by then counts as "timeout"
    """

    rate: float = 5.0
    conns: int = 2
    interval_ms: float = 50.0
    port: int = DEFAULT_PORT
    clients: tuple[str, ...] | None = None
    families: tuple[int, ...] | None = None
    connect_timeout_s: float = 3.0

    def __post_init__(self) -> None:
        if not 0.05 <= self.connect_timeout_s <= 60:
            raise ConfigError("traffic.connect_timeout_s", f"{self.connect_timeout_s} is outside 0.05..60")
        if not 0 <= self.rate <= 1000:
            raise ConfigError("traffic.rate", f"{self.rate} is outside 0..1000 connections/s")
        if not 0 <= self.conns <= 100:
            raise ConfigError("traffic.conns", f"{self.conns} is outside 0..100")
        if not 1 <= self.interval_ms <= 60_000:
            raise ConfigError("traffic.interval_ms", f"{self.interval_ms} is outside 1..60000")


@dataclass(frozen=True)
class LabSpec:
    """What `Lab.up` builds. state_dir None: /run/azprobe-lab (name "azp") or
    /run/azprobe-lab-<name>. index None: the lowest free address slot. nodes_per_az:
    client nodes (namespaces, each with its own addresses and agent config) per AZ; 1
    here keeps tests' labs small, `lab up` and the demo default to DEFAULT_NODES_PER_AZ.
    servers_per_az: server namespaces per AZ, each with its own addresses, echo and HTTP
    servers (more than one: faults can hit one server, `fault_host`)."""

    name: str = DEFAULT_NAME
    azs: int = 3
    nodes_per_az: int = 1
    servers_per_az: int = 1
    ipv6: bool = False
    state_dir: Path | None = None
    index: int | None = None
    traffic: bool | TrafficSpec = True
    server_ports: tuple[int, ...] = (DEFAULT_PORT,)

    def resolved_state_dir(self) -> Path:
        return Path(self.state_dir) if self.state_dir is not None else state.default_state_dir(self.name)


@dataclass
class ProbeResult:
    """Outcome of `Lab.connect_probe`: counts per outcome and each successful connect time."""

    ok: int
    refused: int
    timeout: int
    error: int
    connect_ms: list[float] = field(default_factory=list)

    @property
    def median_ms(self) -> float | None:
        if not self.connect_ms:
            return None
        ordered = sorted(self.connect_ms)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def teardown(name: str, state_dir: Path | None = None) -> list[str]:
    """Remove every trace of lab `name`: processes in its namespaces, the namespaces (their
    veths and nft table go with them), its address slot and its state files. Finds things
    by name prefix, so it also cleans up after a crash. Idempotent. Returns what it removed."""
    validate_name(name)
    netns.require_root()
    namespaces = netns.list_lab_namespaces(name)
    pids = netns.pids_in_namespaces(namespaces)
    netns.kill_pids(pids)
    netns.remove_namespaces(namespaces)
    state.release_slots(name)
    removed = [f"netns {ns}" for ns in namespaces] + [f"pid {pid}" for pid in sorted(pids)]
    sdir = Path(state_dir) if state_dir is not None else state.default_state_dir(name)
    if (sdir / state.STATE_FILE).exists() or (sdir / state.AGENT_CONFIG_FILE).exists():
        for child in (state.STATE_FILE, state.AGENT_CONFIG_FILE, ".lock"):
            with contextlib.suppress(FileNotFoundError):
                (sdir / child).unlink()
        for sub in ("logs", "traffic", "envoy", state.NODE_AGENT_CONFIG_DIR):
            shutil.rmtree(sdir / sub, ignore_errors=True)
        with contextlib.suppress(OSError):
            sdir.rmdir()  # only if empty: never delete what someone else put there
        removed.append(f"state {sdir}")
    return removed


class Lab:
    """A running lab. Build one with `Lab.up(spec)` or attach with `Lab.load(state_dir)`.

    Use it as a context manager in tests: the lab is torn down on exit, also when the
    body raises or on KeyboardInterrupt.
    """

    def __init__(self, plan: LabPlan, state_dir: Path, doc: dict[str, Any]) -> None:
        self.plan = plan
        self.state_dir = state_dir
        self._doc = doc
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    # ---- lifecycle -------------------------------------------------------------------

    @classmethod
    def up(cls, spec: LabSpec = LabSpec()) -> "Lab":
        """Build the lab; on any failure, remove what was built and re-raise."""
        netns.require_root()
        validate_name(spec.name)
        az_names(spec.azs)
        validate_nodes_per_az(spec.nodes_per_az)
        validate_servers_per_az(spec.servers_per_az)
        for port in spec.server_ports:
            if not 1 <= port <= 65535:
                raise ConfigError("server_ports", f"{port} is not a TCP port")
        state_dir = spec.resolved_state_dir()
        if netns.list_lab_namespaces(spec.name):
            raise ConfigError("name", f"lab {spec.name!r} is already up ({', '.join(netns.list_lab_namespaces(spec.name))})",
                              f"run `azprobe lab down --name {spec.name}` first, or pick another --name")
        index = state.claim_slot(spec.name, spec.index)
        try:
            plan = plan_lab(spec.name, index, spec.azs, spec.ipv6, spec.nodes_per_az, spec.servers_per_az)
            doc = {"schema": SCHEMA, "name": spec.name, "index": index, "azs": spec.azs, "ipv6": spec.ipv6,
                   "nodes_per_az": spec.nodes_per_az, "servers_per_az": spec.servers_per_az,
                   "created_at": time.time(), "server_ports": list(spec.server_ports),
                   "processes": [], "traffic": None, "faults": {}, "uplink_faults": {}, "host_faults": {},
                   "delay_lines": {}}
            lab = cls(plan, state_dir, doc)
            with state.locked(state_dir):
                netns.build(plan)
                nft.nft_apply(plan, nft.base_ruleset(plan))
                lab._start_servers()
                lab.agent_config_path.write_text(render_agent_config(plan))
                lab._write_node_agent_configs()
                state.write_state(state_dir, lab._doc)
            if spec.traffic:
                lab.start_traffic(spec.traffic if isinstance(spec.traffic, TrafficSpec) else TrafficSpec())
            return lab
        except BaseException:
            teardown(spec.name, state_dir)
            raise

    @classmethod
    def load(cls, state_dir: Path | str) -> "Lab":
        """Attach to a lab that is up (for example one started by `azprobe lab up`)."""
        sdir = Path(state_dir)
        doc = state.read_state(sdir)
        doc.setdefault("uplink_faults", {})
        doc.setdefault("host_faults", {})
        plan = plan_lab(doc["name"], doc["index"], doc["azs"], doc["ipv6"], doc.get("nodes_per_az", 1),
                        doc.get("servers_per_az", 1))
        return cls(plan, sdir, doc)

    def down(self) -> list[str]:
        """Tear everything down (idempotent)."""
        removed = teardown(self.plan.name, self.state_dir)
        self._children.clear()
        return removed

    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.down()

    # ---- names and addresses ---------------------------------------------------------

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def azs(self) -> list[str]:
        return self.plan.azs

    @property
    def router_ns(self) -> str:
        return self.plan.router_ns

    @property
    def agent_config_path(self) -> Path:
        return self.state_dir / state.AGENT_CONFIG_FILE

    def zone(self, az: str) -> ZonePlan:
        """The plan of one AZ; unknown AZ -> ConfigError naming `az` and listing the AZs."""
        return self.plan.zone(az)

    @property
    def nodes(self) -> list[ClientNode]:
        """Every client node (vantage point), AZ by AZ."""
        return self.plan.client_nodes

    def node_agent_config_path(self, node: ClientNode) -> Path:
        """The agent config of one client node: its name, AZ and own addresses."""
        return self.state_dir / state.NODE_AGENT_CONFIG_DIR / f"{node.ns}.toml"

    def client_ns(self, az: str) -> str:
        return self.zone(az).client_ns

    def server_ns(self, az: str) -> str:
        return self.zone(az).server_ns

    def server_addr(self, az: str, ipv6: bool = False, server: int = 0) -> str:
        """The address of server `server` (0-based) of `az`."""
        servers = self.zone(az).servers
        if isinstance(server, bool) or not isinstance(server, int) or not 0 <= server < len(servers):
            raise ConfigError("server", f"{az} has no server {server!r}", f"use 0..{len(servers) - 1}")
        host = servers[server]
        if ipv6 and host.v6 is None:
            raise ConfigError("ipv6", f"lab {self.name!r} has no IPv6", "bring it up with --ipv6")
        return host.v6 if ipv6 else host.v4  # type: ignore[return-value]

    def server_addrs(self, az: str, ipv6: bool = False) -> list[str]:
        """The addresses of every server of `az`, server 0 first."""
        return [self.server_addr(az, ipv6, j) for j in range(len(self.zone(az).servers))]

    def client_addr(self, az: str, ipv6: bool = False) -> str:
        zone = self.zone(az)
        if ipv6 and zone.client_v6 is None:
            raise ConfigError("ipv6", f"lab {self.name!r} has no IPv6", "bring it up with --ipv6")
        return zone.client_v6 if ipv6 else zone.client_v4  # type: ignore[return-value]

    # ---- faults ----------------------------------------------------------------------

    def fault(self, az: str, *, delay_ms: float = 0.0, loss_pct: float = 0.0, syn_loss_pct: float = 0.0,
              blackhole: bool = False, refuse: bool = False, uplink: bool = False) -> Fault:
        """Set the complete fault toward `az`'s servers, or (uplink) on everything `az`'s
        client nodes send to any AZ, replacing the previous fault of that direction."""
        fault = Fault(delay_ms=delay_ms, loss_pct=loss_pct, syn_loss_pct=syn_loss_pct,
                      blackhole=blackhole, refuse=refuse)
        self.set_faults({az: fault}, uplink=uplink)
        return fault

    def set_faults(self, faults: dict[str, Fault], *, uplink: bool = False) -> None:
        """Set the faults of several AZs (one direction) at once: the delay lines start in
        parallel first, then every AZ's rules change within one nft call and a few
        iptables calls, so "every AZ degraded" never spends seconds as "one AZ degraded"."""
        self._set_faults([(self.zone(az), fault) for az, fault in faults.items()], uplink)

    def fault_host(self, addr: str, *, delay_ms: float = 0.0, loss_pct: float = 0.0, syn_loss_pct: float = 0.0,
                   blackhole: bool = False, refuse: bool = False) -> Fault:
        """Set the complete fault toward the one server that has address `addr` (every
        address of it, IPv4 and IPv6), replacing that server's previous fault."""
        fault = Fault(delay_ms=delay_ms, loss_pct=loss_pct, syn_loss_pct=syn_loss_pct,
                      blackhole=blackhole, refuse=refuse)
        self.set_host_faults({addr: fault})
        return fault

    def set_host_faults(self, faults: dict[str, Fault]) -> None:
        """Set the faults of several servers (by address) at once, as set_faults does for AZs."""
        self._set_faults([(self.plan.server(addr), fault) for addr, fault in faults.items()], uplink=False)

    def _set_faults(self, zones: Sequence[tuple[Target, Fault]], uplink: bool) -> None:
        with state.locked(self.state_dir):
            self._reload()
            # The queue rule goes only when its delay line is bound and ready (with
            # --queue-bypass a gap means undelayed packets, never lost ones).
            for zone, _ in zones:
                nft.set_delay_queue(self.plan, zone, enabled=False, uplink=uplink)
                self._stop_delay_line(zone, uplink)
            self._start_delay_lines([(zone, f.delay_ms) for zone, f in zones if f.delay_ms], uplink)
            nft.nft_apply(self.plan, "".join(nft.fault_rules(self.plan, zone, f, uplink) for zone, f in zones))
            for zone, fault in zones:
                if fault.delay_ms:
                    nft.set_delay_queue(self.plan, zone, enabled=True, uplink=uplink)
                self._doc[_faults_key(zone, uplink)][_fault_name(zone)] = fault.to_json()
            state.write_state(self.state_dir, self._doc)

    def clear(self, az: str | None = None, *, uplink: bool | None = None) -> None:
        """Remove the faults of one AZ, or of every AZ: both directions (uplink None), only
        toward the AZ (False) or only its uplink (True). Without az and uplink, the faults
        aimed at single servers go too."""
        zones = [self.zone(az)] if az is not None else list(self.plan.zones)
        directions = (False, True) if uplink is None else (uplink,)
        points: list[tuple[Target, bool]] = [(zone, up) for zone in zones for up in directions]
        if az is None and uplink is None:
            points += [(server, False) for server in self.plan.servers]
        self._clear(points)

    def clear_host(self, addr: str) -> None:
        """Remove the fault aimed at the server that has address `addr`."""
        self._clear([(self.plan.server(addr), False)])

    def _clear(self, points: list[tuple[Target, bool]]) -> None:
        with state.locked(self.state_dir):
            self._reload()
            for target, up in points:
                nft.set_delay_queue(self.plan, target, enabled=False, uplink=up)
                self._stop_delay_line(target, up)
                self._doc[_faults_key(target, up)].pop(_fault_name(target), None)
            nft.nft_apply(self.plan, "".join(nft.fault_rules(self.plan, t, None, up) for t, up in points))
            state.write_state(self.state_dir, self._doc)

    def delay_line_stats(self, az: str, uplink: bool = False) -> dict[str, float | int] | None:
        """The delay line's own accuracy toward `az` (uplink: on its uplink): {"packets",
        "late_us_p50", "late_us_p99", "late_us_max"} (release time minus due time, last 10k
        packets), refreshed every second; None if no such delay line ever ran."""
        zone = self.zone(az)
        try:
            return json.loads(self._delay_stats_path(zone, uplink).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def faults(self, uplink: bool = False) -> dict[str, dict[str, Any]]:
        """AZ -> fault toward it (uplink: on its uplink)."""
        self._reload()
        return dict(self._doc[_faults_key(None, uplink)])

    def host_faults(self) -> dict[str, dict[str, Any]]:
        """Server namespace -> the fault aimed at that server."""
        self._reload()
        return dict(self._doc["host_faults"])

    def host_counters(self, addr: str | None = None) -> dict[str, Any]:
        """nft packet counters (cumulative since `up`) toward each server, as `counters`
        has them per AZ. With addr: {kind: packets} of that server; without: {server ns: {...}}."""
        counts = nft.read_host_counters(self.plan)
        return counts[self.plan.server(addr).ns] if addr is not None else counts

    def counters(self, az: str | None = None, uplink: bool = False) -> dict[str, Any]:
        """nft packet counters (cumulative since `up`) toward each AZ's servers (uplink:
        from each AZ's client nodes). With az: {kind: packets} for that AZ (kinds: packets,
        syns, blackhole, refuse, syn_loss, loss, delay); without: {az: {...}}."""
        if az is not None:
            self.zone(az)
        counts = nft.read_counters(self.plan, uplink)
        return counts[az] if az is not None else counts

    # ---- traffic ---------------------------------------------------------------------

    def start_traffic(self, spec: TrafficSpec = TrafficSpec()) -> None:
        """(Re)start the generators with `spec`; waits until every generator runs."""
        if spec.port not in self._doc["server_ports"]:
            raise ConfigError("traffic.port", f"no server listens on {spec.port}",
                              f"use one of {self._doc['server_ports']} (LabSpec.server_ports)")
        clients = list(spec.clients) if spec.clients is not None else self.azs
        for az in clients:
            self.zone(az)
        families = spec.families or ((4, 6) if self.plan.ipv6 else (4,))
        if 6 in families and not self.plan.ipv6:
            raise ConfigError("traffic.families", f"lab {self.name!r} has no IPv6", "bring it up with --ipv6")
        with state.locked(self.state_dir):
            self._reload()
            self._stop_role("generator")
            targets = []
            for server in self.plan.servers:
                if 4 in families:
                    targets.append(f"{_target_name(server)}={server.v4}")
                if 6 in families:
                    targets.append(f"{_target_name(server)}/ipv6={server.v6}")
            (self.state_dir / "traffic").mkdir(parents=True, exist_ok=True)
            launches = []
            for node in (n for az in clients for n in self.zone(az).clients):
                argv = netns.python_argv(TRAFFIC_MODULE, "client", "--port", str(spec.port), "--rate", str(spec.rate),
                                         "--conns", str(spec.conns), "--interval-ms", str(spec.interval_ms),
                                         "--connect-timeout-s", str(spec.connect_timeout_s),
                                         "--stats-file", str(self._traffic_stats_path(node)),
                                         *itertools.chain.from_iterable(("--target", t) for t in targets))
                launches.append(("generator", node.az, node.ns, argv))
            self._launch(launches)
            self._doc["traffic"] = {**asdict(spec), "clients": clients, "families": list(families)}
            state.write_state(self.state_dir, self._doc)

    def stop_traffic(self) -> None:
        with state.locked(self.state_dir):
            self._reload()
            self._stop_role("generator")
            self._doc["traffic"] = None
            state.write_state(self.state_dir, self._doc)

    def traffic_stats(self) -> dict[str, dict[str, dict[str, int]]]:
        """client AZ -> target ("az-b" or "az-b/ipv6"; server j > 0 of an AZ: "az-b.j",
        "az-b.j/ipv6") -> outcome counts of its generators
        (summed over the AZ's client nodes): ok, refused, timeout, reset, error (new
        connections), requests (long-lived round trips), long_lived_up. Refreshed by the
        generators twice a second."""
        result: dict[str, dict[str, dict[str, int]]] = {}
        for node, targets in self.node_traffic_stats().items():
            az_stats = result.setdefault(_node_az(self.plan, node), {})
            for target, counts in targets.items():
                sums = az_stats.setdefault(target, {})
                for key, n in counts.items():
                    sums[key] = sums.get(key, 0) + n
        return result

    def node_traffic_stats(self) -> dict[str, dict[str, dict[str, int]]]:
        """client node name -> target -> outcome counts of that node's generator."""
        result = {}
        for node in self.nodes:
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                result[node.name] = json.loads(self._traffic_stats_path(node).read_text())["targets"]
        return result

    # ---- running things inside the lab -----------------------------------------------

    def exec(self, ns: str, argv: Sequence[str], *, input: str | None = None, timeout: float = 30.0,
             check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run argv inside namespace `ns` (one of `namespaces`); text output captured.
        check=True raises PrerequisiteError on a non-zero exit."""
        self._require_ns(ns)
        return netns.run_in_ns(ns, argv, input=input, timeout=timeout, check=check)

    def netstat(self, ns: str) -> dict[str, int]:
        """The namespace's TCP/IP counters, nstat-style names: {"TcpExtTCPTimeouts": n, ...}."""
        self._require_ns(ns)
        return netns.read_netstat(ns)

    def connect_probe(self, src_az: str, dst_az: str, *, count: int = 10, timeout_s: float = 1.0,
                      ipv6: bool = False, port: int | None = None, interval_s: float = 0.0,
                      node: int = 0, server: int = 0) -> ProbeResult:
        """`count` sequential TCP connects from client node `node` of src_az to server
        `server` of dst_az; each connect() is timed on its own (an independent stopwatch for
        delay tests)."""
        addr = self.server_addr(dst_az, ipv6=ipv6, server=server)
        argv = netns.python_argv(TRAFFIC_MODULE, "probe", "--addr", addr,
                                 "--port", str(port or self._doc["server_ports"][0]), "--count", str(count),
                                 "--timeout-s", str(timeout_s), "--interval-s", str(interval_s))
        out = self.exec(self.plan.node(src_az, node).ns, argv, timeout=count * (timeout_s + interval_s) + 30).stdout
        doc = json.loads(out)
        return ProbeResult(ok=doc["ok"], refused=doc["refused"], timeout=doc["timeout"], error=doc["error"],
                           connect_ms=list(doc["connect_ms"]))

    @property
    def namespaces(self) -> list[str]:
        return self.plan.namespaces

    # ---- reporting -------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """The lab as JSON (what `lab up --json` prints)."""
        self._reload()
        return {
            "name": self.name,
            "index": self.plan.index,
            "ipv6": self.plan.ipv6,
            "state_dir": str(self.state_dir),
            "agent_config": str(self.agent_config_path),
            "agent_listen": agent_listen(self.plan),
            "router_ns": self.router_ns,
            "nft_table": f"inet {self.plan.nft_table} (in {self.router_ns})",
            "cidr_v4": str(self.plan.cidr_v4),
            "server_ports": self._doc["server_ports"],
            "nodes_per_az": self.plan.nodes_per_az,
            "servers_per_az": self.plan.servers_per_az,
            "http_port": HTTP_PORT,
            "azs": {z.az: {"cidrs": z.cidrs, "server_ns": z.server_ns, "client_ns": z.client_ns,
                           "servers": [a for s in z.servers for a in s.addresses],
                           "server_hosts": {s.ns: s.addresses for s in z.servers},
                           "clients": [a for n in z.clients for a in n.addresses],
                           "nodes": {n.name: {"addresses": n.addresses,
                                              "agent_config": str(self.node_agent_config_path(n)),
                                              "agent_listen": node_agent_listen(self.plan, n)}
                                     for n in z.clients}}
                    for z in self.plan.zones},
            "traffic": self._doc["traffic"],
            "faults": self._doc["faults"],
            "uplink_faults": self._doc["uplink_faults"],
            "host_faults": self._doc["host_faults"],
        }

    def status(self) -> dict[str, Any]:
        """info() plus what is actually alive: namespaces, processes, counters."""
        doc = self.info()
        present = set(netns.list_lab_namespaces(self.name))
        doc["namespaces"] = {ns: ns in present for ns in self.namespaces}
        doc["processes"] = [{**p, "alive": netns.pid_alive(p["pid"])} for p in self._doc["processes"]]
        doc["delay_lines"] = {az: {**d, "alive": netns.pid_alive(d["pid"])}
                              for az, d in self._doc["delay_lines"].items()}
        doc["counters"] = self.counters() if self.router_ns in present else None
        doc["uplink_counters"] = self.counters(uplink=True) if self.router_ns in present else None
        doc["healthy"] = (all(doc["namespaces"].values())
                          and all(p["alive"] for p in doc["processes"])
                          and all(d["alive"] for d in doc["delay_lines"].values()))
        return doc

    # ---- internals -------------------------------------------------------------------

    def _reload(self) -> None:
        with contextlib.suppress(ConfigError):
            self._doc = state.read_state(self.state_dir)

    def _require_ns(self, ns: str) -> None:
        if ns not in self.namespaces:
            raise ConfigError("ns", f"{ns!r} is not a namespace of lab {self.name!r}",
                              f"choose one of: {', '.join(self.namespaces)}")

    def _traffic_stats_path(self, node: ClientNode) -> Path:
        return self.state_dir / "traffic" / f"{node.ns}.json"

    def _delay_stats_path(self, zone: Target, uplink: bool = False) -> Path:
        return self.state_dir / "logs" / f"delay-{_delay_line_key(zone, uplink)}.json"

    def _write_node_agent_configs(self) -> None:
        (self.state_dir / state.NODE_AGENT_CONFIG_DIR).mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            self.node_agent_config_path(node).write_text(render_node_agent_config(self.plan, node))

    def _log_path(self, role: str, ns: str) -> Path:
        return self.state_dir / "logs" / f"{role}-{ns}.log"

    def _launch(self, launches: list[tuple[str, str, str, list[str]]]) -> list[int]:
        procs, logs = [], []
        for role, az, ns, argv in launches:
            log = self._log_path(role, ns)
            procs.append(spawn_in_ns(ns, argv, log))
            logs.append(log)
        wait_ready(procs, logs)
        for (role, az, ns, argv), proc in zip(launches, procs):
            self._children[proc.pid] = proc
            self._doc["processes"].append({"role": role, "az": az, "ns": ns, "pid": proc.pid})
        return [p.pid for p in procs]

    def _start_servers(self) -> None:
        ports = [a for port in self._doc["server_ports"] for a in ("--port", str(port))]
        self._launch([("server", s.az, s.ns, netns.python_argv(TRAFFIC_MODULE, "server", *ports))
                      for s in self.plan.servers]
                     + [("http", s.az, s.ns, netns.python_argv(HTTP_MODULE, "server", "--port", str(HTTP_PORT),
                                                                "--az", s.az))
                        for s in self.plan.servers])

    def _kill_recorded(self, pids: list[int], ns: str | None = None) -> None:
        # A recorded pid is only ours while it still lives in one of our namespaces.
        ours = netns.pids_in_namespaces([ns] if ns else self.namespaces)
        netns.kill_pids([p for p in pids if p in ours])
        for pid in pids:
            self._children.pop(pid, None)

    def _stop_role(self, role: str) -> None:
        victims = [p for p in self._doc["processes"] if p["role"] == role]
        self._kill_recorded([p["pid"] for p in victims])
        self._doc["processes"] = [p for p in self._doc["processes"] if p["role"] != role]

    def _start_delay_lines(self, lines: list[tuple[Target, float]], uplink: bool = False) -> None:
        """Start one delay line per (zone, delay_ms), all at once; return when all are bound."""
        procs, logs = [], []
        for zone, delay_ms in lines:
            argv = netns.python_argv(DELAYLINE_MODULE, "--queue", str(nft.queue_number(zone, uplink)),
                                     "--delay-ms", str(delay_ms),
                                     "--stats-file", str(self._delay_stats_path(zone, uplink)))
            logs.append(self._log_path(f"delay-{_delay_line_key(zone, uplink)}", self.router_ns))
            procs.append(spawn_in_ns(self.router_ns, argv, logs[-1]))
        wait_ready(procs, logs)
        for (zone, delay_ms), proc in zip(lines, procs):
            self._children[proc.pid] = proc
            self._doc["delay_lines"][_delay_line_key(zone, uplink)] = {
                "pid": proc.pid, "queue": nft.queue_number(zone, uplink), "delay_ms": delay_ms}

    def _stop_delay_line(self, zone: Target, uplink: bool = False) -> None:
        line = self._doc["delay_lines"].pop(_delay_line_key(zone, uplink), None)
        if line is not None:
            self._kill_recorded([line["pid"]], self.router_ns)



def _faults_key(target: Target | None, uplink: bool) -> str:
    """Where the state file keeps the faults of one kind of fault point."""
    if isinstance(target, ServerHost):
        return "host_faults"
    return "uplink_faults" if uplink else "faults"


def _fault_name(target: Target) -> str:
    """A fault's key in its state-file section: the AZ, or the server's namespace."""
    return target.ns if isinstance(target, ServerHost) else target.az


def _target_name(server: ServerHost) -> str:
    """A traffic generator's name for one server: the AZ for server 0, az-b.j after."""
    return f"{server.az}.{server.number}" if server.number else server.az


def _delay_line_key(zone: Target, uplink: bool) -> str:
    """A delay line's name in the state file and its log: az-b, from-az-b for the uplink,
    or the server's namespace for one server."""
    if isinstance(zone, ServerHost):
        return zone.ns
    return f"from-{zone.az}" if uplink else zone.az


def _node_az(plan: LabPlan, name: str) -> str:
    return next(n.az for n in plan.client_nodes if n.name == name)
