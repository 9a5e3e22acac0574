"""`azprobe envoy-eds`: the weights document as an Envoy file-based EDS resource.

consul-template style: watch -> render -> atomic write, nothing else. Envoy watches the
file (path-based `eds_cluster_config.eds_config.path_config_source`) and picks up each
rename. Locality weights only act when the cluster sets
`common_lb_config.locality_weighted_lb_config: {}`.

Weight policy (Envoy rejects a whole update if any locality weight is 0, so none is):
- fresh document: each AZ gets its `share` (an integer >= 1 by contract);
- an AZ with endpoints but absent from the document gets the smallest share of the
  document: no evidence against it, so not drained, but not favoured over zones that
  earned their share either;
- no usable document (expired, or the key absent): every AZ gets weight 1 (equal
  spread), the design's fallback, never "everything down".
AZs in the document without endpoints are skipped: there is nothing to route to.

Drained zones (azprobe.consumers.failover) go to Envoy priority 1, the others stay at
priority 0: a drained zone gets no requests while priority 0 is healthy, and gets them
back by Envoy's own health accounting if priority 0 fails (docs/dataplane.md).

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from azprobe.config import MAX_FILE_BYTES, parse_toml, read_file
from azprobe.clients.consul import ConsulSettings, make_client, read_key
from azprobe.consumers.failover import FAILOVER_PRIORITY, failover_zones
from azprobe.errors import AzprobeError, ConfigError
from azprobe.contracts import bounded_json
from azprobe.contracts.weights import WeightsDoc, WeightsError, parse_weights

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
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(field, f"{value!r} is not ip:port", "for example 198.18.2.10:8080")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(field, f"{value!r}: {host!r} is not an IP address",
                          "EDS endpoints must be IPs; Envoy does not resolve names here") from None
    return host, int(port)


def parse_endpoints(data: Any, source: str) -> Endpoints:
    """AZ -> ["ip:port", ...]; every bad entry is a ConfigError naming it."""
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(source, "expected a non-empty mapping of AZ -> [\"ip:port\", ...]",
                          'for example {"az-a": ["198.18.1.10:8080"]}')
    endpoints: Endpoints = {}
    for az, hosts in data.items():
        field = f"{source}: {az}"
        if not isinstance(az, str) or not az or len(az) > 256:
            raise ConfigError(source, f"bad AZ name {az!r:.40}")
        if not isinstance(hosts, list) or not hosts:
            raise ConfigError(field, f"expected a non-empty list of \"ip:port\", got {hosts!r:.40}")
        parsed = [parse_endpoint(h, f"{field}[{i}]") for i, h in enumerate(hosts)]
        if len(set(parsed)) != len(parsed):
            raise ConfigError(field, "lists an endpoint twice")
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

def locality_weights(zones: list[str], weights: WeightsDoc | None) -> dict[str, int]:
    """The weight policy of the module doc; every value is an int >= 1."""
    if weights is None:
        return {az: 1 for az in zones}
    floor = max(1, min(z.share for z in weights.zones.values()))
    return {az: max(1, weights.zones[az].share) if az in weights.zones else floor for az in zones}


def render_cluster_load_assignment(cluster: str, endpoints: Mapping[str, list[str] | list[tuple[str, int]]],
                                   weights: WeightsDoc | None) -> dict[str, Any]:
    """An Envoy v3 DiscoveryResponse holding one ClusterLoadAssignment. `weights` None
    (no usable document) means equal weights; version_info is a digest of the content."""
    if not cluster:
        raise ConfigError("--cluster", "must not be empty", "pass the EDS cluster's service_name")
    parsed: Endpoints = {
        az: [h if isinstance(h, tuple) else parse_endpoint(h, f"endpoints: {az}") for h in hosts]
        for az, hosts in endpoints.items()
    }
    zones = sorted(az for az, hosts in parsed.items() if hosts)
    if not zones:
        raise ConfigError("endpoints", "no AZ has endpoints")
    weight_of = locality_weights(zones, weights)
    failover = failover_zones(weights, zones)
    localities = []
    for az in zones:
        locality: dict[str, Any] = {
            "locality": {"zone": az},
            "load_balancing_weight": weight_of[az],
            "lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}
                for host, port in parsed[az]
            ],
        }
        if az in failover:
            locality["priority"] = FAILOVER_PRIORITY
        localities.append(locality)
    resources = [{"@type": CLA_TYPE, "cluster_name": cluster, "endpoints": localities}]
    return {"version_info": content_version(resources, equal=weights is None), "resources": resources}


def content_version(resources: list[dict[str, Any]], *, equal: bool) -> str:
    """A version that changes exactly when the content does: Envoy logs it, and equal
    inputs give equal bytes, so the writer skips the rewrite."""
    digest = hashlib.sha256(json.dumps(resources, sort_keys=True).encode()).hexdigest()[:12]
    return f"{EQUAL_VERSION}-{digest}" if equal else digest


def render_bytes(cluster: str, endpoints: Endpoints, weights: WeightsDoc | None) -> bytes:
    doc = render_cluster_load_assignment(cluster, endpoints, weights)
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
        try:
            self._last: bytes | None = out.read_bytes()
        except OSError:
            self._last = None

    @property
    def has_file(self) -> bool:
        return self._last is not None

    def write(self, weights: WeightsDoc | None) -> bool:
        data = render_bytes(self.cluster, self.endpoints, weights)
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


def _watch_loop(settings: ConsulSettings, key_name: str, writer: EdsWriter) -> None:
    from azprobe.consumers.watch import WeightWatcher  # only the watch mode needs a thread

    wake = threading.Event()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: (stop.set(), wake.set()))
    watcher = WeightWatcher(settings, key_name, on_change=lambda _doc: wake.set())
    watcher.start()
    try:
        # Wait for Consul's first answer, but a SIGTERM must not wait for it.
        deadline = time.monotonic() + 5.0
        while not stop.is_set() and not watcher.wait_answered(timeout=0.1) and time.monotonic() < deadline:
            pass
        while not stop.is_set():
            status = watcher.status()
            write, weights = watch_decision(watcher.snapshot(), status.state, status.key_absent,
                                            writer.has_file)
            if write and writer.write(weights):
                click.echo(f"azprobe: wrote {writer.out} ({_describe(weights, writer)})", err=True)
            # Wake on a change, or every second to notice expiry.
            wake.wait(1.0)
            wake.clear()
    except KeyboardInterrupt:
        pass
    finally:
        watcher.stop()


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
def envoy_eds_command(cluster: str, endpoints_path: str, out: str, watch: bool, address: str | None,
                      prefix: str | None, source_az: str | None) -> None:
    """Render Envoy file-EDS (ClusterLoadAssignment) with locality weights from Consul."""
    from azprobe.consumers.weights_cli import weights_key_name

    settings = ConsulSettings.from_env(address=address, prefix=prefix)
    endpoints = load_endpoints(endpoints_path)
    if not cluster.strip():
        raise ConfigError("--cluster", "must not be empty", "pass the EDS cluster's service_name")
    out_path = Path(out)
    if not out_path.parent.is_dir():
        raise ConfigError("--out", f"directory {out_path.parent} does not exist", "create it first")
    writer = EdsWriter(cluster, endpoints, out_path)
    key_name = weights_key_name(source_az)
    if watch:
        _watch_loop(settings, key_name, writer)
        return
    doc = _read_weights_once(settings, settings.key(key_name))
    verb = "wrote" if writer.write(doc) else "unchanged"
    click.echo(f"azprobe: {verb} {out_path} ({_describe(doc, writer)})", err=True)


def _describe(weights: WeightsDoc | None, writer: EdsWriter) -> str:
    if weights is None:
        return "equal weights"
    drained = sorted(failover_zones(weights, writer.endpoints))
    return f"generation {weights.generation}" + (f"; failover only: {', '.join(drained)}" if drained else "")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(envoy_eds_command())
