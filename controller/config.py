"""The controller's TOML config (docs/contracts.md "Controller config").

Every table is read through azprobe.config.Section and closed with reject_unknown, so a
typo is `azprobe: safety.stale_aftr_s: unknown key (...)` and exit 2, never a setting
silently ignored. Keys extending the contract's [controller] table, for leader election:
- `session_ttl_s` (Consul's 10..86400) and `lock_delay_s` (Consul's default 15 s);
- `advertise` ("host:port" where other controllers reach this one's /healthz; default:
  `listen` when that is a routable address, else none) and `leader_probe_failures`
  (default 3, 0 = off): a standby that gets no answer from the advertised leader that many
  rounds in a row invalidates the leader's session, so a crashed leader is replaced after
  the lock-delay instead of after Consul's 2 x TTL. Fencing keeps this safe: a leader
  wrongly deposed can no longer write, and simply stands by.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from azprobe.daemon.address_file import format_host_port
from azprobe.clients.transport import MAX_BODY_BYTES, Endpoint, HttpError
from azprobe.config import Section, load_toml, parse_host_port, read_token_file
from azprobe.contracts.window import printable
from azprobe.errors import ConfigError
from azprobe.security.secret_file import read_basic_auth_file
from azprobe.security.tls import TlsFiles, client_context, parse_tls_files
from azprobe.controller.models import Model, load_model
from azprobe.controller.quorum import QuorumConfig
from azprobe.controller.topology import TopologySettings, parse_topology
from azprobe.controller.safety import SafetyConfig

AGENT_SERVICE = "azprobe-agent"  # the Consul catalog service agents register as


# Seconds of windows merged per decision: 3 s holds enough connections for a P95 at lab
# rates and lets a fault dominate the window a second or two sooner than 5 s would.
DEFAULT_EVALUATION_WINDOW_S = 3.0

@dataclass(frozen=True)
class ControllerSettings:
    name: str
    interval_s: float = 1.0
    evaluation_window_s: float = DEFAULT_EVALUATION_WINDOW_S
    listen: tuple[str, int] = ("127.0.0.1", 9741)
    session_ttl_s: float = 10.0
    lock_delay_s: float = 15.0
    advertise: str = ""  # host:port of /healthz for other controllers; "" = not reachable
    leader_probe_failures: int = 3


@dataclass(frozen=True)
class AgentsSettings:
    static: tuple[str, ...] = ()
    discover: str = ""  # "" or "consul"
    pull_timeout_s: float = 0.5
    service: str = AGENT_SERVICE
    token_file: str = ""  # the agents' bearer token (agent.token_file), sent on every pull
    token: str = field(default="", repr=False)  # its content, read at load
    max_body_bytes: int = MAX_BODY_BYTES  # a /v1/windows body above this is refused
    concurrency: int = 1024  # pulls in flight (docs/scale.md: more batch better on a busy box)
    source: str = "direct"  # "direct": pull agents; "prometheus": read [prometheus] (docs/prometheus.md)
    # A node name silent this long may be taken by another URL, or a URL take a new name
    # (docs/quorum.md "Identity"); None: collect.FORGET_AFTER_WINDOWS evaluation windows.
    forget_after_s: float | None = None
    # [agents.tls]: pull over https, with this client certificate, agents verified against
    # ca_file; None: plain http (labs). `identity`: the SAN an agent's certificate must
    # carry for the node its answer names, "{node}" standing for that name
    # (controller/agent_identity.py).
    tls: TlsFiles | None = None
    identity: str = ""


@dataclass(frozen=True)
class PrometheusSettings:
    """[prometheus]: where the Prometheus source reads agents' metrics (docs/prometheus.md)."""

    url: str = ""  # base URL of a Prometheus-compatible query API (…/api/v1/query is appended)
    query_timeout_s: float = 2.0
    lookback_s: float = 30.0  # raw samples read per query: at least 2 scrape intervals
    selector: str = ""  # extra label matchers, e.g. 'job="azprobe-agent"'
    max_response_bytes: int = 128 << 20
    max_series: int = 500_000
    ca_file: str = ""  # https: the CA of Prometheus's certificate ("": the system's store)
    bearer_token_file: str = ""  # sent as "Authorization: Bearer"; mode 0600, re-read when it changes
    basic_auth_file: str = ""  # one line "user:password", sent as basic auth; likewise


