"""`azprobe envoy-eds`: the weights document as an Envoy file-based EDS resource.

consul-template style: watch -> render -> atomic write, nothing else. Envoy watches the
file (path-based `eds_cluster_config.eds_config.path_config_source`) and picks up each
rename. Locality weights only act when the cluster sets
`common_lb_config.locality_weighted_lb_config: {}`.

Localities, weights and priorities come from azprobe.consumers.localities, the rendering
the xDS server shares; this module only encodes it as Envoy's JSON.

`version_info` is a digest of the rendered resources, so a new generation with the same
weights renders the same bytes and the file is not rewritten (Envoy re-applies nothing).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from azprobe.consumers.consul_options import consul_tls_options
from azprobe.config import MAX_FILE_BYTES, parse_toml, read_file
from azprobe.clients.consul import ConsulSettings, make_client, read_key
from azprobe.consumers.failover import failover_zones
from azprobe.consumers.localities import NoEndpoints, plan_localities, sick_addresses
from azprobe.errors import AzprobeError, ConfigError
from azprobe.contracts import bounded_json, kv
from azprobe.contracts.window import is_decimal
from azprobe.contracts.weights import WeightsDoc, WeightsError, parse_weights
from azprobe.security import reloadable
from azprobe.contracts.weights_hosts import parse_hosts

CLA_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
EQUAL_VERSION = "equal"

Endpoints = dict[str, list[tuple[str, int]]]


# --- endpoints file -----------------------------------------------------------------

def parse_endpoint(value: Any, field: str) -> tuple[str, int]:
    """"10.0.0.1:8080" or "[2001:db8::1]:8080" -> (ip, port). EDS endpoints must be IP
    addresses: Envoy does not resolve names in EDS and rejects the update."""
    if not isinstance(value, str):
        raise ConfigError(field, f"expected \"ip:port\", got {value!r:.40}")
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(field, f"{value!r}: IPv6 needs brackets", "write [2001:db8::1]:8080")
    if not sep or not is_decimal(port, 5) or not 0 < int(port) < 65536:
        raise ConfigError(field, f"{value!r} is not ip:port", "for example 198.18.2.10:8080")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(field, f"{value!r}: {host!r} is not an IP address",
                          "EDS endpoints must be IPs; Envoy does not resolve names here") from None
    if getattr(ip, "scope_id", None):
        # a zone index names an interface of one host; an EDS socket address cannot carry it
        raise ConfigError(field, f"{value!r}: a scoped IPv6 address (%{ip.scope_id})",
                          "use a global or unique-local address without %zone")
    # the canonical spelling, so "[2001:DB8::1]" and "[2001:db8:0::1]" are one endpoint
    # to the duplicate check and to Envoy
    return str(ip), int(port)


def parse_endpoints(data: Any, source: str) -> Endpoints:
    """AZ -> ["ip:port", ...]; every bad entry is a ConfigError naming it."""
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(source, "expected a non-empty mapping of AZ -> [\"ip:port\", ...]",
                          'for example {"az-a": ["198.18.1.10:8080"]}')
    endpoints: Endpoints = {}
    # across every AZ, not per AZ: Envoy keeps one copy of an endpoint listed twice, so
    # the later locality can be left with no hosts (and gRPC clients reject the resource)
    first: dict[tuple[str, int], str] = {}
    for az, hosts in data.items():
        field = f"{source}: {az}"
        if not isinstance(az, str) or not az or len(az) > 256:
            raise ConfigError(source, f"bad AZ name {az!r:.40}")
        if not isinstance(hosts, list) or not hosts:
            raise ConfigError(field, f"expected a non-empty list of \"ip:port\", got {hosts!r:.40}")
        parsed = []
        for i, h in enumerate(hosts):
            entry = f"{field}[{i}]"
            endpoint = parse_endpoint(h, entry)
            if endpoint in first:
                raise ConfigError(entry, f"{h!r} is listed already, at {first[endpoint]}",
                                  "list each endpoint once, in one AZ")
            first[endpoint] = entry
            parsed.append(endpoint)
        endpoints[az] = parsed
    return endpoints


def load_endpoints(path: str | Path) -> Endpoints:
    """Read an endpoints file: JSON, or TOML when the name ends in .toml."""
    p = Path(path)
    raw = read_file(p, "--endpoints")
    if p.suffix == ".toml":
        try:
            data = parse_toml(raw, str(p))
        except ConfigError as exc:
            raise ConfigError("--endpoints", f"{p}: {exc.problem}") from None
    else:
        try:
            data = bounded_json.loads(raw, max_bytes=MAX_FILE_BYTES, what=str(p))
        except bounded_json.JsonRefused as exc:
            raise ConfigError("--endpoints", str(exc)) from None
    return parse_endpoints(data, str(p))


# --- rendering ----------------------------------------------------------------------

def render_cluster_load_assignment(cluster: str, endpoints: Mapping[str, list[str] | list[tuple[str, int]]],
                                   weights: WeightsDoc | None,
                                   sick: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """An Envoy v3 DiscoveryResponse holding one ClusterLoadAssignment. `weights` None
    (no usable document) means equal weights; `sick`: zone -> sick host addresses, worst
    first (localities.sick_addresses); version_info is a digest of the content."""
    if not cluster:
        raise ConfigError("--cluster", "must not be empty", "pass the EDS cluster's service_name")
    parsed: Endpoints = {
        az: [h if isinstance(h, tuple) else parse_endpoint(h, f"endpoints: {az}") for h in hosts]
        for az, hosts in endpoints.items()
    }
    try:
        plan = plan_localities(parsed, weights, sick)
    except NoEndpoints:
        raise ConfigError("endpoints", "no AZ has endpoints") from None
    localities = []
    for loc in plan:
        locality: dict[str, Any] = {
            "locality": {"zone": loc.zone},
            "load_balancing_weight": loc.weight,
            "lb_endpoints": [_lb_endpoint(host, port, (host, port) in loc.degraded) for host, port in loc.endpoints],
        }
        if loc.priority:
            locality["priority"] = loc.priority
        localities.append(locality)
    resources = [{"@type": CLA_TYPE, "cluster_name": cluster, "endpoints": localities}]
    return {"version_info": content_version(resources, equal=weights is None), "resources": resources}


def _lb_endpoint(host: str, port: int, degraded: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}
    if degraded:  # a named sick host: used only when the zone's healthy endpoints are not enough
        out["health_status"] = "DEGRADED"
    return out


def content_version(resources: list[dict[str, Any]], *, equal: bool) -> str:
    """A version that changes exactly when the content does: Envoy logs it, and equal
    inputs give equal bytes, so the writer skips the rewrite."""
    digest = hashlib.sha256(json.dumps(resources, sort_keys=True).encode()).hexdigest()[:12]
    return f"{EQUAL_VERSION}-{digest}" if equal else digest


def render_bytes(cluster: str, endpoints: Endpoints, weights: WeightsDoc | None,
                 sick: Mapping[str, Sequence[str]] | None = None) -> bytes:
    doc = render_cluster_load_assignment(cluster, endpoints, weights, sick)
    return (json.dumps(doc, indent=2, sort_keys=False) + "\n").encode("utf-8")


# --- atomic write -------------------------------------------------------------------

def atomic_write(path: str | Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` so a reader sees the old file or the new one, never a
    mix: temp file in the same directory (same filesystem), fsync, rename, fsync dir."""
    target = Path(path)
    directory = target.parent
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fchmod(tmp.fileno(), mode)
            os.fsync(tmp.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    # The rename itself is durable only once the directory entry is on disk.
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# --- the command --------------------------------------------------------------------

class EdsWriter:
    """Writes the rendering for a document, skipping identical bytes."""

    def __init__(self, cluster: str, endpoints: Endpoints, out: Path) -> None:
        self.cluster = cluster
        self.endpoints = endpoints
        self.out = out
        self.writes = 0
        self.weights: WeightsDoc | None = None  # what the last render in this process was of
        self.sick: Mapping[str, Sequence[str]] = {}
        self.rendered = False
        try:
            self._last: bytes | None = out.read_bytes()
        except OSError:
            self._last = None

    @property
    def has_file(self) -> bool:
        return self._last is not None

    def write(self, weights: WeightsDoc | None, sick: Mapping[str, Sequence[str]] | None = None) -> bool:
        data = render_bytes(self.cluster, self.endpoints, weights, sick)
        self.weights, self.sick, self.rendered = weights, sick or {}, True
        if data == self._last:
            return False
        atomic_write(self.out, data)
        self._last = data
        self.writes += 1
        return True


def _read_weights_once(settings: ConsulSettings, key: str) -> WeightsDoc | None:
    state = read_key(make_client(settings), key)
    if state.value is None:
        # Same as --watch: no document is "nothing usable", and the design's fallback for
        # that is an equal spread, never "everything down".
        click.echo(f"azprobe: no weights at {key} in Consul at {settings.address} (is the controller "
                   f"running? check --prefix); writing equal weights", err=True)
        return None
    now = time.time()
    try:
        doc = parse_weights(state.value, now=now)
    except WeightsError as exc:
        raise AzprobeError(f"weights at {key} are invalid: {exc}") from None
    if doc.is_stale(now):
        click.echo(f"azprobe: weights at {key} are stale (expired); writing equal weights", err=True)
        return None
    return doc


def _read_sick_once(settings: ConsulSettings, source_az: str | None) -> dict[str, list[str]]:
    """The sick hosts to demote; none when the document is absent, invalid or stale (a
    demotion is advice: without it the zone's endpoints are all used, as before)."""
    state = read_key(make_client(settings), settings.key(kv.HOSTS))
    if state.value is None:
        return {}
    now = time.time()
    try:
        doc = parse_hosts(state.value, now=now)
    except WeightsError as exc:
        click.echo(f"azprobe: the sick-hosts document is invalid ({exc}); demoting no host", err=True)
        return {}
    return {} if doc.is_stale(now) else sick_addresses(doc, source_az)


def watch_decision(fresh: WeightsDoc | None, watcher_state: str, key_absent: bool,
                   have_file: bool) -> tuple[bool, WeightsDoc | None]:
    """(write?, weights) for the watch loop. Equal weights only when Consul itself says
    there is nothing usable (expired document, absent key) or Envoy has no file yet;
    while Consul is merely unreachable, the file on disk is the last-known-good."""
    from azprobe.consumers.watch import EMPTY, STALE

    if fresh is not None:
        return True, fresh
    if watcher_state == STALE or (watcher_state == EMPTY and key_absent) or not have_file:
        return True, None
    return False, None


def _watch_loop(settings: ConsulSettings, key_name: str, writer: EdsWriter, source_az: str | None) -> None:
    from azprobe.consumers.watch import WeightWatcher  # only the watch mode needs a thread

    wake = threading.Event()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: (stop.set(), wake.set()))
    reloadable.reload_on_sighup()  # rotated TLS and token files, at once
    watcher = WeightWatcher(settings, key_name, on_change=lambda _doc: wake.set())
    hosts = WeightWatcher(settings, kv.HOSTS, on_change=lambda _doc: wake.set(), parse=parse_hosts,
                          absent_is_normal=True)
    watcher.start()
    hosts.start()
    try:
        # Wait for Consul's first answer, but a SIGTERM must not wait for it.
        deadline = time.monotonic() + 5.0
        while not stop.is_set() and not watcher.wait_answered(timeout=0.1) and time.monotonic() < deadline:
            pass
        while not stop.is_set():
            status = watcher.status()
            write, weights = watch_decision(watcher.snapshot(), status.state, status.key_absent,
                                            writer.has_file)
            sick = sick_addresses(hosts.snapshot(), source_az)  # type: ignore[arg-type]
            # A change of the sick hosts alone re-renders the weights this process last wrote.
            if (write or writer.rendered) and writer.write(weights if write else writer.weights, sick):
                click.echo(f"azprobe: wrote {writer.out} ({_describe(weights, writer)})", err=True)
            # Wake on a change, or every second to notice expiry.
            wake.wait(1.0)
            wake.clear()
    except KeyboardInterrupt:
        pass
    finally:
        watcher.stop()
        hosts.stop()


