"""Listen port 0 and --address-file: the daemons' side of "children bind port 0 and report
the port they got" (azprobe/daemon/address_file.py)."""

from __future__ import annotations

import pytest

from azprobe.daemon.address_file import format_host_port, read_address_file, wait_for_address_file, write_address_file
from azprobe.agent.config import parse_agent_config
from azprobe.config import parse_host_port
from azprobe.controller.config import bound_advertise
from azprobe.errors import ConfigError


def test_round_trip_v4_and_v6(tmp_path):
    path = tmp_path / "addr"
    write_address_file(path, "127.0.0.1", 40123)
    assert path.read_text() == "127.0.0.1:40123\n"
    assert read_address_file(path) == ("127.0.0.1", 40123)
    write_address_file(path, "::1", 8080)
    assert path.read_text() == "[::1]:8080\n" and read_address_file(path) == ("::1", 8080)
    assert [p.name for p in tmp_path.iterdir()] == ["addr"]  # the temporary file was renamed away


def test_absent_or_empty_file_is_not_an_address(tmp_path):
    assert read_address_file(tmp_path / "nothing") is None
    (tmp_path / "empty").write_text("")
    assert read_address_file(tmp_path / "empty") is None


def test_a_port_zero_in_the_file_is_rejected(tmp_path):
    (tmp_path / "zero").write_text("127.0.0.1:0\n")
    with pytest.raises(ConfigError):
        read_address_file(tmp_path / "zero")


def test_waiting_stops_when_the_child_dies(tmp_path):
    assert wait_for_address_file(tmp_path / "never", alive=lambda: False, timeout_s=60) is None


def test_waiting_returns_the_written_address(tmp_path):
    write_address_file(tmp_path / "a", "127.0.0.1", 1234)
    assert wait_for_address_file(tmp_path / "a", alive=lambda: True, timeout_s=60) == ("127.0.0.1", 1234)


def test_port_zero_is_only_for_listen_addresses():
    assert parse_host_port("127.0.0.1:0", "agent.listen", listen=True) == ("127.0.0.1", 0)
    with pytest.raises(ConfigError, match="consul.address: '127.0.0.1:0' is not host:port"):
        parse_host_port("127.0.0.1:0", "consul.address")
    with pytest.raises(ConfigError):
        parse_host_port("127.0.0.1:65536", "agent.listen", listen=True)


def test_agent_config_accepts_listen_port_zero():
    config = parse_agent_config({"node": {"az": "az-a"}, "agent": {"listen": "127.0.0.1:0"},
                                 "topology": {"az-a": ["198.18.1.0/24"]}})
    assert config.listen == ("127.0.0.1", 0)


def test_controller_advertises_the_port_it_bound():
    assert bound_advertise("127.0.0.1:0", 41000) == "127.0.0.1:41000"
    assert bound_advertise("[::1]:0", 41000) == "[::1]:41000"
    assert bound_advertise("10.0.1.5:9741", 41000) == "10.0.1.5:9741"  # an explicit port stays
    assert bound_advertise("", 41000) == ""  # nothing advertised stays nothing


def test_format_host_port():
    assert format_host_port("127.0.0.1", 1) == "127.0.0.1:1"
    assert format_host_port("2001:2::1", 9740) == "[2001:2::1]:9740"
