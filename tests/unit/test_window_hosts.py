"""The window contract's optional `hosts` section (per destination address of a path):
the same windows in both encodings, bounded and validated like the rest (a bad host
refuses the window whole), and the controller's ingest keeps accepting it."""

from __future__ import annotations

import json
import re

import jsonschema
import msgspec
import pytest

from azprobe.clients.transport import MAX_BODY_BYTES
from azprobe.contracts.window import (HOST_RTT_BUCKETS, HOSTS_SCHEMA_PATH, MAX_CONNECT_CARRY, MAX_COUNT, MAX_HOSTS, HostStats, PathStats, Utilisation, Window,
                                      WindowError, host_rtt_bucket, parse_window)
from azprobe.contracts.windowcodec import COMPACT_TYPE, JSON_TYPE, decode_page, encode_compact_page, encode_page
from azprobe.controller.collect import AgentTarget, Collector
from tests.controller_harness import topology


def _host(addr: str, dst: str = "az-b", **kw) -> HostStats:
    fields = dict(connects=20, failures=2, retrans=5, rto=1, rtt_buckets=[0, 3, 9, 0, 0, 4, 0, 0])
    fields.update(kw)
    return HostStats("az-a", dst, addr, **fields)


def _window(seq: int = 1, hosts: list[HostStats] | None = None, hosts_dropped: int = 0) -> Window:
    return Window(node="n1", az="az-a", boot_id="boot", seq=seq, start=100.0 + seq, end=101.0 + seq,
                  util=Utilisation(0.25, 0.5), paths=[PathStats("az-a", "az-b", conn_attempts=40, conn_ok=38)],
                  hosts=hosts if hosts is not None else [_host("198.18.2.2"), _host("198.18.2.6", rto=9),
                                                         _host("2001:2:0:120::102")],
                  hosts_dropped=hosts_dropped)


def _decoded(body: bytes, media: str) -> list[dict]:
    return [w.to_json() for w in decode_page(body, media, max_bytes=MAX_BODY_BYTES).parse_all()]


def test_both_encodings_carry_the_same_hosts():
    windows = [_window(1), _window(2, hosts=[], hosts_dropped=17), _window(3, hosts=[])]
    expected = [w.to_json() for w in windows]
    assert expected[0]["hosts"][1] == {"src": "az-a", "dst": "az-b", "addr": "198.18.2.6", "connects": 20,
                                       "failures": 2, "retrans": 5, "rto": 9,
                                       "rtt_buckets": [0, 3, 9, 0, 0, 4, 0, 0]}
    assert expected[1]["hosts_dropped"] == 17 and "hosts" not in expected[2]  # optional: absent when empty
    for media in (COMPACT_TYPE, JSON_TYPE):
        assert _decoded(encode_page("n1", "az-a", "boot", windows, media), media) == expected
    assert parse_window(expected[0]).hosts[2].addr == "2001:2:0:120::102"


def test_a_window_of_an_agent_without_hosts_still_reads():
    doc = _window(hosts=[]).to_json()
    assert "hosts" not in doc and parse_window(doc).hosts == [] and parse_window(doc).hosts_dropped == 0
    # an older agent's compact window ends at `source`
    old = [1, "n", "az-a", "boot", 7, 1.0, 2.0, 0.5, 0.5, 0, [], "bpf"]
    page = encode_compact_page("n", "az-a", "boot", [msgspec.msgpack.encode(old)])
    assert decode_page(page, COMPACT_TYPE, max_bytes=MAX_BODY_BYTES).windows[0].parse().hosts == []


BAD_HOSTS = [
    ({"addr": "198.18.2"}, "hosts[0].addr"),
    ({"addr": "2001:2:0:120:0:0:0:102"}, "hosts[0].addr"),  # not canonical: two spellings would be two hosts
    ({"addr": "::ffff:198.18.2.6x"}, "hosts[0].addr"),
    ({"connects": -1}, "hosts[0].connects"),
    ({"retrans": 2**32 + 1}, "hosts[0].retrans"),
    ({"connects": 0, "failures": 70_000}, "hosts[0].failures"),  # failures never attempted
    ({"rtt_buckets": [1, 2, 3]}, "hosts[0].rtt_buckets"),
    ({"rtt_buckets": [0] * 7 + [-1]}, "hosts[0].rtt_buckets"),
]


