"""`azprobe xds --config FILE`: the TOML loader. Every bad value is a ConfigError naming
its field (exit 2); unknown keys are rejected. docs/contracts.md "xDS server config"
lists every key with its default."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from azprobe.clients.consul import ConsulSettings
from azprobe.config import MAX_FILE_BYTES, Section, load_toml, parse_host_port, parse_topology, read_file
from azprobe.consumers.envoy import Endpoints, parse_endpoints
from azprobe.contracts import bounded_json, kv
from azprobe.errors import ConfigError
from azprobe.security.tls import TlsFiles, parse_tls_files

UNIX_PREFIX = "unix:"
MAX_SERVICES = 256
SERVICE_NAME_MAX = 200


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    static: Endpoints | None  # endpoints_file, or None for a Consul catalog service
    consul_service: str | None


@dataclass(frozen=True)
class XdsSettings:
    listen: str  # "host:port" or "unix:/path"
    metrics_listen: tuple[str, int] | None
    max_streams: int = 10_000
    max_streams_per_client: int = 1_000
    max_message_bytes: int = 1 << 20
    max_resource_names: int = 1024
    first_request_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0
    keepalive_s: float = 60.0
    keepalive_timeout_s: float = 20.0
    drain_s: float = 5.0
    tls: TlsFiles | None = None  # None: plaintext gRPC; ca_file set: client certificates required
    zones: tuple[str, ...] = ()
    services: tuple[ServiceSpec, ...] = ()
    consul: ConsulSettings | None = None
    topology: dict[str, list[ipaddress.IPv4Network | ipaddress.IPv6Network]] = field(default_factory=dict)

    @property
    def views(self) -> tuple[str, ...]:
        """The zones with a view of their own (weights/from/<zone>): the configured ones,
        else every AZ of [topology] and of the static endpoints."""
        if self.zones:
            return self.zones
        found = set(self.topology)
        for service in self.services:
            found |= set(service.static or {})
        return tuple(sorted(found))


def parse_listen(value: str, field_name: str) -> str:
    if value.startswith(UNIX_PREFIX):
        if not value[len(UNIX_PREFIX):].startswith("/"):
            raise ConfigError(field_name, f"{value!r}: a unix socket needs an absolute path",
                              "for example unix:/run/azprobe-xds/xds.sock")
        return value
    host, port = parse_host_port(value, field_name, listen=True)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _load_endpoints_file(path: str, field_name: str) -> Endpoints:
    raw = read_file(Path(path), field_name)
    try:
        data: Any = bounded_json.loads(raw, max_bytes=MAX_FILE_BYTES, what=path)
    except bounded_json.JsonRefused as exc:
        raise ConfigError(field_name, str(exc)) from None
    try:
        return parse_endpoints(data, path)
    except ConfigError as exc:
        raise ConfigError(field_name, f"{exc.field}: {exc.problem}", exc.fix) from None


def _service(raw: Any, index: int) -> ServiceSpec:
    section = Section(raw, "service")
    where = f"service[{index}]"
    name = section.string("name", required=True)
    if not name or len(name) > SERVICE_NAME_MAX or not name.isprintable() or "/" in name or name == "*":
        raise ConfigError(f"{where}.name", f"bad service name {name!r:.60}", "use the xDS cluster name, e.g. backend")
    endpoints_file = section.string("endpoints_file", "")
    consul_service = section.string("consul_service", "")
    section.reject_unknown()
    if bool(endpoints_file) == bool(consul_service):
        raise ConfigError(where, "needs exactly one of endpoints_file and consul_service",
                          "static endpoints: endpoints_file = \"/etc/azprobe/NAME.json\"; "
                          "the Consul catalog: consul_service = \"NAME\"")
    static = _load_endpoints_file(endpoints_file, f"{where}.endpoints_file") if endpoints_file else None
    return ServiceSpec(name=name, static=static, consul_service=consul_service or None)


def parse_xds_config(data: Any) -> XdsSettings:
    root = Section(data, "")
    xds = root.section("xds")
    listen = parse_listen(xds.string("listen", "127.0.0.1:18000"), "xds.listen")
    metrics = xds.string("metrics_listen", "127.0.0.1:9742")
    metrics_listen = parse_host_port(metrics, "xds.metrics_listen", listen=True) if metrics else None
    settings: dict[str, Any] = dict(
        max_streams=xds.integer("max_streams", 10_000, min=1, max=1_000_000),
        max_streams_per_client=xds.integer("max_streams_per_client", 1_000, min=1, max=1_000_000),
        max_message_bytes=xds.integer("max_message_bytes", 1 << 20, min=4096, max=64 << 20),
        max_resource_names=xds.integer("max_resource_names", 1024, min=1, max=100_000),
        first_request_timeout_s=xds.number("first_request_timeout_s", 10.0, min=0.1, max=3600),
        idle_timeout_s=xds.number("idle_timeout_s", 300.0, min=1, max=86400),
        keepalive_s=xds.number("keepalive_s", 60.0, min=1, max=86400),
        keepalive_timeout_s=xds.number("keepalive_timeout_s", 20.0, min=1, max=3600),
        drain_s=xds.number("drain_s", 5.0, min=0, max=600),
    )
    zones = xds.string_list("zones")
    tls_table = xds.section("tls")  # present, even empty: TLS is on and must be complete
    settings["tls"] = parse_tls_files(tls_table.data, "xds.tls", server=True) if xds.has("tls") else None
    for zone in zones:
        if not kv.is_az_name(zone):
            raise ConfigError("xds.zones", f"{zone!r:.60} is not an AZ name")
    xds.reject_unknown()
    consul_section = root.section("consul")
    topology = parse_topology(root.section("topology"))
    raw_services = root._get("service", [])
    if not isinstance(raw_services, list) or not raw_services:
        raise ConfigError("service", "no [[service]] table", 'add [[service]] name = "backend" with '
                                                             "endpoints_file or consul_service")
    if len(raw_services) > MAX_SERVICES:
        raise ConfigError("service", f"{len(raw_services)} services: over {MAX_SERVICES}")
    services = tuple(_service(raw, i) for i, raw in enumerate(raw_services))
    names = [s.name for s in services]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError("service.name", f"{dup!r} is configured twice")
    needs_consul_catalog = any(s.consul_service for s in services)
    if needs_consul_catalog and not topology:
        raise ConfigError("topology", "consul_service needs [topology] to place each instance in an AZ",
                          "copy the agents' [topology] table")
    consul = ConsulSettings.from_section(consul_section)
    root.reject_unknown()
    return XdsSettings(listen=listen, metrics_listen=metrics_listen, zones=tuple(zones), services=services,
                       consul=consul, topology=topology, **settings)


def load_xds_config(path: str | Path) -> XdsSettings:
    return parse_xds_config(load_toml(path))
