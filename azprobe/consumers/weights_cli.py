"""`azprobe weights`: the weights in Consul KV as a table a person reads at a glance.

Exit status: 0 fresh weights shown; 1 weights missing, stale, invalid, or Consul
unreachable; 2 bad usage. Stale data is labelled STALE in the header and in every row,
never shown as healthy.

Below the weights, the view's sick hosts from the sick-hosts document (`<prefix>hosts`,
azprobe.contracts.weights_hosts). The host list is advice beside the weights: a missing,
invalid or unreadable one is reported in one line and never changes the exit status.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time

from dataclasses import dataclass
from typing import Any

import click

from azprobe.consumers.consul_options import consul_tls_options
from azprobe.clients.consul import ConsulError, ConsulSettings, KeyState, KeyWatch, make_client, read_key
from azprobe.errors import AzprobeError, ConfigError
from azprobe.contracts import kv
from azprobe.contracts.weights import MAX_STRING, WeightsDoc, WeightsError, parse_weights
from azprobe.contracts.weights_hosts import ZoneSick, parse_hosts
from azprobe.contracts.window import printable
from azprobe.security import reloadable

COLUMNS = ("AZ", "SHARE", "WEIGHT", "HEALTH", "SUCCESS", "P95 ms", "UTIL", "STATE", "REASONS")
REASONS_WIDTH = 60


def weights_key_name(source_az: str | None) -> str:
    """The key under the prefix: "weights" or "weights/from/<AZ>" (--from AZ)."""
    try:
        return kv.weights_name(source_az)
    except ValueError as exc:
        raise ConfigError("--from", str(exc), "for example --from az-a") from None


def _duration(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _percent(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value * 100:.{digits}f}%"


# Every string of a document is KV text (any writer can put one there): each is shown
# through printable, so no control character reaches the terminal.
def render_header(doc: WeightsDoc, key: str, now: float) -> str:
    view = f"from {printable(doc.source_az, MAX_STRING)}" if doc.source_az else "global"
    fields = (f"generation {doc.generation}  leader {printable(doc.leader, MAX_STRING) or '-'}  "
              f"model {printable(doc.model, MAX_STRING) or '-'}  view {view}  age {_duration(doc.age_s(now))}")
    if doc.is_stale(now):
        return (f"STALE: weights at {key} expired {_duration(now - doc.expires_at)} ago; do not act "
                f"on them (is the controller running?)\n{fields}  state STALE (was {doc.state})")
    return f"weights at {key}\n{fields}  expires in {_duration(doc.expires_at - now)}  state {doc.state.upper()}"


def render_table(doc: WeightsDoc, key: str, now: float) -> str:
    """Header lines plus one row per AZ, highest share first."""
    stale = doc.is_stale(now)
    rows = [COLUMNS]
    for az, zone in sorted(doc.zones.items(), key=lambda item: (-item[1].share, item[0])):
        reasons = "; ".join(printable(r, MAX_STRING) for r in zone.reasons) or "-"
        if len(reasons) > REASONS_WIDTH:
            reasons = reasons[:REASONS_WIDTH - 3] + "..."
        rows.append((printable(az, MAX_STRING), f"{zone.share}%", f"{zone.weight:.3f}", f"{zone.health:.2f}",
                     _percent(zone.success, 2), "-" if zone.p95_ms is None else f"{zone.p95_ms:.1f}",
                     _percent(zone.util, 0), "STALE" if stale else zone.state, reasons))
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(w) if i in (0, 7) else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells + [row[-1]]).rstrip())
    return render_header(doc, key, now) + "\n" + "\n".join(lines) + failover_note(doc, stale)


def failover_note(doc: WeightsDoc, stale: bool) -> str:
    """SHARE is the controller's number; a drained zone's real traffic is lower. Say so,
    with the shares envoy-eds actually makes Envoy use (azprobe.consumers.failover)."""
    from azprobe.consumers.failover import effective_shares, failover_zones

    drained = sorted(failover_zones(doc, doc.zones))
    if stale or not drained:
        return ""
    live = effective_shares(doc)
    split = " ".join(f"{printable(az, MAX_STRING)}={share:.0f}%" for az, share in sorted(live.items())
                     if az not in drained)
    shown = ", ".join(printable(az, MAX_STRING) for az in drained)
    return (f"\nfailover only (envoy-eds priority 1): {shown}: 0% of requests while the others "
            f"are healthy; Envoy's split: {split}")


@dataclass(frozen=True)
class HostList:
    """The view's sick hosts as `azprobe weights` shows them, or why it cannot."""

    status: str  # fresh, stale, absent, invalid, unreadable
    key: str
    sick: ZoneSick | None = None  # None unless fresh or stale
    note: str = ""  # why the list is unavailable, or how stale it is


