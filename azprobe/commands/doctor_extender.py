"""`azprobe doctor --role extender`: what `azprobe scheduler-extender` needs before it
starts, checked with the extender's own loaders: its config (a bad one is exit 2, as at
start), the TLS files (built by the same call the daemon makes), the listen address,
Consul reachable, and the weights key readable and what the answers would follow now.
Read-only: the extender never writes to Consul."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from azprobe.commands.doctor import Check, bind_check, consul_checks, fail, ok, warn
from azprobe.errors import ConfigError

READ_FIX = 'give the token key_prefix "{prefix}" {{ policy = "read" }}, then set CONSUL_HTTP_TOKEN_FILE'
NEUTRAL = "answers are neutral (filter removes nothing, every node scores 5)"


def extender_checks(config_path: str | None) -> Iterator[Check]:
    if not config_path:
        yield fail("config", "no --config", "pass --config /etc/azprobe/scheduler-extender.toml")
        return
    from azprobe.consumers.scheduler.config import load_extender_config

    config = load_extender_config(config_path)  # ConfigError -> exit 2, as the daemon
    settings = config.extender
    yield ok("config", f"{config_path} is valid: weights from {config.consul.key(config.weights_key)}")
    yield _node_names_check(config)
    yield _tls_check(settings)
    yield bind_check("extender.listen", *settings.listen)
    consul = list(consul_checks(config.consul, write=False))
    yield from consul
    if not any(c.failed for c in consul):
        yield _weights_check(config)


def _node_names_check(config: Any) -> Check:
    if config.node_zones or config.name_patterns:
        return ok("nodes", f"names only (nodeCacheCapable: true): {len(config.node_zones)} named nodes, "
                           f"{len(config.name_patterns)} name patterns")
    return warn("nodes", "no [nodes.zones] and no nodes.name_patterns: with nodeCacheCapable: true a node "
                         "has a zone only once a full Node object carried it, else it scores neutral",
                "add nodes.name_patterns with a (?P<zone>...) group (not needed with nodeCacheCapable: false)")


def _tls_check(settings: Any) -> Check:
    from azprobe.consumers.scheduler.server import server_tls

    if not settings.tls_cert_file:
        return ok("extender.tls", "plain HTTP (no tls_cert_file): kube-scheduler's enableHTTPS must be false")
    try:
        server_tls(settings)
    except ConfigError as exc:
        return fail("extender.tls", f"{exc.field}: {exc.problem}", exc.fix or "fix the file, or unset TLS")
    clients = (f"clients need a certificate signed by {settings.tls_ca_file}" if settings.tls_ca_file
               else "any client")
    return ok("extender.tls", f"{settings.tls_cert_file} and its key load (HTTPS; {clients})")


def _weights_check(config: Any) -> Check:
    """One read of the weights key, judged the way the extender's watcher judges it."""
    from azprobe.clients import consul as kv
    from azprobe.contracts.weights import WeightsError, parse_weights

    key = config.consul.key(config.weights_key)
    fix = READ_FIX.format(prefix=config.consul.prefix)
    try:
        state = kv.read_key(kv.make_client(config.consul), key)
    except kv.ConsulError as exc:
        return fail("weights", f"cannot read {key}: {exc}", fix)
    if state.value is None:
        return warn("weights", f"{key} is absent: {NEUTRAL}",
                    "start the controllers, or check consul.prefix and weights.source_az")
    now = time.time()
    try:
        doc = parse_weights(state.value, now=now)
    except WeightsError as exc:
        return warn("weights", f"{key} holds no valid document ({exc}): {NEUTRAL}",
                    "check the controllers' logs: they write only valid documents")
    if doc.is_stale(now):
        return warn("weights", f"{key} (generation {doc.generation}) expired {now - doc.expires_at:.0f} s ago: "
                               f"{NEUTRAL}", "check that a controller leads (`azprobe weights`)")
    return ok("weights", f"{key}: generation {doc.generation}, fresh for {doc.expires_at - now:.0f} s more")
