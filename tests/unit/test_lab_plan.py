"""The lab's address plan, agent config and nft scripts: pure logic, no kernel."""

from __future__ import annotations

import ipaddress
import itertools
import tomllib

import pytest

from azprobe.config import Section, parse_topology
from azprobe.errors import ConfigError
from azprobe.dev.lab.agentconfig import render_agent_config
from azprobe.dev.lab.faults import Fault, base_ruleset, fault_rules, queue_number
from azprobe.dev.lab.netns import parse_proc_net_counters
from azprobe.dev.lab.topology import LAB_SLOTS, V4_SPACE, V6_SPACE, az_names, plan_lab, validate_name


def _all_addresses(plan):
    for z in plan.zones:
        for link in (z.server_link, z.client_link):
            yield from (a.ip for a in (link.router_v4, link.host_v4, link.router_v6, link.host_v6) if a)


def test_every_address_is_inside_the_benchmarking_ranges_and_its_az():
    plan = plan_lab("azp", 5, 4, ipv6=True)
    for ip in _all_addresses(plan):
        assert ip in (V4_SPACE if ip.version == 4 else V6_SPACE)
    for z in plan.zones:
        nets = [ipaddress.ip_network(c) for c in z.cidrs]
        for host in (z.server_v4, z.server_v6, z.client_v4, z.client_v6):
            assert any(ipaddress.ip_address(host) in n for n in nets), (z.az, host)


def test_two_slots_never_share_an_address_or_cidr():
    plans = [plan_lab("azp", i, 15, ipv6=True) for i in (0, 1, LAB_SLOTS - 1)]
    for a, b in itertools.combinations(plans, 2):
        assert not set(_all_addresses(a)) & set(_all_addresses(b))
        for ca, cb in itertools.product(a.topology().values(), b.topology().values()):
            for x, y in itertools.product(map(ipaddress.ip_network, ca), map(ipaddress.ip_network, cb)):
                assert x.version != y.version or not x.overlaps(y)


def test_agent_config_parses_with_the_agents_own_topology_parser():
    plan = plan_lab("t1", 3, 3, ipv6=True)
    doc = tomllib.loads(render_agent_config(plan))
    assert doc["node"]["az"] == "az-a"
    topo = parse_topology(Section(doc["topology"], "topology"))  # rejects overlaps itself
    assert sorted(topo) == ["az-a", "az-b", "az-c"]
    assert ipaddress.ip_address(plan.zone("az-a").client_v4) in topo["az-a"][0]
    assert doc["agent"]["listen"] == "127.0.0.1:9743"


def test_names_prefix_every_namespace():
    plan = plan_lab("lab7", 0, 2, ipv6=False)
    assert plan.namespaces == ["lab7-router", "lab7-srv-az-a", "lab7-srv-az-b", "lab7-cli-az-a", "lab7-cli-az-b"]
    assert plan.nft_table == "lab7"


@pytest.mark.parametrize("name", ["", "Azp", "a-b", "1ab", "abcdefghijk"])
def test_bad_names_are_rejected_naming_the_field(name):
    with pytest.raises(ConfigError) as err:
        validate_name(name)
    assert err.value.field == "name"


@pytest.mark.parametrize("count", [0, 16, True, "3"])
def test_bad_az_counts_are_rejected(count):
    with pytest.raises(ConfigError) as err:
        az_names(count)
    assert err.value.field == "azs"


def test_unknown_az_lists_the_known_ones():
    with pytest.raises(ConfigError) as err:
        plan_lab("azp", 0, 3, False).zone("az-x")
    assert err.value.field == "az" and "az-a, az-b, az-c" in str(err.value)


def test_fault_validation():
    with pytest.raises(ConfigError, match="loss-pct"):
        Fault(loss_pct=101)
    with pytest.raises(ConfigError, match="delay-ms"):
        Fault(delay_ms=float("nan"))
    with pytest.raises(ConfigError, match="no fault"):
        Fault()
    with pytest.raises(ConfigError, match="blackhole"):
        Fault(blackhole=True, delay_ms=5)
    assert Fault(delay_ms=50, loss_pct=0.5).describe() == "loss 0.5%, delay 50 ms"


