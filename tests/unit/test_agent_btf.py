"""agent/btf.py against BTF blobs built here, type by type as the kernel lays them out."""

from __future__ import annotations

import struct

import pytest

from azprobe.agent import btf
from azprobe.agent.btf import BTF, BTFError, Member, sock_offsets, tracepoint_ids
from tests.btf_blobs import BlobBuilder, kernel_like_sock


def test_members_are_found_through_anonymous_unions_and_typedefs():
    parsed = BTF(kernel_like_sock())
    common = parsed.struct_id("sock_common")
    assert parsed.member(common, "skc_rcv_saddr") == Member(4, 4)
    assert parsed.member(common, "skc_num") == Member(14, 2)
    assert parsed.member(common, "skc_v6_daddr") == Member(56, 16)


def test_sock_offsets_are_the_kernels_layout():
    assert sock_offsets(BTF(kernel_like_sock())) == {
        "AZP_SK_DADDR": 0, "AZP_SK_RCV_SADDR": 4, "AZP_SK_DPORT": 12, "AZP_SK_NUM": 14, "AZP_SK_FAMILY": 16,
        "AZP_SK_V6_DADDR": 56, "AZP_SK_V6_RCV_SADDR": 72, "AZP_SK_PROTOCOL": 532, "AZP_TP_SRTT_US": 1680}


@pytest.mark.parametrize("blob, message", [
    (kernel_like_sock(protocol_size=1), "struct sock.sk_protocol is 1 bytes, the probe reads 2"),
    (kernel_like_sock(icsk_at_bits=64), "struct tcp_sock's inet_conn is at offset 8, not 0"),
    (BlobBuilder().blob(), "the kernel's BTF has no struct tcp_sock"),
    (kernel_like_sock(), None),
])
def test_a_layout_the_handler_cannot_read_is_refused_by_name(blob, message):
    if message is None:
        sock_offsets(BTF(blob))
        return
    with pytest.raises(BTFError, match=message):
        sock_offsets(BTF(blob))


def test_tracepoint_ids_are_the_btf_trace_typedefs():
    blob = kernel_like_sock()
    parsed = BTF(blob)
    ids = tracepoint_ids(parsed)
    assert set(ids) == set(btf.BTF_TRACEPOINTS)
    for tracepoint, type_id in ids.items():  # each id is the typedef of that name
        assert parsed._named(f"btf_trace_{tracepoint}", btf.KIND_TYPEDEF) == type_id


@pytest.mark.parametrize("blob, message", [
    (kernel_like_sock(tracepoints={"tcp_probe": 2}), "has no tracepoint inet_sock_set_state"),
    (kernel_like_sock(tracepoints={**btf.BTF_TRACEPOINTS, "tcp_cong_state_set": 3}),
     "tcp_cong_state_set does not take 2 arguments"),
    (kernel_like_sock(first_arg="sk_buff"), "tcp_probe's first argument is not a struct sock"),
])
def test_a_tracepoint_the_handlers_cannot_hook_is_refused_by_name(blob, message):
    with pytest.raises(BTFError, match=message):
        tracepoint_ids(BTF(blob))


def test_a_missing_member_names_itself():
    parsed = BTF(kernel_like_sock())
    with pytest.raises(BTFError, match="no member skc_bogus"):
        parsed.member(parsed.struct_id("sock_common"), "skc_bogus")


@pytest.mark.parametrize("blob, message", [
    (b"\x9f\xeb", "shorter than its header"),
    (BlobBuilder().blob(magic=0x9FEB), "not BTF"),
    (kernel_like_sock()[:-40], "run past the end"),
    (struct.pack("<HBBIIIII", btf.BTF_MAGIC, 1, 0, 24, 0, 4, 4, 1) + bytes(5), "ends inside a type"),
])
def test_an_unreadable_blob_is_one_clear_error(blob, message):
    with pytest.raises(BTFError, match=message):
        BTF(blob)


def test_a_missing_file_is_a_btf_error(tmp_path):
    with pytest.raises(BTFError, match="cannot read"):
        BTF.from_file(tmp_path / "vmlinux")