@dataclass(frozen=True)
class ModelSettings:
    name: str = "default"
    # [model.<name>] coefficient tables, passed as-is to the model layer, which owns
    # their meaning (and rejects unknown coefficients itself).
    coefficients: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class ControllerConfig:
    controller: ControllerSettings
    consul: Any  # azprobe.clients.consul.ConsulSettings
    agents: AgentsSettings
    model: ModelSettings
    safety: SafetyConfig
    topology: TopologySettings  # [topology]: the AZ set (controller/topology.py)
    heartbeat_s: float = 30.0  # [safety].heartbeat_s: write at least this often
    path: str = ""
    quorum: QuorumConfig = QuorumConfig()  # [quorum]: how nodes' verdicts combine (controller/quorum.py)
    prometheus: PrometheusSettings | None = None  # set when agents.source = "prometheus"


def _agent_url(url: str, field_name: str) -> str:
    # An agent is a base URL; the collector appends /v1/windows, so a URL with a path
    # (http://host:port/a/17) addresses one of many agents served by one process.
    if not url.startswith(("http://", "https://")) or len(url) < 10:
        raise ConfigError(field_name, f"{url!r} is not an http(s) URL", "for example \"http://198.18.1.2:9740\"")
    try:
        Endpoint.parse(url)  # the collector's own rules (a port, and not 0)
    except HttpError as exc:
        raise ConfigError(field_name, str(exc), "for example \"http://198.18.1.2:9740\"") from None
    return url.rstrip("/")


def _advertise(section: Section) -> str:
    """The explicit `advertise`, or `listen` when that is routable. A loopback or
    unspecified listen address is never advertised by default: another host's standby
    would probe its own host. (An explicit loopback advertise is the operator's call,
    e.g. several controllers on one host, as in the tests.)"""
    listen = section.string("listen", "127.0.0.1:9741")
    value = section.string("advertise", "")
    if value:
        host, _ = parse_host_port(value, section.field("advertise"), listen=True)  # port 0: the bound port
        if _unspecified(host):
            raise ConfigError(section.field("advertise"), f"{value!r} names no host",
                              "use this host's address, e.g. \"10.0.1.5:9741\"")
        return value
    host, _ = parse_host_port(listen, section.field("listen"), listen=True)
    return "" if _unspecified(host) or _loopback(host) else listen


def bound_advertise(advertise: str, bound_port: int) -> str:
    """The advertised address once the server listens: port 0 (listen on port 0, e.g. in
    tests) becomes the port the kernel gave us, so standbys probe the real /healthz."""
    if not advertise:
        return advertise
    host, port = parse_host_port(advertise, "advertise", listen=True)
    return format_host_port(host, bound_port) if port == 0 else advertise


def _unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return not host


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def parse_controller(section: Section) -> ControllerSettings:
    settings = ControllerSettings(
        name=section.string("name", socket.gethostname()) or socket.gethostname(),
        interval_s=section.number("interval_s", 1.0, min=0.05, max=60.0),
        evaluation_window_s=section.number("evaluation_window_s", DEFAULT_EVALUATION_WINDOW_S, min=0.1, max=3600.0),
        listen=parse_host_port(section.string("listen", "127.0.0.1:9741"), section.field("listen"), listen=True),
        session_ttl_s=section.number("session_ttl_s", 10.0, min=10.0, max=86400.0),
        lock_delay_s=section.number("lock_delay_s", 15.0, min=0.0, max=60.0),
        advertise=_advertise(section),
        leader_probe_failures=section.integer("leader_probe_failures", 3, min=0, max=1000),
    )
    section.reject_unknown()
    return settings


def parse_agents(section: Section) -> AgentsSettings:
    static = tuple(_agent_url(u, section.field("static")) for u in section.string_list("static"))
    discover = section.string("discover", "")
    if discover not in ("", "consul"):
        raise ConfigError(section.field("discover"), f"unknown discovery {discover!r}", "use \"consul\" or \"\"")
    source = section.string("source", "direct")
    if source not in ("direct", "prometheus"):
        raise ConfigError(section.field("source"), f"unknown source {source!r}",
                          "use \"direct\" (pull agents) or \"prometheus\" (read [prometheus])")
    settings = AgentsSettings(
        static=static,
        discover=discover,
        pull_timeout_s=section.number("pull_timeout_s", 0.5, min=0.01, max=30.0),
        service=section.string("service", AGENT_SERVICE) or AGENT_SERVICE,
        token_file=section.string("token_file", ""),
        max_body_bytes=section.integer("max_body_bytes", MAX_BODY_BYTES, min=64 * 1024, max=256 * 1024 * 1024),
        concurrency=section.integer("concurrency", 1024, min=1, max=8192),
        source=source,
        forget_after_s=section.number("forget_after_s", 0.0, min=0.1, max=86400.0)
        if section.has("forget_after_s") else None,
    )
    if settings.token_file:
        settings = replace(settings, token=read_token_file(settings.token_file, section.field("token_file")))
    settings = _agents_tls(section, settings)
    section.reject_unknown()
    return settings