def test_fault_rules_order_and_counters():
    plan = plan_lab("azp", 0, 3, False)
    script = fault_rules(plan, plan.zone("az-b"), Fault(refuse=True, syn_loss_pct=2.5, loss_pct=1, delay_ms=10))
    lines = script.splitlines()
    assert lines[0] == "flush chain inet azp fault_az_b"
    kinds = [line.split('counter name "')[1].split('"')[0] for line in lines[1:]]
    assert kinds == ["az_b_refuse", "az_b_syn_loss", "az_b_loss", "az_b_delay"]
    assert "numgen random mod 10000 < 250" in lines[2] and "tcp flags & (syn | ack) == syn" in lines[2]
    assert fault_rules(plan, plan.zone("az-b"), None) == "flush chain inet azp fault_az_b\n"


def test_base_ruleset_matches_each_az_by_its_server_links_and_each_server_by_its_own():
    plan = plan_lab("azp", 0, 2, False, servers_per_az=2)
    text = base_ruleset(plan)
    assert 'oifname "s-az-a*" jump to_az_a' in text and 'oifname "s-az-b*" jump to_az_b' in text
    assert "counter az_b_syn_loss" in text
    assert 'oifname "s-az-b-1" jump to_host_az_b_1' in text and 'oifname "s-az-b" jump to_host_az_b_0' in text
    # host chains come after the AZ chains: an AZ fault and a host fault both apply
    assert text.index("jump to_az_b\n") < text.index("jump to_host_az_b_0")
    assert "counter host_az_b_1_delay" in text


def test_servers_have_their_own_addresses_inside_their_az_and_faults_aim_at_one():
    plan = plan_lab("azp", 2, 3, ipv6=True, nodes_per_az=2, servers_per_az=3)
    zone = plan.zone("az-b")
    assert [s.ns for s in zone.servers] == ["azp-srv-az-b", "azp-srv-az-b-1", "azp-srv-az-b-2"]
    assert plan.servers_per_az == 3 and len(plan.servers) == 9
    addresses = [a for s in plan.servers for a in s.addresses] + [a for n in plan.client_nodes for a in n.addresses]
    assert len(set(addresses)) == len(addresses) == 30
    topo = parse_topology(Section(tomllib.loads(render_agent_config(plan))["topology"], "topology"))
    for s in plan.servers:
        assert all(ipaddress.ip_address(a) in V4_SPACE or ipaddress.ip_address(a) in V6_SPACE for a in s.addresses)
        # the agents' topology maps every server to its own AZ
        for a in s.addresses:
            assert [az for az, nets in topo.items() if any(ipaddress.ip_address(a) in n for n in nets)] == [s.az]
        assert s.link.router_ifname.startswith(zone.server_ifname_prefix.replace("az-b", s.az))
        assert len(s.link.router_ifname) <= 15
    assert set(plan.namespaces) >= {s.ns for s in plan.servers}
    # server 0 keeps the addresses of a one-server lab
    assert plan_lab("azp", 2, 3, ipv6=True).zone("az-b").servers[0].addresses == zone.servers[0].addresses
    second = zone.servers[1]
    assert plan.server(second.v4) == second and plan.server(second.v6.upper()) == second
    with pytest.raises(ConfigError) as err:
        plan.server("198.18.0.1")
    assert err.value.field == "host" and zone.servers[1].v4 in str(err.value)
    with pytest.raises(ConfigError) as err:
        plan.server("az-b")
    assert err.value.field == "host"
    script = fault_rules(plan, second, Fault(loss_pct=5, delay_ms=200))
    assert script.splitlines()[0] == "flush chain inet azp fault_host_az_b_1"
    assert 'counter name "host_az_b_1_loss" drop' in script and 'counter name "host_az_b_1_delay"' in script
    with pytest.raises(ConfigError) as err:
        plan_lab("azp", 0, 3, False, servers_per_az=33)
    assert err.value.field == "servers-per-az"


