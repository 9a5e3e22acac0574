"""SIGHUP: what a reload applies at once and what needs a restart, field by field.

`RELOAD` names every field of the config dataclasses (controller/config.py and the
dataclasses it holds; tests/unit/test_controller_reload.py fails on a field it lacks).
A reload keeps the running value of every RESTART field and names each one that changed
in one warning line; every APPLIED field is in force from the next cycle (or Consul round).
A RESTART field that changed keeps the APPLIED fields that only mean something with it
(KEPT_WITH), and the config so merged must pass start's checks across fields
(config.check_combination), or the reload is refused whole.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from collections.abc import Iterator
from typing import Any

from azprobe.clients.consul import ConsulSettings
from azprobe.controller.config import ControllerConfig, catalog_token_warning, check_combination, load_model_from
from azprobe.controller.decide import DecisionRules
from azprobe.controller.decider import Decider
from azprobe.controller.handover import Handover
from azprobe.controller.window_source import AgentTarget
from azprobe.errors import ConfigError

log = logging.getLogger("azprobe.controller")

APPLIED = "applied"
RESTART = "restart"

# ControllerConfig fields typed Any (their module is imported late by the config loader).
UNTYPED_SECTIONS: dict[str, type] = {"consul": ConsulSettings}

# Every field of the config: in force on reload, or kept until a restart (and named in
# the reload's warning when it changed).
RELOAD: dict[str, str] = {
    # identity, addresses and timing: the loops, the session and the server are built from them
    "controller.name": RESTART, "controller.interval_s": RESTART, "controller.evaluation_window_s": RESTART,
    "controller.listen": RESTART, "controller.session_ttl_s": RESTART, "controller.lock_delay_s": RESTART,
    "controller.advertise": RESTART, "controller.leader_probe_failures": RESTART,
    "consul.address": RESTART, "consul.token": RESTART, "consul.ca_file": RESTART, "consul.prefix": RESTART,
    "consul.timeout_s": RESTART,
    # the path; the token in it is re-read when the file changes, or on SIGHUP (SecretFile)
    "consul.token_file": RESTART,
    # the client is built once; the files' contents rotate without a restart (RotatingContext)
    "consul.cert_file": RESTART, "consul.key_file": RESTART, "consul.server_name": RESTART,
    "consul.verify": RESTART,
    # the agents: the collector takes them from the next pull, discovery from the next round
    "agents.static": APPLIED, "agents.discover": RESTART, "agents.pull_timeout_s": APPLIED,
    "agents.service": APPLIED, "agents.token_file": APPLIED, "agents.token": APPLIED,
    "agents.max_body_bytes": APPLIED, "agents.concurrency": APPLIED, "agents.source": RESTART,
    "agents.forget_after_s": APPLIED,
    # mutual TLS with the agents (controller/agent_identity.py): a reload loads the files
    # named now, or re-reads the same ones, for the next connection on
    "agents.tls.cert_file": APPLIED, "agents.tls.key_file": APPLIED, "agents.tls.ca_file": APPLIED,
    "agents.tls.server_name": APPLIED, "agents.tls.verify": APPLIED, "agents.identity": APPLIED,
    # the decision rules, rebuilt (the zones' memory is kept)
    "model.name": APPLIED, "model.coefficients": APPLIED,
    "safety.degraded_below": APPLIED, "safety.recovery_band": APPLIED, "safety.drain_dwell_s": APPLIED,
    "safety.recover_dwell_s": APPLIED, "safety.flap_window_s": APPLIED, "safety.max_recover_dwell_s": APPLIED,
    "safety.max_decrease_points": APPLIED,
    "safety.max_increase_points": APPLIED, "safety.max_drained_zones": APPLIED, "safety.min_samples": APPLIED,
    "safety.stale_after_s": APPLIED, "safety.equal_after_s": APPLIED, "safety.forget_after_s": APPLIED,
    "safety.hysteresis_points": APPLIED, "safety.panic_exit_s": APPLIED, "safety.timer_slack_s": APPLIED,
    "quorum.fraction": APPLIED, "quorum.healthy_band": APPLIED, "quorum.min_node_samples": APPLIED,
    "quorum.min_nodes": APPLIED, "quorum.min_source_azs": APPLIED, "quorum.source_view_fraction": APPLIED,
    "quorum.host_zone_fraction": APPLIED, "quorum.max_hosts_per_zone": APPLIED,
    "topology.azs": RESTART,  # the AZ set the store admits and the controls may name
    "heartbeat_s": RESTART,  # the documents' expiry, fixed for the leader's term
    "path": APPLIED,
    "prometheus.url": RESTART, "prometheus.query_timeout_s": RESTART, "prometheus.lookback_s": RESTART,
    "prometheus.selector": RESTART, "prometheus.max_response_bytes": RESTART, "prometheus.max_series": RESTART,
    # the paths; their contents are re-read when they change, or on SIGHUP (prom_auth.py)
    "prometheus.ca_file": RESTART, "prometheus.bearer_token_file": RESTART, "prometheus.basic_auth_file": RESTART,
}


# A RESTART field -> the APPLIED fields running on with it while it changed: the static
# list of a direct pull is no list for Prometheus (nor the reverse), and taking the new
# one would leave the running source with no agents.
KEPT_WITH: dict[str, tuple[str, ...]] = {"agents.source": ("agents.static",)}


def field_paths(cls: type = ControllerConfig, prefix: str = "") -> Iterator[str]:
    """Every leaf field of a config dataclass, as "section.key" (nested dataclasses walked)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        inner = _dataclass_of(hints[f.name]) or (UNTYPED_SECTIONS.get(path) if not prefix else None)
        if inner is not None:
            yield from field_paths(inner, path + ".")
        else:
            yield path


