"""SIGHUP reload, field by field: every config field is in controller/reload.py's table, and
changing it in the file and reloading a real Controller either puts it in force or names it
in the reload's one-line warning (and keeps the running value)."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from azprobe.controller.config import load_config
from azprobe.controller.main import Controller
from azprobe.controller.reload import APPLIED, RELOAD, RESTART, field_paths
from tests.pki import Leaf, TestCA

BASE: dict[str, Any] = {
    "controller": {"name": "c", "listen": "127.0.0.1:9741"},
    "consul": {"address": "http://127.0.0.1:1"},
    "agents": {"static": ["http://198.18.1.2:9740"]},
    "topology": {"azs": ["az-a", "az-b"]},
    "safety": {},
    "quorum": {},
    "model": {},
}
PROMETHEUS = {**BASE, "agents": {"source": "prometheus"}, "prometheus": {"url": "http://127.0.0.1:9090"}}
CONSUL_TLS = {**BASE, "consul": {"address": "https://127.0.0.1:1"}}
PROMETHEUS_TLS = {**PROMETHEUS, "prometheus": {"url": "https://127.0.0.1:9090"}}

# path -> (config to start from, the edit). An edit changes that one key in the file.
Edit = Callable[[dict, Path], None]


def _set(section: str, key: str, value: Any) -> Edit:
    def edit(doc: dict, _: Path) -> None:
        doc.setdefault(section, {})[key] = value
    return edit


def _secret(section: str) -> Edit:
    def edit(doc: dict, tmp: Path) -> None:
        path = tmp / f"{section}-token"
        path.write_text("s3cret\n")
        path.chmod(0o600)
        doc[section]["token_file"] = str(path)
    return edit


def _ca_file(doc: dict, tmp: Path) -> None:
    (tmp / "ca.pem").write_text("")
    doc["consul"]["ca_file"] = str(tmp / "ca.pem")


def _pki(tmp: Path) -> tuple[TestCA, Leaf]:
    ca = TestCA.create(tmp / "pki", "reload-ca")
    return ca, ca.issue("controller")


def _client_cert(doc: dict, tmp: Path) -> None:
    _, leaf = _pki(tmp)
    doc["consul"].update(cert_file=leaf.cert_file, key_file=leaf.key_file)


def _tls_ca(section: str) -> Edit:
    def edit(doc: dict, tmp: Path) -> None:
        doc[section]["ca_file"] = _pki(tmp)[0].cert_file
    return edit


def _secret_line(section: str, key: str, text: str) -> Edit:
    def edit(doc: dict, tmp: Path) -> None:
        path = tmp / key
        path.write_text(text)
        path.chmod(0o600)
        doc[section][key] = str(path)
    return edit


def _tls_base() -> dict:
    """A config pulling over mutual TLS; its files are made by _with_pki on the first edit."""
    return {**BASE, "agents": {"static": ["https://198.18.1.2:9740"], "identity": "spiffe://lab/node/{node}",
                               "tls": {"cert_file": "@ctl.crt", "key_file": "@ctl.key", "ca_file": "@ca.crt"}}}


def _with_pki(doc: dict, tmp: Path) -> dict:
    """Real certificates (tests/pki.py) for the "@name" placeholders of [agents.tls]."""
    ca = TestCA.create(tmp / "pki", "ca")
    ca.issue("controller", uri=["spiffe://lab/controller"], file_stem="ctl")
    ca.issue("controller-2", uri=["spiffe://lab/controller"], file_stem="ctl2")
    tls = doc["agents"]["tls"]
    for key, value in tls.items():
        if isinstance(value, str) and value.startswith("@"):
            tls[key] = str(tmp / "pki" / value[1:])
    return tls


def _tls_edit(key: str, value: Any) -> Edit:
    def edit(doc: dict, tmp: Path) -> None:
        _with_pki(doc, tmp)
        if key == "identity":
            doc["agents"]["identity"] = value
        else:
            doc["agents"]["tls"][key] = str(tmp / "pki" / value[1:]) if str(value).startswith("@") else value
        if key == "cert_file":
            doc["agents"]["tls"]["key_file"] = str(tmp / "pki" / "ctl2.key")
    return edit


def _source(doc: dict, _: Path) -> None:
    doc["agents"] = {"source": "prometheus"}
    doc["prometheus"] = {"url": "http://127.0.0.1:9090"}


CHANGES: dict[str, tuple[dict, Edit]] = {
    "controller.name": (BASE, _set("controller", "name", "other")),
    "controller.interval_s": (BASE, _set("controller", "interval_s", 2.0)),
    "controller.evaluation_window_s": (BASE, _set("controller", "evaluation_window_s", 9.0)),
    "controller.listen": (BASE, _set("controller", "listen", "127.0.0.1:9742")),
    "controller.session_ttl_s": (BASE, _set("controller", "session_ttl_s", 20.0)),
    "controller.lock_delay_s": (BASE, _set("controller", "lock_delay_s", 5.0)),
    "controller.advertise": (BASE, _set("controller", "advertise", "127.0.0.1:9800")),
    "controller.leader_probe_failures": (BASE, _set("controller", "leader_probe_failures", 7)),
    "consul.address": (BASE, _set("consul", "address", "http://127.0.0.1:2")),
    "consul.token_file": (BASE, _secret("consul")),
    "consul.ca_file": (BASE, _ca_file),
    "consul.cert_file": (CONSUL_TLS, _client_cert),
    "consul.key_file": (CONSUL_TLS, _client_cert),
    "consul.server_name": (CONSUL_TLS, _set("consul", "server_name", "server.dc1.consul")),
    "consul.verify": (CONSUL_TLS, _set("consul", "verify", False)),
    "consul.prefix": (BASE, _set("consul", "prefix", "other/v1/")),
    "agents.static": (BASE, _set("agents", "static", ["http://198.18.1.3:9740"])),
    "agents.discover": (BASE, _set("agents", "discover", "consul")),
    "agents.pull_timeout_s": (BASE, _set("agents", "pull_timeout_s", 2.5)),
    "agents.service": (BASE, _set("agents", "service", "other-agent")),
    "agents.token_file": (BASE, _secret("agents")),
    "agents.token": (BASE, _secret("agents")),
    "agents.max_body_bytes": (BASE, _set("agents", "max_body_bytes", 2 << 20)),
    "agents.concurrency": (BASE, _set("agents", "concurrency", 7)),
    "agents.source": (BASE, _source),
    "agents.forget_after_s": (BASE, _set("agents", "forget_after_s", 99.0)),
    "agents.tls.cert_file": ("tls", _tls_edit("cert_file", "@ctl2.crt")),
    "agents.tls.key_file": ("tls", _tls_edit("cert_file", "@ctl2.crt")),
    "agents.tls.ca_file": ("tls", _tls_edit("ca_file", "@ctl2.crt")),
    "agents.tls.server_name": ("tls", _tls_edit("server_name", "agent.lab")),
    "agents.identity": ("tls", _tls_edit("identity", "{node}.agents.lab")),
    "model.name": (BASE, _set("model", "name", "seed-v1")),
    "model.coefficients": (BASE, lambda doc, _: doc["model"].update({"default": {"w_failure": 0.6, "w_latency": 0.2}})),
    "topology.azs": (BASE, _set("topology", "azs", ["az-a", "az-b", "az-c"])),
    "heartbeat_s": (BASE, _set("safety", "heartbeat_s", 61.0)),
    "prometheus.url": (PROMETHEUS, _set("prometheus", "url", "http://127.0.0.1:9091")),
    "prometheus.query_timeout_s": (PROMETHEUS, _set("prometheus", "query_timeout_s", 3.0)),
    "prometheus.lookback_s": (PROMETHEUS, _set("prometheus", "lookback_s", 40.0)),
    "prometheus.selector": (PROMETHEUS, _set("prometheus", "selector", 'job="x"')),
    "prometheus.max_response_bytes": (PROMETHEUS, _set("prometheus", "max_response_bytes", 1 << 20)),
    "prometheus.max_series": (PROMETHEUS, _set("prometheus", "max_series", 1000)),
    "prometheus.ca_file": (PROMETHEUS_TLS, _tls_ca("prometheus")),
    "prometheus.bearer_token_file": (PROMETHEUS_TLS, _secret_line("prometheus", "bearer_token_file", "t0ken\n")),
    "prometheus.basic_auth_file": (PROMETHEUS_TLS, _secret_line("prometheus", "basic_auth_file", "user:pw\n")),
    **{f"safety.{k}": (BASE, _set("safety", k, v)) for k, v in {
        "degraded_below": 0.5, "recovery_band": 0.2, "drain_dwell_s": 7.0, "recover_dwell_s": 8.0,
        "max_decrease_points": 9.0, "max_increase_points": 11.0, "max_drained_zones": 2, "min_samples": 13,
        "stale_after_s": 14.0, "equal_after_s": 150.0, "forget_after_s": 1600.0, "hysteresis_points": 1.5,
        "panic_exit_s": 17.0, "timer_slack_s": 0.25, "flap_window_s": 90.0, "max_recover_dwell_s": 45.0}.items()},
    **{f"quorum.{k}": (BASE, _set("quorum", k, v)) for k, v in {
        "fraction": 0.7, "healthy_band": 0.2, "min_node_samples": 5, "min_nodes": 4, "min_source_azs": 3,
        "source_view_fraction": 0.6, "host_zone_fraction": 0.3, "max_hosts_per_zone": 32}.items()},
}
# Not keys of the file: consul.timeout_s is the controller's own bound per Consul call
# (consul_duties.CONSUL_TIMEOUT_S); consul.token is CONSUL_HTTP_TOKEN, an environment a
# running process keeps; `path` is the file reloaded, changed by reloading another.
# agents.tls.verify: pulls over mutual TLS are always verified (false is refused at load).
NOT_IN_THE_FILE = {"consul.timeout_s", "consul.token", "path", "agents.tls.verify"}


def _toml(doc: dict) -> str:
    """The test's configs as TOML: tables of scalars and lists, and [model.<name>] tables."""
    lines: list[str] = []

    def table(name: str, values: dict) -> None:
        lines.append(f"[{name}]")
        nested = {k: v for k, v in values.items() if isinstance(v, dict)}
        lines.extend(f"{k} = {json.dumps(v)}" for k, v in values.items() if k not in nested)
        for key, sub in nested.items():
            table(f"{name}.{key}", sub)

    for name, values in doc.items():
        table(name, values)
    return "\n".join(lines) + "\n"


