"""The sock_diag fallback's pure parts: address -> AZ, and samples -> cumulative counters."""

import pytest

from azprobe import bpf
from azprobe.agent.config import parse_agent_config
import ipaddress

from azprobe.agent.lpm import AzRegistry, address_key, trie_entries
from azprobe.agent.sockdiag import (TCP_CA_LOSS, TCP_ESTABLISHED, TCP_LISTEN, TCP_SYN_SENT, TCP_TIME_WAIT,
                                    AzLookup, SampleTracker, SocketSample, SockDiagCollector)
from azprobe.contracts.sketch import bucket_index
from azprobe.contracts.window import Utilisation, Window, WindowError, parse_window
from azprobe.errors import ConfigError

MAX_AZ = bpf.constant("MAX_AZ")
A, B = "10.0.1.5", "10.0.2.7"


def _topology():
    """(trie entries, AZ ids) of a small two-AZ topology, as the agent builds them."""
    topology = parse_agent_config({"node": {"az": "az-a"}, "topology": {
        "az-a": ["10.0.1.0/24"], "az-b": ["10.0.2.0/24", "2001:db8::/32"]}}).topology
    ids = AzRegistry().assign(topology)
    return trie_entries(topology, ids), ids


@pytest.fixture
def lookup():
    entries, ids = _topology()
    return AzLookup(entries, ids["az-a"]), ids


def test_lookup_longest_prefix_v4_v6_and_unknowns(lookup):
    lk, ids = lookup
    assert lk.az_of(A) == ids["az-a"]
    assert lk.az_of("::ffff:" + B) == ids["az-b"]
    assert lk.az_of("2001:db8::1") == ids["az-b"]
    assert lk.az_of("192.0.2.1") is None
    assert lk.path_of("192.0.2.1", "192.0.2.2") == ids["az-a"] * MAX_AZ + bpf.constant("AZ_OTHER")


def _sock(cookie, state, *, sport=40000, dport=80, rtt=0, retrans=0, ca=0, src=A, dst=B):
    return SocketSample(cookie=cookie, state=state, src=src, dst=dst, sport=sport, dport=dport,
                        srtt_us=rtt, total_retrans=retrans, ca_state=ca)


def test_samples_to_counters(lookup):
    lk, ids = lookup
    path = ids["az-a"] * MAX_AZ + ids["az-b"]
    t = SampleTracker()
    listener = _sock(9, TCP_LISTEN, sport=8080, dport=0, dst="0.0.0.0")
    t.update([listener, _sock(1, TCP_SYN_SENT), _sock(2, TCP_ESTABLISHED, rtt=900),
              _sock(3, TCP_SYN_SENT, sport=40003)], lk)
    # 1 established (and retransmitted twice, then entered Loss); 3 vanished in SYN_SENT;
    # 4 came and went between samples (TIME_WAIT); 5 is an accepted socket of the listener.
    t.update([listener, _sock(1, TCP_ESTABLISHED, rtt=1500, retrans=2, ca=TCP_CA_LOSS),
              _sock(2, TCP_ESTABLISHED, rtt=900), _sock(4, TCP_TIME_WAIT, sport=40004),
              _sock(5, TCP_ESTABLISHED, sport=8080, dport=50000, rtt=700)], lk)
    c = t.counters[path]
    assert (c["conn_attempts"], c["conn_ok"], c["conn_timeout"]) == (4, 3, 1)
    assert (c["retrans"], c["syn_retrans"], c["rto"]) == (2, 0, 1)
    assert t.rtt[path] == {bucket_index(900): 2, bucket_index(1500): 1}


def test_node_addresses_keep_only_this_nodes_sockets():
    """`[node] addresses` for the sampler: another node's sockets (a lab namespace, a
    container sharing the host's view) are not this node's vantage point."""
    entries, ids = _topology()
    other = "10.0.1.9"
    sockets = [_sock(1, TCP_SYN_SENT), _sock(2, TCP_SYN_SENT, src=other), _sock(3, TCP_SYN_SENT, src="::ffff:" + A)]
    collector = SockDiagCollector(dump=lambda known: list(sockets))
    collector.set_topology(entries, ids["az-a"])
    collector.set_node_addresses([address_key(ipaddress.ip_address(A))])
    path = ids["az-a"] * MAX_AZ + ids["az-b"]
    assert collector.snapshot().counters[path]["conn_attempts"] == 2  # sockets 1 and 3 (v4-mapped), not 2
    collector.set_node_addresses([])  # empty: every socket is this node's
    sockets[:] = [_sock(4, TCP_SYN_SENT, src=other)]
    assert collector.snapshot().counters[path]["conn_attempts"] == 3


def test_window_source_is_optional_and_bounded():
    w = Window(node="n", az="az-a", boot_id="b", seq=1, start=1.0, end=2.0, util=Utilisation(0.1, 0.2), paths=[],
               source="sockdiag")
    assert parse_window(w.to_json()).source == "sockdiag"
    doc = w.to_json()
    del doc["source"]
    assert parse_window(doc).source == "bpf"
    doc["source"] = "x" * 100
    with pytest.raises(WindowError, match="source"):
        parse_window(doc)


def test_collector_setting_is_checked():
    base = {"node": {"az": "az-a"}, "topology": {"az-a": ["10.0.1.0/24"]}}
    assert parse_agent_config(base).collector == "auto"
    assert parse_agent_config({**base, "agent": {"collector": "sockdiag"}}).collector == "sockdiag"
    with pytest.raises(ConfigError, match="collector"):
        parse_agent_config({**base, "agent": {"collector": "ebpf"}})


def test_doctor_names_the_collector_and_why():
    from azprobe.commands.doctor import check_collector, fail, ok

    good = [ok("btf", "present")]
    bad = good + [fail("bcc.compile", "cannot load BPF program empty.bpf.c: boom", "install headers")]
    assert check_collector(good).detail.startswith("bpf (auto)")
    fallback = check_collector(bad)
    assert fallback.status == "warn" and "fallback, because bcc.compile: cannot load" in fallback.detail
    assert check_collector(bad, "bpf").failed
    assert check_collector(good, "sockdiag").detail.startswith("sockdiag (configured)")