def _dataclass_of(hint: Any) -> type | None:
    for candidate in (hint, *typing.get_args(hint)):  # X, or X | None
        if dataclasses.is_dataclass(candidate) and isinstance(candidate, type):
            return candidate
    return None


def _value(config: Any, path: str) -> Any:
    for name in path.split("."):
        if config is None:
            return None
        config = getattr(config, name)
    return config


def changed_fields(old: ControllerConfig, new: ControllerConfig) -> list[str]:
    return [path for path in RELOAD if _value(old, path) != _value(new, path)]


def running_config(old: ControllerConfig, new: ControllerConfig) -> ControllerConfig:
    """`new` with every RESTART field kept at its running value, and with it, when it
    changed, what KEPT_WITH names."""
    config = new
    for path in _kept(old, new):
        config = _with(config, old, path.split("."))
    return config


def _kept(old: ControllerConfig, new: ControllerConfig) -> list[str]:
    kept = [path for path, how in RELOAD.items() if how == RESTART]
    return kept + [dep for path, deps in KEPT_WITH.items() if _value(old, path) != _value(new, path) for dep in deps]


def checked_running_config(old: ControllerConfig, new: ControllerConfig) -> ControllerConfig:
    """running_config(old, new), or ConfigError when start would refuse it, naming the
    fields kept until a restart that it combines with the new file."""
    config = running_config(old, new)
    try:
        check_combination(config.controller, config.agents, config.prometheus)
    except ConfigError as exc:
        restart = [path for path in changed_fields(old, new) if RELOAD[path] == RESTART]
        raise ConfigError(exc.field, f"{exc.problem}, with the running {', '.join(restart)} kept until a restart",
                          f"{exc.fix}; or restart the controller to take the whole file") from None
    return config


def _with(config: Any, old: Any, names: list[str]) -> Any:
    """`config` with the field at `names` taken from `old` (a whole section when either lacks it)."""
    name, rest = names[0], names[1:]
    child, old_child = getattr(config, name), getattr(old, name)
    if rest and child is not None and old_child is not None:
        old_child = _with(child, old_child, rest)
    return dataclasses.replace(config, **{name: old_child})


def apply_reload(old: ControllerConfig, new: ControllerConfig, config: ControllerConfig, *, decider: Decider,
                 handover: Handover) -> ControllerConfig:
    """Put `config`, checked_running_config(old, new), in force: the APPLIED fields of `new`;
    warn about the RESTART ones that changed. Returns `config`. Runs on the event loop,
    between cycles."""
    restart = [path for path in changed_fields(old, new) if RELOAD[path] == RESTART]
    if restart:
        along = [dep for path in restart for dep in KEPT_WITH.get(path, ()) if _value(old, dep) != _value(new, dep)]
        log.warning("reload: %s changed but need%s a restart; running on with the old value%s%s",
                    ", ".join(restart), "s" if len(restart) == 1 else "", "" if len(restart) == 1 else "s",
                    f" (and the running {', '.join(along)}, which goes with it)" if along else "")
    if catalog_token_warning(config.agents) and not catalog_token_warning(old.agents):
        log.warning("reload: %s", catalog_token_warning(config.agents))
    decider.rules = DecisionRules(load_model_from(config.model), config.quorum, config.safety)
    decider.collector.apply_settings(config.agents, stale_after_s=config.safety.stale_after_s,
                                     interval_s=config.controller.interval_s)
    if config.agents.discover != "consul":
        handover.offer_targets(AgentTarget(url) for url in config.agents.static)
    handover.offer_config(config)  # the Consul side: discovery's service and static list, the model's name
    return config
