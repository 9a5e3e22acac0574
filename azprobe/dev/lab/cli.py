"""`azprobe lab ...`: the lab from the command line (a thin shell over azprobe.dev.lab.Lab)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from azprobe.dev.lab.faults import Fault
from azprobe.dev.lab.lab import Lab, LabSpec, teardown
from azprobe.dev.lab.netns import require_root
from azprobe.dev.lab.state import default_state_dir
from azprobe.errors import ConfigError
from azprobe.dev.lab.topology import (DEFAULT_NAME, DEFAULT_NODES_PER_AZ, LAB_SLOTS, MAX_AZS, MAX_NODES_PER_AZ,
                                      MAX_SERVERS_PER_AZ, validate_name)


def _lab_options(func: Any) -> Any:
    func = click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help="Where the lab keeps its state and agent config "
                             "[default: /run/azprobe-lab, or /run/azprobe-lab-NAME]")(func)
    func = click.option("--name", default=DEFAULT_NAME, show_default=True,
                        help="Lab name: prefixes its namespaces and nft table, so labs can coexist.")(func)
    return func


def _state_dir(name: str, state_dir: Path | None) -> Path:
    validate_name(name)
    return state_dir if state_dir is not None else default_state_dir(name)


def _load(name: str, state_dir: Path | None) -> Lab:
    require_root()
    return Lab.load(_state_dir(name, state_dir))


def _echo_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=True))


def _print_lab(info: dict[str, Any]) -> None:
    click.echo(f"lab {info['name']} (slot {info['index']}, {info['cidr_v4']}), router {info['router_ns']}, "
               f"nft {info['nft_table']}")
    rows = [("AZ", "CIDRs", "server ns", "servers", "client ns", "clients")]
    for az, z in info["azs"].items():
        rows.append((az, " ".join(z["cidrs"]), z["server_ns"], " ".join(z["servers"]), z["client_ns"],
                     " ".join(z["clients"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    click.echo(f"servers listen on TCP {', '.join(map(str, info['server_ports']))} (echo) and "
               f"{info.get('http_port', '-')} (HTTP/1.1, `x-az` names the AZ); "
               f"traffic: {'on' if info['traffic'] else 'off'}")
    for az, fault in info["faults"].items():
        click.echo(f"fault toward {az}: {Fault(**fault).describe()}")
    for az, fault in info.get("uplink_faults", {}).items():
        click.echo(f"fault on {az}'s uplink (from its clients): {Fault(**fault).describe()}")
    for server, fault in info.get("host_faults", {}).items():
        click.echo(f"fault toward server {server}: {Fault(**fault).describe()}")
    if info.get("servers_per_az", 1) > 1:
        click.echo(f"{info['servers_per_az']} servers per AZ (`lab fault --host ADDR` hits one):")
        for z in info["azs"].values():
            for server, addresses in z["server_hosts"].items():
                click.echo(f"  {server}  {' '.join(addresses)}")
    click.echo(f"agent config for the whole lab: {info['agent_config']} (listen {info['agent_listen']})")
    click.echo(f"{info['nodes_per_az']} client node(s) per AZ, one agent config each "
               "(run `azprobe agent --config FILE` per node):")
    for z in info["azs"].values():
        for node, n in z["nodes"].items():
            click.echo(f"  {node}  {' '.join(n['addresses'])}  {n['agent_config']} (listen {n['agent_listen']})")


@click.group("lab")
def lab_group() -> None:
    """Simulated availability zones in network namespaces, with injectable faults."""


@lab_group.command("up")
@click.option("--azs", type=click.IntRange(1, MAX_AZS), default=3, show_default=True, help="Number of AZs.")
@click.option("--nodes-per-az", type=click.IntRange(1, MAX_NODES_PER_AZ), default=DEFAULT_NODES_PER_AZ,
              show_default=True, help="Client nodes per AZ, each a namespace with its own addresses and agent config.")
@click.option("--servers-per-az", type=click.IntRange(1, MAX_SERVERS_PER_AZ), default=1, show_default=True,
              help="Servers per AZ, each a namespace with its own addresses (faults can hit one: fault --host).")
@click.option("--ipv6", is_flag=True, help="Also give every host an address in 2001:2::/48.")
@click.option("--index", type=click.IntRange(0, LAB_SLOTS - 1), default=None,
              help="Address slot (a /20 of 198.18.0.0/15) [default: lowest free].")
@click.option("--no-traffic", is_flag=True, help="Start servers only, no traffic generators.")
@click.option("--json", "as_json", is_flag=True, help="Print the lab as JSON.")
@_lab_options
def up_command(azs: int, nodes_per_az: int, servers_per_az: int, ipv6: bool, index: int | None, no_traffic: bool,
               as_json: bool, name: str, state_dir: Path | None) -> None:
    """Build the lab, start servers and traffic, write agent configs (one per client node)."""
    spec = LabSpec(name=validate_name(name), azs=azs, nodes_per_az=nodes_per_az, servers_per_az=servers_per_az,
                   ipv6=ipv6, state_dir=state_dir, index=index, traffic=not no_traffic)
    lab = Lab.up(spec)
    info = lab.info()
    _echo_json(info) if as_json else _print_lab(info)


@lab_group.command("down")
@_lab_options
def down_command(name: str, state_dir: Path | None) -> None:
    """Remove everything of the lab (namespaces, nft table, processes); idempotent."""
    removed = teardown(name, _state_dir(name, state_dir))
    click.echo(f"lab {name}: removed {len(removed)} item(s)" + (f": {', '.join(removed)}" if removed else
                                                                 " (nothing was up)"))


@lab_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print status as JSON.")
@_lab_options
def status_command(as_json: bool, name: str, state_dir: Path | None) -> None:
    """What is up, what is alive, current faults and nft counters. Exit 1 if unhealthy."""
    lab = _load(name, state_dir)
    doc = lab.status()
    if as_json:
        _echo_json(doc)
    else:
        _print_lab(doc)
        for ns, present in doc["namespaces"].items():
            if not present:
                click.echo(f"MISSING namespace {ns}")
        for p in doc["processes"] + [{"role": f"delay line {az}", **d} for az, d in doc["delay_lines"].items()]:
            if not p["alive"]:
                click.echo(f"DEAD {p['role']} pid {p['pid']}")
        if doc["counters"]:
            click.echo("nft counters (packets toward each AZ's servers):")
            for az, counts in doc["counters"].items():
                click.echo(f"  {az}: " + " ".join(f"{k}={v}" for k, v in counts.items()))
            click.echo("nft counters (packets from each AZ's client nodes, its uplink):")
            for az, counts in doc["uplink_counters"].items():
                click.echo(f"  {az}: " + " ".join(f"{k}={v}" for k, v in counts.items()))
        click.echo("healthy" if doc["healthy"] else "UNHEALTHY: run `azprobe lab down` and `azprobe lab up`")
    if not doc["healthy"]:
        raise SystemExit(1)


def _direction(az: str | None, from_az: str | None, host: str | None = None) -> tuple[str, str]:
    """(target, kind) from exactly one of --az / --from / --host; kind is "az", "from" or "host"."""
    given = [(value, kind) for value, kind in ((az, "az"), (from_az, "from"), (host, "host")) if value is not None]
    if len(given) != 1:
        raise ConfigError("az", "give exactly one of --az (traffic toward an AZ), --from (an AZ's uplink) "
                          "and --host (traffic toward one server)", "for example --az az-b, --from az-b or "
                          "--host 198.18.2.6")
    return given[0]


@lab_group.command("fault")
@click.option("--az", default=None, help="Destination AZ: the fault hits traffic toward its servers.")
@click.option("--from", "from_az", default=None,
              help="Source AZ: the fault hits everything its client nodes send (its uplink), to every AZ.")
@click.option("--host", default=None, help="A server's address: the fault hits traffic toward that server only.")
@click.option("--delay-ms", type=click.FloatRange(0, 10_000), default=0.0, help="One-way delay toward the AZ.")
@click.option("--loss-pct", type=click.FloatRange(0, 100), default=0.0, help="Drop this % of packets toward the AZ.")
@click.option("--syn-loss-pct", type=click.FloatRange(0, 100), default=0.0,
              help="Drop this % of pure SYNs toward the AZ.")
@click.option("--blackhole", is_flag=True, help="Drop every packet toward the AZ (connects time out).")
@click.option("--refuse", is_flag=True, help="Answer SYNs toward the AZ with a TCP reset (connection refused).")
@_lab_options
def fault_command(az: str | None, from_az: str | None, host: str | None, delay_ms: float, loss_pct: float,
                  syn_loss_pct: float, blackhole: bool, refuse: bool, name: str, state_dir: Path | None) -> None:
    """Set the fault toward one AZ (--az), on one AZ's uplink (--from) or toward one server
    (--host); replaces the previous fault of that target."""
    target, kind = _direction(az, from_az, host)
    fault = Fault(delay_ms=delay_ms, loss_pct=loss_pct, syn_loss_pct=syn_loss_pct, blackhole=blackhole,
                  refuse=refuse)
    lab = _load(name, state_dir)
    if kind == "host":
        server = lab.plan.server(target)
        lab.set_host_faults({target: fault})
        where = f"toward server {server.ns} ({' '.join(server.addresses)})"
    else:
        lab.set_faults({target: fault}, uplink=kind == "from")
        where = f"from {target} (its uplink, toward every AZ)" if kind == "from" else f"toward {target}"
    click.echo(f"lab {name}: {where}: {fault.describe()}")


@lab_group.command("clear")
@click.option("--az", default=None, help="Only the fault toward this AZ [default: every fault].")
@click.option("--from", "from_az", default=None, help="Only the fault on this AZ's uplink.")
@click.option("--host", default=None, help="Only the fault toward this server (its address).")
@_lab_options
def clear_command(az: str | None, from_az: str | None, host: str | None, name: str, state_dir: Path | None) -> None:
    """Remove faults."""
    lab = _load(name, state_dir)
    if az is None and from_az is None and host is None:
        lab.clear()
        click.echo(f"lab {name}: cleared every fault")
        return
    target, kind = _direction(az, from_az, host)
    if kind == "host":
        lab.clear_host(target)
    else:
        lab.clear(target, uplink=kind == "from")
    click.echo(f"lab {name}: cleared the fault {'from' if kind == 'from' else 'toward'} {target}")


from azprobe.dev.demo.cli import demo_command as loop_demo_command  # noqa: E402  the closed-loop demo replaces the lab-only one
lab_group.add_command(loop_demo_command, "demo")

from azprobe.dev.drill.cli import drill_command  # noqa: E402  the drill on user traffic through Envoy
lab_group.add_command(drill_command, "drill")

from azprobe.dev.lab.envoy_cli import envoy_command  # noqa: E402
lab_group.add_command(envoy_command, "envoy")