def load_host_list(settings: ConsulSettings, source_az: str | None, now: float) -> HostList:
    """The sick-hosts document's view for `source_az` (the global one without it); never raises."""
    key = settings.key(kv.HOSTS)
    try:
        state = read_key(make_client(settings), key)
    except ConsulError as exc:
        return HostList("unreadable", key, note=f"reading {key} failed: {printable(str(exc), 200)}")
    if state.value is None:
        return HostList("absent", key, note=f"no sick-hosts document at {key} (the controller writes one once it "
                                            "names a host)")
    try:
        doc = parse_hosts(state.value, now=now)
    except WeightsError as exc:
        return HostList("invalid", key, note=f"the sick-hosts document at {key} is invalid: {printable(str(exc), 200)}")
    if doc.is_stale(now):
        return HostList("stale", key, doc.sick(source_az), f"expired {_duration(now - doc.expires_at)} ago: readers "
                                                           "do not demote these hosts")
    return HostList("fresh", key, doc.sick(source_az))


def render_hosts(hosts: HostList) -> str:
    """The lines under the table: one per sick host (zone, address, first reason)."""
    if hosts.sick is None:
        return f"host list unavailable: {hosts.note}"
    named = [(az, h) for az, entries in sorted(hosts.sick.items()) for h in entries]
    if hosts.status == "stale":
        head = f"sick hosts at {hosts.key}: STALE, {hosts.note}"
    elif not named:
        return f"sick hosts: none named ({hosts.key})"
    else:
        head = f"sick hosts (demoted: Envoy DEGRADED) at {hosts.key}:"
    rows = [(printable(az, MAX_STRING), printable(h.addr, MAX_STRING),
             printable(h.reasons[0], MAX_STRING) if h.reasons else "-") for az, h in named]
    widths = [max((len(r[i]) for r in rows), default=0) for i in (0, 1)]
    lines = [head]
    for az, addr, why in rows:
        if len(why) > REASONS_WIDTH:
            why = why[:REASONS_WIDTH - 3] + "..."
        lines.append(f"  {az.ljust(widths[0])}  {addr.ljust(widths[1])}  {why}")
    return "\n".join(lines)


def hosts_json(hosts: HostList) -> dict[str, Any]:
    """`sick_hosts` (AZ -> [{addr, reasons}], null when unavailable) and its status, KV text escaped."""
    sick = None if hosts.sick is None else {
        printable(az, MAX_STRING): [{"addr": printable(h.addr, MAX_STRING),
                                     "reasons": [printable(r, MAX_STRING) for r in h.reasons]} for h in entries]
        for az, entries in hosts.sick.items()}
    return {"sick_hosts": sick, "sick_hosts_status": hosts.status, **({"sick_hosts_note": hosts.note}
                                                                      if hosts.note else {})}


def decode_or_explain(state: KeyState, key: str, address: str, now: float) -> WeightsDoc:
    if state.value is None:
        raise AzprobeError(f"no weights at {key} in Consul at {address} "
                           f"(is the controller running? check --prefix / --from)")
    try:
        return parse_weights(state.value, now=now)
    except WeightsError as exc:
        raise AzprobeError(f"weights at {key} are invalid: {printable(str(exc), 500)}") from None


