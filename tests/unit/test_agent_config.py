import ipaddress

import pytest

from azprobe.agent.config import load_agent_config, parse_agent_config
from azprobe.agent.lpm import AzRegistry, address_key, trie_entries
from azprobe.errors import ConfigError

GOOD = {"node": {"name": "n1", "az": "az-a"}, "agent": {"listen": "127.0.0.1:9999", "interval_s": 0.5},
        "topology": {"az-a": ["198.18.1.0/24", "2001:2:0:1::/64"], "az-b": ["198.18.2.0/24"]}}


def test_good_config_and_defaults(tmp_path):
    cfg = parse_agent_config(GOOD)
    assert (cfg.node, cfg.az, cfg.listen, cfg.interval_s, cfg.ring_size) == ("n1", "az-a", ("127.0.0.1", 9999), 0.5, 300)
    f = tmp_path / "a.toml"
    f.write_text('[node]\naz = "az-b"\n[topology]\naz-b = ["10.0.0.0/8"]\n')
    cfg = load_agent_config(f)
    assert cfg.listen == ("0.0.0.0", 9740) and cfg.node
    assert cfg.rtt_sample_ticks == 4  # docs/probe.md "RTT sampling"
    assert parse_agent_config({**GOOD, "agent": {"rtt_sample_ticks": 1}}).rtt_sample_ticks == 1


def test_rtt_sample_ticks_error_names_the_choices():
    with pytest.raises(ConfigError, match="use one of 1, 2, 4, 8, 16, 32, 64"):
        parse_agent_config({**GOOD, "agent": {"rtt_sample_ticks": 6}})


@pytest.mark.parametrize("doc, field", [
    ({**GOOD, "extra": {}}, "extra"),
    ({**GOOD, "agent": {"intervl_s": 1}}, "agent.intervl_s"),
    ({**GOOD, "agent": {"interval_s": 0}}, "agent.interval_s"),
    ({**GOOD, "node": {"name": "n"}}, "node.az"),
    ({**GOOD, "node": {"az": "az-z"}}, "node.az"),
    ({**GOOD, "topology": {"az-a": ["198.18.1.0/33"]}}, "topology.az-a"),
    ({**GOOD, "topology": {"az-a": ["198.18.0.0/16"], "az-b": ["198.18.1.0/24"]}}, "topology.az-b"),
    ({**GOOD, "topology": {}}, "topology"),
    ({**GOOD, "agent": {"rtt_sample_ticks": 3}}, "agent.rtt_sample_ticks"),
    ({**GOOD, "agent": {"rtt_sample_ticks": 0}}, "agent.rtt_sample_ticks"),
    ({**GOOD, "agent": {"rtt_sample_ticks": 128}}, "agent.rtt_sample_ticks"),
    ({**GOOD, "agent": {"rtt_sample_ticks": "4"}}, "agent.rtt_sample_ticks"),
])
def test_bad_config_names_the_field(doc, field):
    with pytest.raises(ConfigError) as exc:
        parse_agent_config(doc)
    assert exc.value.field == field
    assert exc.value.exit_code == 2


def test_v4_maps_into_v6_and_ids_are_stable():
    reg = AzRegistry(max_az=4)
    assert reg.assign(["az-b", "az-a"]) == {"az-b": 2, "az-a": 1}
    assert reg.assign(["az-c", "az-a"]) == {"az-c": 3, "az-a": 1}  # az-b retired, not reused
    assert reg.name_of(0) == "other" and reg.name_of(2) == "az-b"
    with pytest.raises(ConfigError, match="more than 3 AZs"):
        reg.assign(["az-d"])
    topo = {"az-a": [ipaddress.ip_network("198.18.1.0/24"), ipaddress.ip_network("2001:2::/64")]}
    entries = trie_entries(topo, {"az-a": 1})
    assert [(e.prefixlen, e.addr.hex()) for e in entries] == [
        (120, "00000000000000000000ffffc6120100"), (64, "20010002000000000000000000000000")]
    assert address_key(ipaddress.ip_address("1.2.3.4")) == bytes(10) + b"\xff\xff\x01\x02\x03\x04"


def test_node_addresses_default_empty_and_parsed():
    assert parse_agent_config(GOOD).addresses == ()
    doc = {**GOOD, "node": {**GOOD["node"], "addresses": ["198.18.1.130", "2001:2:0:11::2", "::ffff:198.18.1.130"]}}
    cfg = parse_agent_config(doc)
    assert cfg.addresses == (ipaddress.ip_address("198.18.1.130"), ipaddress.ip_address("2001:2:0:11::2"))


@pytest.mark.parametrize("addresses", [["198.18.1.0/24"], ["not-an-ip"], ["0.0.0.0"], ["ff02::1"], "198.18.1.1",
                                       [1], [f"10.0.0.{i}" for i in range(65)]])
def test_bad_node_addresses_name_the_field(addresses):
    with pytest.raises(ConfigError) as exc:
        parse_agent_config({**GOOD, "node": {**GOOD["node"], "addresses": addresses}})
    assert exc.value.field == "node.addresses" and exc.value.exit_code == 2
    assert "\n" not in str(exc.value)


def test_bad_node_addresses_exit_2_with_one_line(tmp_path):
    import subprocess
    import sys

    f = tmp_path / "a.toml"
    f.write_text('[node]\naz = "az-a"\naddresses = ["198.18.1.999"]\n[topology]\naz-a = ["198.18.1.0/24"]\n')
    proc = subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "agent", "--config", str(f)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "azprobe: node.addresses: '198.18.1.999' is not an IP address "
        "(list this node's own addresses, e.g. [\"10.0.1.5\", \"fd00::5\"])"]


def test_a_loose_token_file_is_refused_naming_the_fix(tmp_path):
    token = tmp_path / "agent-token"
    token.write_text("s3cret\n")
    token.chmod(0o644)
    with pytest.raises(ConfigError) as exc:
        parse_agent_config({**GOOD, "agent": {"token_file": str(token)}})
    assert exc.value.field == "agent.token_file" and exc.value.fix == f"chmod 600 {token}"
    token.chmod(0o600)
    assert parse_agent_config({**GOOD, "agent": {"token_file": str(token)}}).token == "s3cret"