@pytest.mark.parametrize("change, field", BAD_HOSTS)
@pytest.mark.parametrize("media", [JSON_TYPE, COMPACT_TYPE])
def test_a_bad_host_refuses_the_window_whole_naming_the_field(change, field, media):
    good = _window(1)
    bad = _window(2, hosts=[_host("198.18.2.2")])
    if media == JSON_TYPE:
        doc = json.loads(encode_page("n1", "az-a", "boot", [good, bad], JSON_TYPE))
        doc["windows"][1]["hosts"][0].update(change)
        body = json.dumps(doc).encode()
    else:
        raw = msgspec.msgpack.decode(encode_page("n1", "az-a", "boot", [good, bad], COMPACT_TYPE))
        window = raw[3][1]
        order = ["src", "dst", "addr", "connects", "failures", "retrans", "rto", "rtt_buckets"]
        for key, value in change.items():
            window[12][0][order.index(key)] = value
        body = encode_compact_page("n1", "az-a", "boot", [msgspec.msgpack.encode(w) for w in (raw[3][0], window)])
    page = decode_page(body, media, max_bytes=MAX_BODY_BYTES)
    assert page.windows[0].parse().seq == 1  # one bad window, not a lost page
    with pytest.raises(WindowError, match="^" + re.escape(field)):
        page.windows[1].parse()


@pytest.mark.parametrize("media", [JSON_TYPE, COMPACT_TYPE])
def test_too_many_or_repeated_hosts_refuse_the_window(media):
    many = [_host(f"198.18.{i // 250}.{i % 250 + 1}") for i in range(MAX_HOSTS + 1)]
    twice = [_host("198.18.2.2"), _host("198.18.2.2")]
    for hosts, field in ((many, "hosts"), (twice, "hosts: a (src, dst, addr)")):
        body = encode_page("n1", "az-a", "boot", [_window(1, hosts=hosts)], media)
        with pytest.raises(WindowError, match="^" + re.escape(field)):
            decode_page(body, media, max_bytes=10 * MAX_BODY_BYTES).windows[0].parse()
    doc = _window(1).to_json()
    doc["hosts_dropped"] = -1
    with pytest.raises(WindowError, match="^hosts_dropped"):
        parse_window(doc)
    doc = _window(1).to_json()
    doc["hosts"] = {"198.18.2.2": {}}
    with pytest.raises(WindowError, match="^hosts: expected a list"):
        parse_window(doc)


def test_rtt_buckets_grow_by_four_from_256_us():
    assert [host_rtt_bucket(us) for us in (0, 255, 256, 1023, 1024, 200_000, 262_144, 10**9)] == \
        [0, 0, 1, 1, 2, 5, 6, HOST_RTT_BUCKETS - 1]


@pytest.mark.parametrize("media", [JSON_TYPE, COMPACT_TYPE])
def test_the_controller_ingests_windows_with_hosts_and_ignores_them(media):
    collector = Collector(evaluation_window_s=1e9, pull_timeout_s=0.5, stale_after_s=3.0, clock=lambda: 1000.0,
                          topology=topology())
    collector.set_targets([AgentTarget("http://agent-1")])
    cursor = collector.cursors["http://agent-1"]
    body = encode_page("n1", "az-a", "boot", [_window(1), _window(2, hosts_dropped=3)], media)
    assert collector.ingest(cursor, decode_page(body, media, max_bytes=MAX_BODY_BYTES), 1000.0) == 2
    assert collector.counters.windows_garbage == 0 and cursor.last_seq == 2
    assert sum(p.conn_attempts for w in collector.store.windows() for p in w.paths) == 80


def test_the_json_schema_states_the_same_bounds():
    schema = json.loads(HOSTS_SCHEMA_PATH.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    validator.validate(_window(1, hosts_dropped=2).to_json())
    hosts = schema["properties"]["hosts"]
    assert hosts["maxItems"] == MAX_HOSTS and MAX_CONNECT_CARRY == 65_536
    assert hosts["items"]["properties"]["rtt_buckets"]["maxItems"] == HOST_RTT_BUCKETS
    assert schema["$defs"]["count"]["maximum"] == MAX_COUNT
    for change, _ in BAD_HOSTS:
        doc = _window(1).to_json()
        doc["hosts"][0].update(change)
        schema_ok = validator.is_valid(doc)
        with pytest.raises(WindowError):
            parse_window(doc)
        # what the schema lets through, parse_window states in its docstring (canonical, relation)
        assert not schema_ok or "addr" in change or "failures" in change, change