IDENTITY_EXAMPLE = "spiffe://cluster.local/azprobe/node/{node}"


def _agents_tls(section: Section, settings: AgentsSettings) -> AgentsSettings:
    """[agents.tls] and agents.identity: both or neither."""
    identity = section.string("identity", "")
    if not section.has("tls"):
        if identity:
            raise ConfigError(section.field("identity"), "is set without [agents.tls]",
                              "add [agents.tls] (cert_file, key_file, ca_file) or remove agents.identity")
        return settings
    table = section.section("tls")
    files = parse_tls_files(table, table.name, server=False)
    if not (files.cert_file and files.key_file and files.ca_file) or not files.verify:
        raise ConfigError(table.name, "pulling agents over mutual TLS needs cert_file, key_file and ca_file, "
                          "and verify on", "set the controller's client certificate, its key and the agents' CA")
    if identity.count("{node}") != 1 or identity.replace("{node}", "").count("{") \
            or identity.replace("{node}", "").count("}") or len(identity) > 512:
        raise ConfigError(section.field("identity"), f"{printable(identity, 80)!r} must name {{node}} once "
                          "and no other braces", f"for example \"{IDENTITY_EXAMPLE}\" (a URI SAN) or "
                          "\"{node}.agents.example\" (a DNS SAN)")
    return replace(settings, tls=files, identity=identity)


def catalog_token_warning(agents: AgentsSettings) -> str:
    """The risk of catalog discovery with a bearer token ("" when there is none): the
    collector sends the token, over plain HTTP, to every address the catalog lists for
    the service, so whoever may register that service in Consul receives it."""
    if agents.discover != "consul" or not agents.token or agents.source != "direct":
        return ""
    return (f"agents.discover = \"consul\" with agents.token_file: the agents' token goes over plain HTTP to every "
            f"catalog registration of service {agents.service!r}, so whoever may register it receives the token; "
            f"allow service:write on {agents.service!r} to the agents' tokens only (docs/operations.md)")


_SELECTOR_FORBIDDEN = set('{}[]\n\r')


def parse_prometheus(section: Section) -> PrometheusSettings:
    url = section.string("url", "", required=True)
    if not url.startswith(("http://", "https://")) or len(url) < 10 or len(url) > 2000:
        raise ConfigError(section.field("url"), f"{url!r:.80} is not an http(s) URL",
                          "for example \"http://127.0.0.1:9090\"")
    try:
        Endpoint.parse(url)  # a host and a port, not 0
    except HttpError as exc:
        raise ConfigError(section.field("url"), str(exc), "for example \"http://127.0.0.1:9090\"") from None
    selector = section.string("selector", "")
    if len(selector) > 500 or _SELECTOR_FORBIDDEN & set(selector):
        raise ConfigError(section.field("selector"), f"{selector!r:.80} is not a list of label matchers",
                          "for example 'job=\"azprobe-agent\"', without braces")
    settings = PrometheusSettings(
        url=url.rstrip("/"),
        query_timeout_s=section.number("query_timeout_s", 2.0, min=0.05, max=60.0),
        lookback_s=section.number("lookback_s", 30.0, min=1.0, max=3600.0),
        selector=selector,
        max_response_bytes=section.integer("max_response_bytes", 128 << 20, min=1024, max=4 << 30),
        max_series=section.integer("max_series", 500_000, min=1, max=100_000_000),
        **_prometheus_credentials(section, url),
    )
    section.reject_unknown()
    return settings


def _prometheus_credentials(section: Section, url: str) -> dict[str, str]:
    """ca_file (https only), and at most one of bearer_token_file and basic_auth_file;
    each file is read now, so a missing one or one others may read exits 2 at start."""
    values = {key: section.string(key, "") for key in ("ca_file", "bearer_token_file", "basic_auth_file")}
    if values["ca_file"]:
        if not url.startswith("https://"):
            raise ConfigError(section.field("ca_file"), "is set but prometheus.url is not https://",
                              "use an https:// URL, or remove ca_file")
        client_context(TlsFiles(ca_file=values["ca_file"]), section.name)
    if values["bearer_token_file"] and values["basic_auth_file"]:
        raise ConfigError(section.field("basic_auth_file"), "is set with bearer_token_file",
                          "send one credential: remove one of the two")
    if values["bearer_token_file"]:
        read_token_file(values["bearer_token_file"], section.field("bearer_token_file"))
    if values["basic_auth_file"]:
        read_basic_auth_file(values["basic_auth_file"], section.field("basic_auth_file"))
    return values