@click.command("envoy-eds")
@click.option("--cluster", required=True, help="Envoy cluster name (its EDS service_name).")
@click.option("--endpoints", "endpoints_path", required=True, metavar="FILE",
              help='JSON or TOML file: AZ -> ["ip:port", ...].')
@click.option("--out", required=True, metavar="PATH", help="File Envoy watches (written atomically).")
@click.option("--watch", is_flag=True, help="Keep running; rewrite on every weights change.")
@click.option("--consul", "address", metavar="URL", help="Consul address (default: $CONSUL_HTTP_ADDR).")
@click.option("--prefix", default=None, metavar="P", help="KV prefix (default azprobe/v1/).")
@click.option("--from", "source_az", metavar="AZ", default=None,
              help="Use weights/from/AZ (the view of the AZ this Envoy runs in).")
@consul_tls_options
def envoy_eds_command(cluster: str, endpoints_path: str, out: str, watch: bool, address: str | None,
                      prefix: str | None, source_az: str | None, **tls: str | None) -> None:
    """Render Envoy file-EDS (ClusterLoadAssignment) with locality weights from Consul."""
    from azprobe.consumers.weights_cli import weights_key_name

    settings = ConsulSettings.from_env(address=address, prefix=prefix, **tls)
    endpoints = load_endpoints(endpoints_path)
    if not cluster.strip():
        raise ConfigError("--cluster", "must not be empty", "pass the EDS cluster's service_name")
    out_path = Path(out)
    if not out_path.parent.is_dir():
        raise ConfigError("--out", f"directory {out_path.parent} does not exist", "create it first")
    writer = EdsWriter(cluster, endpoints, out_path)
    key_name = weights_key_name(source_az)
    if watch:
        _watch_loop(settings, key_name, writer, source_az)
        return
    try:
        doc = _read_weights_once(settings, settings.key(key_name))
    except AzprobeError:
        _equal_when_no_file(writer, settings, source_az)
        raise  # still exit 1: the weights could not be read
    verb = "wrote" if writer.write(doc, _read_sick_once(settings, source_az)) else "unchanged"
    click.echo(f"azprobe: {verb} {out_path} ({_describe(doc, writer)})", err=True)


