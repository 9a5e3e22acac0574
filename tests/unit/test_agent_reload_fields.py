"""SIGHUP on the agent: the node's identity, its listener, ring and TLS paths need a
restart and keep their running value (one warning names each that changed); the rest,
the token file's token included, is applied."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from azprobe.agent.config import RESTART_FIELDS, load_agent_config, running_config
from azprobe.agent.main import Agent
from azprobe.errors import ConfigError
from tests.helpers import write_secret


def agent_toml(tmp_path: Path, *, name: str = "node-a1", az: str = "az-a", token: str = "tok-old-1234567890",
               listen: str = "127.0.0.1:9740", ring_size: int = 300, extra_az: str = 'az-b = ["10.0.0.0/8"]') -> Path:
    write_secret(tmp_path / "tok", token + "\n")
    path = tmp_path / "agent.toml"
    path.write_text(f'[node]\nname = "{name}"\naz = "{az}"\n'
                    f'[agent]\nlisten = "{listen}"\nring_size = {ring_size}\ntoken_file = "{tmp_path / "tok"}"\n'
                    f'[topology]\naz-a = ["127.0.0.0/8"]\n{extra_az}\n')
    return path


class _TrieProbe:
    """What reload() touches of a probe: the node's addresses and the LPM trie."""

    def __init__(self) -> None:
        self.local_az_ids: list[int] = []

    def set_node_addresses(self, keys) -> None:
        pass

    def set_topology(self, entries, local_az_id: int) -> None:
        self.local_az_ids.append(local_az_id)


def test_identity_and_listener_are_kept_and_named_in_one_warning(tmp_path):
    old = load_agent_config(agent_toml(tmp_path))
    new = load_agent_config(agent_toml(tmp_path, name="node-a9", az="az-b", listen="127.0.0.1:9741",
                                       token="tok-new-0987654321"))
    config, warning = running_config(old, new)
    assert (config.node, config.az, config.listen) == ("node-a1", "az-a", ("127.0.0.1", 9740))
    assert config.token == "tok-new-0987654321"  # applied: rotation needs no restart
    assert warning == ("reload: node.name changed from 'node-a1' to 'node-a9', node.az changed from 'az-a' to "
                       "'az-b', agent.listen changed from '127.0.0.1:9740' to '127.0.0.1:9741': need a restart, "
                       "running on with the old values")


def test_one_changed_field_says_the_value_it_runs_on_with(tmp_path):
    old = load_agent_config(agent_toml(tmp_path))
    config, warning = running_config(old, load_agent_config(agent_toml(tmp_path, name="node-a9")))
    assert config.node == "node-a1"
    assert warning == ("reload: node.name changed from 'node-a1' to 'node-a9': needs a restart, "
                       "running on with 'node-a1'")


def test_nothing_to_restart_is_no_warning_and_the_rest_applies(tmp_path):
    old = load_agent_config(agent_toml(tmp_path))
    new = load_agent_config(agent_toml(tmp_path, extra_az='az-b = ["10.0.0.0/8"]\naz-c = ["192.0.2.0/24"]'))
    config, warning = running_config(old, new)
    assert warning == "" and sorted(config.topology) == ["az-a", "az-b", "az-c"]


def test_the_ring_size_needs_a_restart(tmp_path):
    old = load_agent_config(agent_toml(tmp_path))
    config, warning = running_config(old, load_agent_config(agent_toml(tmp_path, ring_size=10)))
    assert config.ring_size == 300 and warning.startswith("reload: agent.ring_size changed from 300 to 10")


def test_the_running_az_must_stay_in_the_topology(tmp_path):
    old = load_agent_config(agent_toml(tmp_path))
    # node.az moved to az-b and az-a dropped from [topology]: the running az-a has no prefixes
    path = agent_toml(tmp_path, az="az-b")
    path.write_text(path.read_text().replace('az-a = ["127.0.0.0/8"]\n', ""))
    new = load_agent_config(path)
    with pytest.raises(ConfigError) as err:
        running_config(old, new)
    assert err.value.field == "node.az" and "'az-a' is not an AZ of [topology]" in str(err.value)
    assert "restart the agent" in err.value.fix


def test_every_restart_field_is_a_config_attribute(tmp_path):
    config = load_agent_config(agent_toml(tmp_path))
    assert all(hasattr(config, attr) for attr in RESTART_FIELDS.values())


def test_agent_reload_keeps_the_identity_and_takes_the_token(tmp_path, caplog):
    path = agent_toml(tmp_path)
    probe = _TrieProbe()
    agent = Agent(load_agent_config(path), config_path=path, probe=probe)  # type: ignore[arg-type]
    agent._apply(agent.config)
    agent_toml(tmp_path, name="node-a9", az="az-b", token="tok-new-0987654321")
    with caplog.at_level(logging.INFO, logger="azprobe.agent"):
        assert agent.reload()
    assert (agent.config.node, agent.config.az) == ("node-a1", "az-a")
    assert agent.identity() == {"node": "node-a1", "az": "az-a", "boot_id": agent.boot_id}
    assert agent.config.token == "tok-new-0987654321"
    # the trie's local AZ is still the running one's id
    assert agent.registry.names[probe.local_az_ids[-1]] == agent.registry.names[probe.local_az_ids[0]] == "az-a"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["reload: node.name changed from 'node-a1' to 'node-a9', node.az changed from 'az-a' to "
                        "'az-b': need a restart, running on with the old values"]
    assert not any("tok-new" in r.getMessage() for r in caplog.records)  # no secret in the log


def test_a_reload_that_cannot_run_keeps_everything(tmp_path, caplog):
    path = agent_toml(tmp_path)
    agent = Agent(load_agent_config(path), config_path=path, probe=_TrieProbe())  # type: ignore[arg-type]
    agent._apply(agent.config)
    path.write_text(path.read_text().replace('az-a = ["127.0.0.0/8"]\n', "").replace('az = "az-a"', 'az = "az-b"'))
    write_secret(tmp_path / "tok", "tok-new-0987654321\n")
    with caplog.at_level(logging.ERROR, logger="azprobe.agent"):
        assert not agent.reload()
    assert agent.config.token == "tok-old-1234567890" and sorted(agent.config.topology) == ["az-a", "az-b"]
    assert any("keeping the old topology and token" in r.getMessage() for r in caplog.records)