def parse_safety(section: Section) -> tuple[SafetyConfig, float]:
    """[safety]: the safety rules' keys (controller.safety owns them) plus heartbeat_s."""
    config = SafetyConfig.from_section(section, reject_unknown=False)
    heartbeat_s = section.number("heartbeat_s", 30.0, min=0.1, max=86400.0)
    section.reject_unknown()
    return config, heartbeat_s


def parse_model(section: Section) -> ModelSettings:
    name = section.string("name", "default")
    coefficients: dict[str, dict[str, Any]] = {}
    for key, value in section.data.items():
        if key == "name":
            continue
        if not isinstance(value, dict):
            raise ConfigError(section.field(key), "unknown key", "coefficients go in a [model.<name>] table")
        section.section(key)  # marks it known
        coefficients[key] = dict(value)
    section.reject_unknown()
    if not name:
        raise ConfigError(section.field("name"), "is empty", "use \"default\" or \"seed-v1\"")
    settings = ModelSettings(name=name, coefficients=coefficients)
    load_model_from(settings)  # a bad name or coefficient is a config error now, not at the first cycle
    return settings


def load_model_from(settings: ModelSettings) -> Model:
    """The configured model with its [model.<name>] coefficients."""
    return load_model(settings.name, Section(settings.coefficients.get(settings.name, {}), f"model.{settings.name}"))


def _consul_settings(section: Section) -> Any:
    from azprobe.clients.consul import ConsulSettings  # consumers helper's module

    return ConsulSettings.from_section(section)


def check_combination(controller: ControllerSettings, agents: AgentsSettings,
                      prometheus: PrometheusSettings | None) -> None:
    """The checks across fields that no one section's parser can make: run at start and on
    every reload (controller/reload.py), where a field kept until a restart meets fields
    of the new file, so a reload never installs a config that start refuses."""
    if controller.evaluation_window_s < controller.interval_s:
        raise ConfigError("controller.evaluation_window_s", f"{controller.evaluation_window_s} is shorter than "
                          f"interval_s {controller.interval_s}",
                          "the evaluation window must hold at least one interval")
    if agents.source == "prometheus":  # [prometheus] is then set: parse_config requires its url
        if agents.static or agents.discover:
            raise ConfigError("agents.source", "\"prometheus\" reads agents from Prometheus, not from "
                              "agents.static or agents.discover", "remove agents.static and agents.discover")
    else:
        if prometheus is not None:
            raise ConfigError("prometheus", "is set but agents.source is \"direct\"",
                              "set agents.source = \"prometheus\" or remove [prometheus]")
        if not agents.static and not agents.discover:
            raise ConfigError("agents.static", "no agents configured",
                              "list agent URLs in agents.static or set agents.discover = \"consul\"")
    plain = [u for u in agents.static if not u.startswith("https://")] if agents.tls is not None else []
    if plain:
        raise ConfigError("agents.static", f"{plain[0]!r} is plain http, but [agents.tls] pulls over "
                          "mutual TLS", "use https:// agent URLs (agents serve HTTPS with [agent.tls])")
    if agents.forget_after_s is not None and agents.forget_after_s < controller.evaluation_window_s:
        raise ConfigError("agents.forget_after_s", f"{agents.forget_after_s:g} is shorter than "
                          f"controller.evaluation_window_s {controller.evaluation_window_s:g}",
                          "a name must stay silent until its windows have left the evaluation window; "
                          "raise it, or leave it unset for the default")


def parse_config(data: dict[str, Any], path: str = "") -> ControllerConfig:
    root = Section(data, "")
    safety, heartbeat_s = parse_safety(root.section("safety"))
    agents = parse_agents(root.section("agents"))
    # read when set even for the direct pull: check_combination then says why it is unused
    prometheus = parse_prometheus(root.section("prometheus")) \
        if agents.source == "prometheus" or root.has("prometheus") else None
    controller = parse_controller(root.section("controller"))
    check_combination(controller, agents, prometheus)
    config = ControllerConfig(
        controller=controller,
        consul=_consul_settings(root.section("consul")),
        agents=agents,
        model=parse_model(root.section("model")),
        safety=safety,
        heartbeat_s=heartbeat_s,
        path=path,
        topology=parse_topology(root.section("topology")),
        quorum=QuorumConfig.from_section(root.section("quorum")),
        prometheus=prometheus,
    )
    root.reject_unknown()
    return config


def load_config(path: str | Path) -> ControllerConfig:
    return parse_config(load_toml(path), str(path))
