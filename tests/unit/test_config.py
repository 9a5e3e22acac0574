import pytest

from azprobe.config import Section, load_toml, parse_host_port, parse_topology
from azprobe.errors import ConfigError


def test_unknown_key_names_the_field():
    s = Section({"interval_s": 1, "intervl": 2}, "agent")
    s.number("interval_s", 1.0)
    with pytest.raises(ConfigError, match=r"agent\.intervl: unknown key") as exc:
        s.reject_unknown()
    assert exc.value.exit_code == 2


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_toml(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[agent\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(bad)


def test_topology_rejects_bad_cidr_and_overlap():
    with pytest.raises(ConfigError, match=r"topology\.az-a: bad CIDR"):
        parse_topology(Section({"az-a": ["198.18.0.0/33"]}, "topology"))
    with pytest.raises(ConfigError, match="overlaps"):
        parse_topology(Section({"az-a": ["198.18.0.0/16"], "az-b": ["198.18.1.0/24"]}, "topology"))
    topo = parse_topology(Section({"az-a": ["198.18.1.0/24", "2001:2::/64"], "az-b": ["198.18.2.0/24"]}, "topology"))
    assert [str(n) for n in topo["az-a"]] == ["198.18.1.0/24", "2001:2::/64"]


def test_host_port():
    assert parse_host_port("127.0.0.1:9740", "x") == ("127.0.0.1", 9740)
    assert parse_host_port("[::1]:80", "x") == ("::1", 80)
    with pytest.raises(ConfigError):
        parse_host_port("nope", "agent.listen")
