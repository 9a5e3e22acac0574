"""Controller config (docs/contracts.md "Controller config"): defaults, and one-line errors naming the field, exit 2."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from azprobe.errors import ConfigError
from azprobe.controller.config import parse_config
from tests.helpers import write_secret

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = {"agents": {"static": ["http://198.18.1.2:9740"]}, "topology": {"azs": ["az-a", "az-b", "az-c"]}}


def test_defaults_follow_the_contract(monkeypatch):
    monkeypatch.delenv("CONSUL_HTTP_ADDR", raising=False)
    config = parse_config(MINIMAL)
    c = config.controller
    assert (c.interval_s, c.evaluation_window_s, c.listen) == (1.0, 3.0, ("127.0.0.1", 9741))
    assert (c.session_ttl_s, c.lock_delay_s) == (10.0, 15.0)
    assert config.agents.pull_timeout_s == 0.5 and config.agents.discover == ""
    assert config.consul.prefix == "azprobe/v1/" and config.consul.address == "http://127.0.0.1:8500"
    s = config.safety
    assert (s.min_samples, s.stale_after_s, s.equal_after_s, s.max_drained_zones) == (20, 10.0, 60.0, 1)
    assert config.heartbeat_s == 30.0 and config.model.name == "default"


@pytest.mark.parametrize("data, field", [
    ({**MINIMAL, "controller": {"intervl_s": 1}}, "controller.intervl_s"),
    ({**MINIMAL, "controller": {"session_ttl_s": 5}}, "controller.session_ttl_s"),
    ({**MINIMAL, "controller": {"listen": "nope"}}, "controller.listen"),
    ({**MINIMAL, "controller": {"interval_s": 2, "evaluation_window_s": 1}}, "controller.evaluation_window_s"),
    ({"agents": {"static": ["ftp://x"]}}, "agents.static"),
    ({"agents": {}}, "agents.static"),
    ({"agents": {"discover": "dns"}}, "agents.discover"),
    ({**MINIMAL, "safety": {"heartbeat_s": "often"}}, "safety.heartbeat_s"),
    ({**MINIMAL, "safety": {"stale_after_s": 30, "equal_after_s": 10}}, "safety.equal_after_s"),
    ({**MINIMAL, "safety": {"min_sampels": 3}}, "safety.min_sampels"),
    ({**MINIMAL, "model": {"name": "magic"}}, "model.name"),
    ({**MINIMAL, "model": {"name": "default", "default": {"w_failure": 2.0}}}, "model.default.w_failure"),
    ({**MINIMAL, "model": {"temperature": 1}}, "model.temperature"),
    ({**MINIMAL, "consul": {"adress": "x"}}, "consul.adress"),
    ({**MINIMAL, "extra": {}}, "extra"),
    ({"agents": {**MINIMAL["agents"], "forget_after_s": "long"}}, "agents.forget_after_s"),
    ({"agents": {**MINIMAL["agents"], "forget_after_s": 0}}, "agents.forget_after_s"),
    ({"agents": {**MINIMAL["agents"], "forget_after_s": 2.0}}, "agents.forget_after_s"),  # < the 3 s window
    ({**MINIMAL, "consul": {"address": "http://127.0.0.1:0"}}, "consul.address"),
    ({**MINIMAL, "consul": {"address": "127.0.0.1:0"}}, "consul.address"),
    ({**MINIMAL, "agents": {"source": "prometheus"}, "prometheus": {"url": "http://127.0.0.1:0"}}, "prometheus.url"),
    ({**MINIMAL, "agents": {"source": "prometheus"}, "prometheus": {"url": "https://prom.example:0/x"}},
     "prometheus.url"),
    ({**MINIMAL, "topology": {}}, "topology.azs"),
    ({**MINIMAL, "topology": {"azs": []}}, "topology.azs"),
    ({**MINIMAL, "topology": {"azs": ["az-a"], "max_azs": 8}}, "topology.max_azs"),
])
def test_bad_fields_are_named(data, field):
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    assert exc.value.field == field and exc.value.exit_code == 2


def test_forget_time_defaults_to_three_evaluation_windows():
    from azprobe.controller.collect import Collector
    from azprobe.controller.main import Controller

    assert parse_config(MINIMAL).agents.forget_after_s is None
    ctl = Controller(parse_config({**MINIMAL, "controller": {"evaluation_window_s": 4.0}}))
    assert isinstance(ctl.collector, Collector) and ctl.collector.identities.forget_after_s == 12.0
    ctl = Controller(parse_config({**MINIMAL, "agents": {**MINIMAL["agents"], "forget_after_s": 60}}))
    assert ctl.collector.identities.forget_after_s == 60.0


def test_cli_exits_2_with_one_line(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[agents]\nstatic = ["http://198.18.1.2:9740"]\n[safety]\nstale_after_s = -1\n')
    out = subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "controller", "--config", str(config)],
                         cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert out.stderr.startswith("azprobe: safety.stale_after_s:")


def test_topology_azs_is_required_exit_2_naming_the_fix(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[agents]\nstatic = ["http://198.18.1.2:9740"]\n')
    out = subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "controller", "--config", str(config)],
                         cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr.strip() == ('azprobe: topology.azs: is required (list your AZs, e.g. '
                                  'azs = ["az-a", "az-b", "az-c"] (docs/quorum.md))')


@pytest.mark.parametrize("controller, advertise", [
    ({}, ""),  # loopback listen: another host's standby would probe itself
    ({"listen": "0.0.0.0:9741"}, ""),
    ({"listen": "10.0.1.5:9741"}, "10.0.1.5:9741"),
    ({"listen": "0.0.0.0:9741", "advertise": "10.0.1.5:9741"}, "10.0.1.5:9741"),
    ({"advertise": "127.0.0.1:9800"}, "127.0.0.1:9800"),  # explicit: the operator's call
])
def test_advertised_address_for_the_leader_probe(controller, advertise):
    assert parse_config({**MINIMAL, "controller": controller}).controller.advertise == advertise


def test_advertise_must_name_a_host():
    with pytest.raises(ConfigError) as exc:
        parse_config({**MINIMAL, "controller": {"advertise": "0.0.0.0:9741"}})
    assert exc.value.field == "controller.advertise"


def _controller_log(caplog, tmp_path, agents: dict) -> str:
    from azprobe.controller.main import Controller

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="azprobe.controller"):
        Controller(parse_config({**MINIMAL, "consul": {"address": "http://127.0.0.1:1"}, "agents": agents}))
    return caplog.text


def test_catalog_discovery_with_a_token_warns_at_start_that_every_registration_gets_it(caplog, tmp_path):
    token = write_secret(tmp_path / "agent-token", "s3cret\n")
    text = _controller_log(caplog, tmp_path, {"discover": "consul", "token_file": str(token)})
    assert "the agents' token goes over plain HTTP to every catalog registration of service 'azprobe-agent'" in text
    assert "s3cret" not in text
    for quiet in ({"discover": "consul"}, {"static": ["http://198.18.1.2:9740"], "token_file": str(token)}):
        assert "catalog registration" not in _controller_log(caplog, tmp_path, quiet)


def test_agents_token_file_of_mode_0644_is_refused_at_start(tmp_path):
    token = write_secret(tmp_path / "agent-token", "s3cret\n")
    token.chmod(0o644)
    config = tmp_path / "c.toml"
    config.write_text(f'[agents]\ndiscover = "consul"\ntoken_file = "{token}"\n[topology]\nazs = ["az-a"]\n')
    out = subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "controller", "--config", str(config)],
                         cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr.strip() == (f"azprobe: agents.token_file: {token} has mode 0644: other users may read or "
                                  f"write it (chmod 600 {token})")
