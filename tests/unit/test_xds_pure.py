"""The xDS server's pure parts: the stream state machines (what is sent when), the
snapshot versions, and the config loader's one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from azprobe.consumers.localities import plan_localities
from azprobe.consumers.xds import resources
from azprobe.consumers.xds.config import parse_xds_config
from azprobe.consumers.xds.snapshot import build_snapshot, chain_entries
from azprobe.consumers.xds.streams import DeltaStream, ProtocolError, SotwStream
from azprobe.errors import ConfigError
from tests import xds_harness as h
from tests.helpers import sample_weights_doc

EPS = {"backend": {"az-a": [("198.18.1.2", 80)], "az-b": [("198.18.2.2", 80)]}}


def snap(shares=None):
    doc = sample_weights_doc(1, shares) if shares else None
    return build_snapshot("global", EPS, doc, chain_entries(EPS))


def test_equal_inputs_give_equal_versions_and_a_share_change_a_new_one():
    assert snap().system_version == snap().system_version
    assert snap().system_version.startswith("equal-")
    a, b = snap({"az-a": 60, "az-b": 40}), snap({"az-a": 61, "az-b": 39})
    assert a.system_version != b.system_version
    assert a.entries(resources.LISTENER) == b.entries(resources.LISTENER)  # the chain is shared


def test_a_service_without_endpoints_has_no_assignment_rather_than_an_empty_one():
    s = build_snapshot("global", {"backend": {"az-a": []}}, None, chain_entries(["backend"]))
    assert dict(s.entries(resources.ENDPOINT)) == {}


def test_sotw_sends_a_version_once_whether_acked_or_nacked():
    st = SotwStream(resources.TYPES)
    st.on_request(h.sotw(h.CLA, ["backend"]))
    first = st.pending(snap())
    assert len(first) == 1
    out = st.on_request(h.sotw(h.CLA, ["backend"], nonce=first[0].nonce, error="bad"))
    assert out.nack == "bad"
    assert st.pending(snap()) == []  # not the rejected version again
    assert len(st.pending(snap({"az-a": 70, "az-b": 30}))) == 1  # the next change, once
    assert st.pending(snap({"az-a": 70, "az-b": 30})) == []


def test_sotw_ignores_a_stale_nonce_and_refuses_an_invented_one():
    st = SotwStream(resources.TYPES)
    st.on_request(h.sotw(h.CLA, ["backend"]))
    r1 = st.pending(snap())[0]
    st.on_request(h.sotw(h.CLA, ["backend", "x"], nonce=r1.nonce))
    r2 = st.pending(snap())[0]
    assert r2.nonce != r1.nonce
    assert st.on_request(h.sotw(h.CLA, [], nonce=r1.nonce)).stale
    with pytest.raises(ProtocolError) as exc:
        st.on_request(h.sotw(h.CLA, [], nonce="99"))
    assert exc.value.code == "INVALID_ARGUMENT"


def test_limits_on_types_and_names():
    with pytest.raises(ProtocolError, match="unknown type_url"):
        SotwStream(resources.TYPES).on_request(h.sotw("type.googleapis.com/x.Y"))
    with pytest.raises(ProtocolError) as exc:
        DeltaStream(resources.TYPES, max_names=10).on_request(h.delta(h.CLA, [str(i) for i in range(11)]))
    assert exc.value.code == "RESOURCE_EXHAUSTED"
    eds_only = SotwStream((resources.ENDPOINT,))
    with pytest.raises(ProtocolError):
        eds_only.on_request(h.sotw(h.LDS))


def test_delta_wildcard_removal_and_resubscription():
    st = DeltaStream(resources.TYPES)
    st.on_request(h.delta(h.CDS))
    r = [x.decode() for x in st.pending(snap())]
    assert [x.name for x in r[0].resources] == ["backend"]
    gone = build_snapshot("global", {}, None, chain_entries([]))
    r = [x.decode() for x in st.pending(gone)]
    assert list(r[0].removed_resources) == ["backend"] and not r[0].resources
    assert st.pending(gone) == []


def test_streams_owed_the_same_share_one_serialized_body_and_differ_only_in_the_nonce():
    shared = snap({"az-a": 60, "az-b": 40})
    a, b = DeltaStream(resources.TYPES), DeltaStream(resources.TYPES)
    a.on_request(h.delta(h.CLA, ["backend"]))
    b.on_request(h.delta(h.CLA, ["backend"]))
    b.on_request(h.delta(h.CLA, ["other"]))  # b also asked for a missing name: a different response
    (ra,), (rb,) = a.pending(shared), b.pending(shared)
    assert ra.body != rb.body
    c = DeltaStream(resources.TYPES)
    c.on_request(h.delta(h.CLA, ["backend"]))
    c.pending(snap())  # c is one response ahead: its nonce differs from a's
    (rc,) = c.pending(shared)
    assert rc.body is ra.body and rc.nonce != ra.nonce
    decoded = rc.decode()
    assert decoded.nonce == rc.nonce and decoded.system_version_info == shared.system_version
    assert [r.name for r in decoded.resources] == ["backend"]
    assert decoded.SerializeToString(deterministic=True) == rc.wire()  # the nonce field parses as appended
    sotw = SotwStream(resources.TYPES)
    sotw.on_request(h.sotw(h.CLA, ["backend"]))
    (rs,) = sotw.pending(shared)
    assert rs.decode().nonce == rs.nonce and len(rs.decode().resources) == 1


def test_the_shared_responses_of_a_snapshot_are_bounded_in_bytes():
    """Each distinct removed-names list is a response of its own: a client cycling invented
    names held 256 of them per snapshot, ~44 MiB."""
    from azprobe.consumers.xds.snapshot import MAX_ENCODED_BYTES

    shared, built = snap(), []

    def body(i: int) -> bytes:
        built.append(i)
        return bytes(1 << 20)

    for i in range(MAX_ENCODED_BYTES // (1 << 20) + 2):
        shared.encoded(("delta", i), lambda i=i: body(i))
    assert shared.encoded(("delta", 0), lambda: body(0)) and built.count(0) == 2  # dropped, built again
    assert sum(map(len, shared._encoded.values())) <= MAX_ENCODED_BYTES


def test_plan_never_has_a_zero_weight_nor_an_empty_plan():
    plan = plan_localities(EPS["backend"], sample_weights_doc(1, {"az-a": 99, "az-b": 1}))
    assert all(loc.weight >= 1 for loc in plan)


@pytest.mark.parametrize("data, field", [
    ({}, "service"),
    ({"service": [{"name": "b"}]}, "service[0]"),
    ({"service": [{"name": "b", "consul_service": "b"}]}, "topology"),
    ({"xds": {"listen": "nope"}, "service": [{"name": "b", "consul_service": "b"}]}, "xds.listen"),
    ({"xds": {"max_streams": 0}, "service": [{"name": "b", "consul_service": "b"}]}, "xds.max_streams"),
    ({"xds": {"bogus": 1}}, "xds.bogus"),
    ({"xds": {"tls": {}}, "service": [{"name": "b", "consul_service": "b"}]}, "xds.tls"),
    ({"xds": {"tls": {"cert_file": "/c", "key_file": "/k", "verify": False}}}, "xds.tls.verify"),
])
def test_config_errors_name_the_field(data, field):
    with pytest.raises(ConfigError) as exc:
        parse_xds_config(data)
    assert exc.value.field == field, exc.value


def test_a_bad_config_exits_2_with_one_line(tmp_path):
    cfg = tmp_path / "xds.toml"
    cfg.write_text('[xds]\nmax_streams = "many"\n')
    out = subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "xds", "serve", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "xds.max_streams" in out.stderr


def test_xds_tls_table_with_a_client_ca_is_mutual_tls(tmp_path):
    eps = tmp_path / "e.json"
    eps.write_text('{"az-a": ["198.18.1.2:8080"]}')
    base = {"service": [{"name": "b", "endpoints_file": str(eps)}]}
    assert parse_xds_config(base).tls is None
    tls = parse_xds_config({**base, "xds": {"tls": {"cert_file": "/c", "key_file": "/k", "ca_file": "/ca"}}}).tls
    assert (tls.cert_file, tls.key_file, tls.ca_file) == ("/c", "/k", "/ca")


def test_delta_wildcard_forgets_absent_names_it_unsubscribes():
    # A wildcard client that subscribes to invented names and unsubscribes them again,
    # each request within max_names: what the stream tracks stays bounded.
    st = DeltaStream(resources.TYPES, max_names=64)
    st.on_request(h.delta(h.CDS))  # legacy wildcard
    shared = snap()
    st.pending(shared)
    prev: list[str] = []
    for round_ in range(20):
        names = [f"r{round_}-{i}" for i in range(30)]
        st.on_request(h.delta(h.CDS, names, prev, zone=None))
        r = [x.decode() for x in st.pending(shared)]
        assert sorted(r[0].removed_resources) == sorted(names)  # each is answered absent once
        prev = names
    state = st.types[h.CDS]
    assert set(state.sent) == {"backend", *prev}
    st.on_request(h.delta(h.CDS, [], prev, zone=None))
    assert set(state.sent) == {"backend"}  # the resource itself is still the client's
    assert st.pending(shared) == []


def test_delta_refuses_a_stream_tracking_more_than_its_names_and_the_snapshot():
    st = DeltaStream(resources.TYPES, max_names=4)
    st.on_request(h.delta(h.CDS))
    st.pending(snap())  # one resource
    st.types[h.CDS].sent.update({f"leak-{i}": "" for i in range(2 * 4)})  # 1 + 8 = 9 tracked: the limit
    st.on_request(h.delta(h.CDS, zone=None))
    st.types[h.CDS].sent["one-more"] = ""  # 10: over 2 * 4 names + 1 resource
    with pytest.raises(ProtocolError, match="tracked on one stream") as exc:
        st.on_request(h.delta(h.CDS, zone=None))
    assert exc.value.code == "RESOURCE_EXHAUSTED"


def test_catalog_instances_are_one_endpoint_per_canonical_address():
    import ipaddress

    from azprobe.consumers.xds.sources import place_instances
    topo = {"az-a": [ipaddress.ip_network("2001:db8::/64")], "az-b": [ipaddress.ip_network("10.0.0.0/8")]}
    # Consul dedupes the strings as written: three spellings of one host arrive; served
    # three times, gRPC clients reject the whole ClusterLoadAssignment
    instances = (("2001:DB8::1", 80), ("2001:db8:0::1", 80), ("2001:db8::1", 80), ("2001:db8::1", 81),
                 ("10.0.0.1", 80), ("10.0.0.1", 80))
    by_az, outside, duplicates = place_instances(instances, topo)
    assert by_az == {"az-a": [("2001:db8::1", 80), ("2001:db8::1", 81)], "az-b": [("10.0.0.1", 80)]}
    assert (outside, duplicates) == (0, 3)
    assert place_instances(tuple(reversed(instances)), topo)[0] == {
        "az-a": [("2001:db8::1", 81), ("2001:db8::1", 80)], "az-b": [("10.0.0.1", 80)]}


def test_a_scoped_ipv6_instance_is_left_out_as_unusable():
    import ipaddress

    from azprobe.consumers.xds.sources import place_instances
    topo = {"az-a": [ipaddress.ip_network("fe80::/10"), ipaddress.ip_network("2001:db8::/64")]}
    by_az, outside, duplicates = place_instances(
        (("fe80::1%eth0", 80), ("fe80::1%25eth0", 80), ("2001:db8::1", 80)), topo)
    assert (by_az, outside, duplicates) == ({"az-a": [("2001:db8::1", 80)]}, 2, 0)