def test_every_fault_point_has_its_own_delay_queue():
    plan = plan_lab("azp", 0, 15, False, servers_per_az=32)
    numbers = [queue_number(z, up) for z in plan.zones for up in (False, True)]
    numbers += [queue_number(s) for s in plan.servers]
    assert len(set(numbers)) == len(numbers) and max(numbers) < 65536


def test_proc_net_counters_are_named_like_nstat():
    text = ("TcpExt: SyncookiesSent TCPTimeouts\nTcpExt: 0 7\n"
            "Tcp: RtoAlgorithm RetransSegs\nTcp: 1 12\n")
    assert parse_proc_net_counters(text) == {"TcpExtSyncookiesSent": 0, "TcpExtTCPTimeouts": 7,
                                             "TcpRtoAlgorithm": 1, "TcpRetransSegs": 12}


def test_client_nodes_have_their_own_addresses_inside_their_az():
    plan = plan_lab("azp", 2, 3, ipv6=True, nodes_per_az=4)
    nodes = plan.client_nodes
    assert len(nodes) == 12 and plan.nodes_per_az == 4
    assert [n.ns for n in plan.zone("az-b").clients] == ["azp-cli-az-b", "azp-cli-az-b-1", "azp-cli-az-b-2",
                                                          "azp-cli-az-b-3"]
    addresses = [a for n in nodes for a in n.addresses]
    assert len(set(addresses)) == len(addresses) == 24
    for n in nodes:
        nets = [ipaddress.ip_network(c) for c in plan.zone(n.az).cidrs]
        assert all(any(ipaddress.ip_address(a) in net for net in nets) for a in n.addresses), n
        assert n.link.router_ifname.startswith(plan.zone(n.az).client_ifname_prefix)
        assert len(n.link.router_ifname) <= 15
    # node 0 keeps the addresses of a one-node lab
    one = plan_lab("azp", 2, 3, ipv6=True)
    assert plan.zone("az-a").clients[0].addresses == one.zone("az-a").clients[0].addresses
    with pytest.raises(ConfigError) as err:
        plan_lab("azp", 0, 3, False, nodes_per_az=17)
    assert err.value.field == "nodes-per-az"
    with pytest.raises(ConfigError, match="no client node 4"):
        plan.node("az-a", 4)


def test_node_agent_config_lists_the_nodes_addresses_and_a_port_of_its_own():
    from azprobe.agent.config import parse_agent_config
    from azprobe.dev.lab.agentconfig import render_node_agent_config

    plans = [plan_lab("azp", i, 15, ipv6=True, nodes_per_az=16) for i in (0, 1, LAB_SLOTS - 1)]
    ports = set()
    for plan in plans:
        for node in plan.client_nodes:
            cfg = parse_agent_config(tomllib.loads(render_node_agent_config(plan, node)))
            assert (cfg.node, cfg.az) == (node.name, node.az)
            assert [str(a) for a in cfg.addresses] == node.addresses
            ports.add(cfg.listen[1])
    assert len(ports) == sum(len(p.client_nodes) for p in plans) and max(ports) < 65536


def test_uplink_faults_match_every_client_link_of_the_az():
    plan = plan_lab("azp", 0, 2, False, nodes_per_az=3)
    text = base_ruleset(plan)
    assert 'iifname "c-az-b*" jump to_from_az_b' in text and "counter from_az_b_loss" in text
    # uplink chains come first: a packet both faults match meets its uplink's fault first
    assert text.index("jump to_from_az_a") < text.index('oifname "s-az-a*" jump to_az_a')
    script = fault_rules(plan, plan.zone("az-b"), Fault(loss_pct=5, delay_ms=200), uplink=True)
    assert script.splitlines()[0] == "flush chain inet azp fault_from_az_b"
    assert 'counter name "from_az_b_loss" drop' in script