def _watch(settings: ConsulSettings, key: str, as_json: bool) -> None:
    """Re-render on every change; on a TTY also once a second so age and staleness move.
    SIGHUP re-reads the rotated TLS and token files."""
    reloadable.reload_on_sighup()
    updates: queue.Queue[KeyState | ConsulError] = queue.Queue()
    stop = threading.Event()
    watch = KeyWatch(make_client(settings), key, wait_s=30.0)
    thread = threading.Thread(target=watch.run, args=(updates.put, stop, updates.put), daemon=True)
    thread.start()
    tty = sys.stdout.isatty() and not as_json
    doc: WeightsDoc | None = None
    problem: str | None = None
    last_output = None
    try:
        while True:
            try:
                item = updates.get(timeout=1.0)
            except queue.Empty:
                item = None
            if isinstance(item, ConsulError):
                problem = printable(str(item), 500)
            elif isinstance(item, KeyState):
                try:
                    doc, problem = decode_or_explain(item, key, settings.address, time.time()), None
                except AzprobeError as exc:
                    problem = str(exc)  # keep showing the last good document, marked
            now = time.time()
            if as_json:
                output = doc.dumps() if doc is not None else None
            elif doc is not None:
                output = render_table(doc, key, now)
            else:
                output = None
            if problem:
                output = f"azprobe: {problem}" + (f"\n(last good document below)\n{output}" if output else "")
            if output is None:
                continue
            if tty:
                # Redraw in place each second (age ticks); the table is small.
                click.echo("\x1b[H\x1b[2J" + output)
            elif output != last_output and (item is not None or _stale_changed(last_output, output)):
                # Not a TTY: print on a change only (ages tick every second).
                click.echo(output)
            last_output = output
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()


def _stale_changed(before: str | None, after: str) -> bool:
    return before is None or before.startswith("STALE") != after.startswith("STALE")


@click.command("weights")
@click.option("--consul", "address", metavar="URL", help="Consul address (default: $CONSUL_HTTP_ADDR or http://127.0.0.1:8500).")
@click.option("--prefix", default=None, metavar="P", help="KV prefix (default azprobe/v1/).")
@click.option("--json", "as_json", is_flag=True, help="Print the validated document as JSON, with the view's "
              "sick_hosts and sick_hosts_status.")
@click.option("--watch", is_flag=True, help="Re-render on every change (blocking queries); Ctrl-C exits.")
@click.option("--from", "source_az", metavar="AZ", default=None, help="Show weights as seen from AZ (weights/from/AZ).")
@consul_tls_options
@click.pass_context
def weights_command(ctx: click.Context, address: str | None, prefix: str | None, as_json: bool,
                    watch: bool, source_az: str | None, **tls: str | None) -> None:
    """Show the weights in Consul KV: share, weight, health and state per AZ.

    Exit status: 0 fresh; 1 missing, stale, invalid or Consul unreachable; 2 bad usage.
    """
    settings = ConsulSettings.from_env(address=address, prefix=prefix, **tls)
    key = settings.key(weights_key_name(source_az))
    if watch:
        _watch(settings, key, as_json)
        return
    state = read_key(make_client(settings), key)
    now = time.time()
    doc = decode_or_explain(state, key, settings.address, now)
    hosts = load_host_list(settings, source_az, now)
    if as_json:
        click.echo(json.dumps({**doc.to_json(), **hosts_json(hosts)}, indent=2, sort_keys=True))
        if doc.is_stale(now):
            click.echo(f"azprobe: weights at {key} are STALE: expired {_duration(now - doc.expires_at)} ago", err=True)
    else:
        click.echo(render_table(doc, key, now) + "\n" + render_hosts(hosts))
    if doc.is_stale(now):
        ctx.exit(1)