def _value(config: Any, path: str) -> Any:
    for name in path.split("."):
        config = getattr(config, name) if config is not None else None
    return config


def _live(ctl: Controller, path: str) -> Any:
    """Where the running controller holds an APPLIED field (not just its config record)."""
    section, _, key = path.partition(".")
    collector = ctl.collector
    if section in ("safety", "quorum"):
        live = getattr(ctl.decider.rules, section)
        return getattr(live, key)
    return {
        "agents.static": lambda: tuple(t.url for t in ctl.handover.take_inputs().targets or ()),
        "agents.pull_timeout_s": lambda: collector.pull_timeout_s,
        "agents.service": lambda: ctl.handover.config()[0].agents.service,
        "agents.token_file": lambda: collector.token and ctl.config.agents.token_file,
        "agents.token": lambda: collector.token,
        "agents.max_body_bytes": lambda: collector._http.max_body_bytes,
        "agents.concurrency": lambda: collector.concurrency,
        "agents.forget_after_s": lambda: collector.identities.forget_after_s,
        **{f"agents.tls.{key}": (lambda key=key: getattr(collector.guard.files, key))
           for key in ("cert_file", "key_file", "ca_file")},
        "agents.tls.server_name": lambda: collector._http.server_name,
        "agents.identity": lambda: collector.guard.identity,
        "model.name": lambda: ctl.decider.rules.model.name,
        "model.coefficients": lambda: {"default": {"w_failure": ctl.decider.rules.model.config.w_failure,
                                                   "w_latency": ctl.decider.rules.model.config.w_latency}},
        "path": lambda: ctl.config.path,
    }[path]()


