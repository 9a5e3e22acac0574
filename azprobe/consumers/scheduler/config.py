"""`azprobe scheduler-extender --config FILE`: the TOML loader (docs/contracts.md
"Scheduler extender config"). Every table is read through azprobe.config.Section and
closed with reject_unknown: a typo is a one-line error naming the key, exit code 2.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from azprobe.clients.consul import ConsulSettings
from azprobe.config import Section, load_toml, parse_host_port
from azprobe.consumers.scheduler.protocol import MAX_NAME_CHARS
from azprobe.consumers.scheduler.zones import MAX_ZONE_CHARS
from azprobe.contracts import kv
from azprobe.errors import ConfigError

DEFAULT_LISTEN = ("127.0.0.1", 9746)
MAX_PATTERNS = 64
MAX_STATIC_NODES = 100_000


@dataclass(frozen=True)
class ExtenderSettings:
    listen: tuple[str, int] = DEFAULT_LISTEN
    # 5,000 full Node objects of a few KiB each, with room: kube-scheduler sends every
    # feasible node in one body when nodeCacheCapable is false.
    max_body_bytes: int = 64 * 1024 * 1024
    max_nodes: int = 15_000  # Kubernetes supports 5,000 nodes per cluster
    request_timeout_s: float = 5.0  # the whole body; kube-scheduler's httpTimeout is 5 s by default
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # Set: every client must present a certificate this CA signed (kube-scheduler's
    # tlsConfig certFile/keyFile), so only the schedulers get answers.
    tls_ca_file: str = ""


@dataclass(frozen=True)
class ExtenderConfig:
    extender: ExtenderSettings
    consul: ConsulSettings
    weights_key: str  # under the prefix: "weights" or "weights/from/<AZ>"
    node_zones: dict[str, str] = field(default_factory=dict)
    name_patterns: tuple[re.Pattern[str], ...] = ()
    path: str = ""


def _extender(section: Section) -> ExtenderSettings:
    d = ExtenderSettings()
    listen = parse_host_port(section.string("listen", f"{d.listen[0]}:{d.listen[1]}"), section.field("listen"),
                             listen=True)
    settings = ExtenderSettings(
        listen=listen,
        max_body_bytes=section.integer("max_body_bytes", d.max_body_bytes, min=1024, max=1 << 30),
        max_nodes=section.integer("max_nodes", d.max_nodes, min=1, max=1_000_000),
        request_timeout_s=section.number("request_timeout_s", d.request_timeout_s, min=0.1, max=60),
        tls_cert_file=section.string("tls_cert_file", ""),
        tls_key_file=section.string("tls_key_file", ""),
        tls_ca_file=section.string("tls_ca_file", ""),
    )
    section.reject_unknown()
    if bool(settings.tls_cert_file) != bool(settings.tls_key_file):
        missing = "tls_key_file" if settings.tls_cert_file else "tls_cert_file"
        raise ConfigError(section.field(missing), "is required when the other TLS file is set",
                          "set both extender.tls_cert_file and extender.tls_key_file, or neither")
    if settings.tls_ca_file and not settings.tls_cert_file:
        raise ConfigError(section.field("tls_ca_file"), "asks clients for certificates, which needs HTTPS",
                          "set extender.tls_cert_file and extender.tls_key_file too, or unset tls_ca_file")
    return settings


def _weights_key(section: Section) -> str:
    source_az = section.string("source_az", "")
    section.reject_unknown()
    try:
        return kv.weights_name(source_az or None)
    except ValueError as exc:
        raise ConfigError(section.field("source_az"), str(exc), "an AZ name such as az-a, or leave it unset") from None


def _zone(value: Any, field_name: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ZONE_CHARS:
        raise ConfigError(field_name, f"expected a zone name of 1..{MAX_ZONE_CHARS} chars, got {value!r:.40}")
    return value


def _nodes(section: Section) -> tuple[dict[str, str], tuple[re.Pattern[str], ...]]:
    raw_patterns = section.string_list("name_patterns")
    zones_section = section.section("zones")
    section.reject_unknown()
    if len(raw_patterns) > MAX_PATTERNS:
        raise ConfigError(section.field("name_patterns"), f"{len(raw_patterns)} patterns exceed {MAX_PATTERNS}")
    patterns = []
    for i, text in enumerate(raw_patterns):
        where = f"{section.field('name_patterns')}[{i}]"
        try:
            pattern = re.compile(text)
        except re.error as exc:
            raise ConfigError(where, f"{text!r:.60} is not a regular expression: {exc}") from None
        if "zone" not in pattern.groupindex:
            raise ConfigError(where, f"{text!r:.60} has no (?P<zone>...) group",
                              r'for example "gke-.*-(?P<zone>[a-z]+-[a-z]+[0-9]-[a-z])-[0-9a-f]+-[0-9a-z]+"')
        patterns.append(pattern)
    if len(zones_section.data) > MAX_STATIC_NODES:
        raise ConfigError(zones_section.name, f"{len(zones_section.data)} nodes exceed {MAX_STATIC_NODES}")
    static = {}
    for name in zones_section.data:
        if not 0 < len(name) <= MAX_NAME_CHARS:
            raise ConfigError(zones_section.name, f"node name {name!r:.40} is not 1..{MAX_NAME_CHARS} chars")
        if isinstance(zones_section.data[name], str):
            static[name] = _zone(zones_section.string(name), zones_section.field(name))
        else:
            _zone(zones_section.data[name], zones_section.field(name))
    return static, tuple(patterns)


def parse_extender_config(data: dict[str, Any], path: str = "") -> ExtenderConfig:
    root = Section(data, "")
    extender = _extender(root.section("extender"))
    consul = ConsulSettings.from_section(root.section("consul"))
    weights_key = _weights_key(root.section("weights"))
    static, patterns = _nodes(root.section("nodes"))
    root.reject_unknown()
    return ExtenderConfig(extender=extender, consul=consul, weights_key=weights_key, node_zones=static,
                          name_patterns=patterns, path=path)


def load_extender_config(path: str | Path) -> ExtenderConfig:
    return parse_extender_config(load_toml(path), str(path))
