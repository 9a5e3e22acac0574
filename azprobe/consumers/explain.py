"""`azprobe explain [AZ] [--json] [--from SRC] [--consul URL] [--prefix P]`.

Why each AZ has the share it has: reads the weights document the controller published,
and prints per AZ the inputs (success, P95, utilisation, samples), the resulting health,
weight, share and state, and the controller's reasons (the rules that decided), in the
order the controller applied them; then the zone's sick hosts, worst first, with their
reasons (the sick-hosts document beside it, azprobe.contracts.weights_hosts). Read-only;
each document is validated by its one parser, and an expired document is labelled
stale, never shown as current.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click

from azprobe.consumers.consul_options import consul_tls_options
from azprobe.contracts.window import printable
from azprobe.clients.consul import ConsulSettings, make_client, read_key
from azprobe.consumers.weights_cli import weights_key_name
from azprobe.errors import AzprobeError, ConfigError
from azprobe.contracts import kv
from azprobe.contracts.weights import WeightsDoc, WeightsError, ZoneWeights, parse_weights
from azprobe.contracts.weights_hosts import HostsDoc, SickHostEntry, parse_hosts


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{100 * value:.2f} %"


def _ms(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1f} ms"


def _util(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.2f}"


def describe_doc(doc: WeightsDoc, now: float) -> str:
    view = f"as seen from {printable(doc.source_az)}" if doc.source_az else "global view"
    age = doc.age_s(now)
    if doc.is_stale(now):
        freshness = f"STALE: expired {now - doc.expires_at:.0f} s ago, do not act on it"
    else:
        freshness = f"expires in {doc.expires_at - now:.0f} s"
    return (f"weights ({view}) generation {doc.generation} by {printable(doc.leader or '?')}, "
            f"model {printable(doc.model)}, "
            f"state {doc.effective_state(now)}; written {age:.1f} s ago, {freshness}")


def describe_hosts(hosts: tuple[SickHostEntry, ...], stale: bool) -> str:
    """The zone's sick hosts, worst first, as explain prints them under the zone."""
    label = "sick hosts (STALE document, not demoted)" if stale else "sick hosts (demoted: Envoy DEGRADED)"
    lines = [f"  {label}:"]
    for h in hosts:
        lines.append(f"    - {printable(h.addr)}")
        lines += [f"        {printable(r, 512)}" for r in h.reasons]
    return "\n".join(lines)


def describe_zone(az: str, zone: ZoneWeights) -> str:
    lines = [
        f"{printable(az)}: share {zone.share} %, weight {zone.weight:.3f}, health {zone.health:.3f}, state {zone.state}",
        f"  inputs: success {_pct(zone.success)}, p95 {_ms(zone.p95_ms)}, util {_util(zone.util)}, "
        f"samples {zone.samples}",
    ]
    if zone.reasons:
        lines.append("  why:")
        # KV text may hold control characters (any writer can put a document there)
        lines += [f"    - {printable(reason, 512)}" for reason in zone.reasons]
    else:
        lines.append("  why: (no reasons recorded)")
    return "\n".join(lines)


def explain_json(doc: WeightsDoc, az: str | None, now: float, hosts: HostsDoc | None = None) -> dict[str, Any]:
    out = doc.to_json()
    out["effective_state"] = doc.effective_state(now)
    out["age_s"] = round(doc.age_s(now), 3)
    sick = hosts.sick(doc.source_az) if hosts is not None and not hosts.is_stale(now) else {}
    out["sick_hosts"] = {zone: [h.to_json() for h in entries] for zone, entries in sick.items()
                         if az is None or zone == az}
    if az is not None:
        out["zones"] = {az: out["zones"][az]}
    return out


def load_hosts(settings: ConsulSettings) -> HostsDoc | None:
    """The sick-hosts document, or None when absent or invalid (a note on stderr)."""
    state = read_key(make_client(settings), settings.key(kv.HOSTS))
    if state.value is None:
        return None
    try:
        return parse_hosts(state.value, now=time.time())
    except WeightsError as exc:
        click.echo(f"azprobe: the sick-hosts document is invalid ({printable(str(exc), 200)}); not shown", err=True)
        return None


def load_doc(settings: ConsulSettings, source_az: str | None) -> tuple[str, WeightsDoc]:
    key = settings.key(weights_key_name(source_az or None))
    state = read_key(make_client(settings), key)
    if state.value is None:
        raise AzprobeError(f"no weights document at {key!r} in Consul at {settings.address} "
                           f"(is a controller running and leader? is --prefix right?)")
    try:
        return key, parse_weights(state.value, now=time.time())
    except WeightsError as exc:
        raise AzprobeError(f"the document at {key!r} is invalid: {exc}") from None


@click.command("explain")
@click.argument("az", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the document (or one AZ) as JSON.")
@click.option("--from", "source_az", default=None, help="Explain the view from this source AZ.")
@click.option("--consul", "address", default=None, help="Consul URL [env CONSUL_HTTP_ADDR, http://127.0.0.1:8500].")
@click.option("--prefix", default=None, help="KV prefix [azprobe/v1/].")
@consul_tls_options
def explain_command(az: str | None, as_json: bool, source_az: str | None, address: str | None,
                    prefix: str | None, **tls: str | None) -> None:
    """Why each AZ (or just AZ) has the weight it has: inputs, state and reasons."""
    settings = ConsulSettings.from_env(address=address, prefix=prefix, **tls)
    _, doc = load_doc(settings, source_az)
    if az is not None and az not in doc.zones:
        raise ConfigError("AZ", f"{az!r} is not in the document", f"known: {', '.join(doc.zones)}")
    hosts = load_hosts(settings)
    now = time.time()
    if as_json:
        click.echo(json.dumps(explain_json(doc, az, now, hosts), indent=2, sort_keys=True))
        return
    click.echo(describe_doc(doc, now))
    sick = hosts.sick(doc.source_az) if hosts is not None else {}
    for name, zone in doc.zones.items():
        if az is None or name == az:
            click.echo(describe_zone(name, zone))
            if sick.get(name):
                click.echo(describe_hosts(sick[name], hosts is not None and hosts.is_stale(now)))