def test_every_config_field_is_in_the_reload_table():
    assert set(field_paths()) == set(RELOAD), set(field_paths()) ^ set(RELOAD)
    assert set(RELOAD.values()) <= {APPLIED, RESTART}


def test_every_field_of_the_file_has_a_change_here():
    assert set(CHANGES) | NOT_IN_THE_FILE == set(RELOAD), (set(CHANGES) | NOT_IN_THE_FILE) ^ set(RELOAD)


@pytest.mark.parametrize("path", sorted(CHANGES))
def test_a_reloaded_field_is_applied_or_named_as_needing_a_restart(path, tmp_path, caplog):
    start, edit = CHANGES[path]
    if start == "tls":  # the same real files before and after, but for the edited one
        start = _tls_base()
        _with_pki(start, tmp_path)
    file = tmp_path / "controller.toml"
    file.write_text(_toml(start))
    ctl = Controller(load_config(file))
    old = ctl.config
    doc = copy.deepcopy(start)
    edit(doc, tmp_path)
    file.write_text(_toml(doc))
    new = load_config(file)
    assert _value(new, path) != _value(old, path), "the edit must change the field"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="azprobe.controller"):
        ctl.reload(str(file))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "restart" in r.getMessage()]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    if RELOAD[path] == RESTART:
        assert len(warnings) == 1 and path in warnings[0].split(": ", 1)[1], warnings
        assert _value(ctl.config, path) == _value(old, path)  # runs on with the old value
    else:
        assert not any(path in w for w in warnings), warnings
        assert _value(ctl.config, path) == _value(new, path)
        assert _live(ctl, path) == _value(new, path)


def test_reloading_another_file_is_recorded(tmp_path):
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    first.write_text(_toml(BASE))
    second.write_text(_toml(BASE))
    ctl = Controller(load_config(first))
    ctl.reload(str(second))
    assert _live(ctl, "path") == str(second)