def _equal_when_no_file(writer: EdsWriter, settings: ConsulSettings, source_az: str | None) -> None:
    """The weights could not be read (invalid document, Consul unreachable). Without a file
    Envoy has no endpoints at all for the cluster, so write equal weights, as --watch does
    (watch_decision: no file yet); an existing file is the last-known-good: untouched."""
    if writer.has_file:
        return
    try:
        sick = _read_sick_once(settings, source_az)
    except AzprobeError:
        sick = {}  # Consul is unreachable: demote no host (a demotion is advice)
    writer.write(None, sick)
    click.echo(f"azprobe: no {writer.out} yet: wrote equal weights so Envoy has endpoints "
               f"({_describe(None, writer)})", err=True)


def _describe(weights: WeightsDoc | None, writer: EdsWriter) -> str:
    plan = plan_localities(writer.endpoints, weights, writer.sick)
    degraded = sorted(f"{host}:{port}" for loc in plan for host, port in loc.degraded)
    hosts = f"; degraded: {', '.join(degraded)}" if degraded else ""
    if weights is None:
        return "equal weights" + hosts
    drained = sorted(failover_zones(weights, writer.endpoints))
    return f"generation {weights.generation}" + (f"; failover only: {', '.join(drained)}" if drained else "") + hosts


if __name__ == "__main__":  # pragma: no cover
    sys.exit(envoy_eds_command())
