"""agent/btf.py against BTF blobs built here, type by type as the kernel lays them out."""

from __future__ import annotations

import struct

import pytest

from azprobe.agent import btf
from azprobe.agent.btf import BTF, BTFError, Member, sock_offsets


class BlobBuilder:
    """A little-endian BTF blob: add types in id order (from 1), then `blob()`."""

    def __init__(self) -> None:
        self.strings = bytearray(b"\0")
        self.types = bytearray()
        self.next_id = 1

    def _name(self, name: str) -> int:
        if not name:
            return 0
        off = len(self.strings)
        self.strings += name.encode() + b"\0"
        return off

    def _add(self, name: str, kind: int, vlen: int, size_or_type: int, extra: bytes = b"",
             kind_flag: bool = False) -> int:
        info = (kind << 24) | vlen | (1 << 31 if kind_flag else 0)
        self.types += struct.pack("<III", self._name(name), info, size_or_type) + extra
        self.next_id += 1
        return self.next_id - 1

    def int_(self, name: str, size: int) -> int:
        return self._add(name, btf.KIND_INT, 0, size, struct.pack("<I", size * 8))

    def typedef(self, name: str, target: int) -> int:
        return self._add(name, btf.KIND_TYPEDEF, 0, target)

    def array(self, elem: int, index: int, count: int) -> int:
        return self._add("", btf.KIND_ARRAY, 0, 0, struct.pack("<III", elem, index, count))

    def struct(self, name: str, size: int, members: list[tuple[str, int, int]], *, union: bool = False,
               bitfields: bool = False) -> int:
        """members: (name, type id, bit offset, or (bitfield size << 24 | bit offset))."""
        extra = b"".join(struct.pack("<III", self._name(n), t, off) for n, t, off in members)
        return self._add(name, btf.KIND_UNION if union else btf.KIND_STRUCT, len(members), size, extra,
                         kind_flag=bitfields)

    def blob(self, magic: int = btf.BTF_MAGIC) -> bytes:
        header = struct.pack("<HBBIIIII", magic, 1, 0, 24, 0, len(self.types), len(self.types), len(self.strings))
        return header + bytes(self.types) + bytes(self.strings)


def kernel_like_sock(*, protocol_size: int = 2, v6_gap_bytes: int = 0, icsk_at_bits: int = 0) -> bytes:
    """struct sock_common, sock and tcp_sock (through inet_sock and inet_connection_sock)
    shaped like 6.x's, with their anonymous unions."""
    b = BlobBuilder()
    u8, u16, u32 = b.int_("unsigned char", 1), b.int_("unsigned short", 2), b.int_("unsigned int", 4)
    be32, be16 = b.typedef("__be32", u32), b.typedef("__be16", u16)
    addrs = b.struct("", 8, [("skc_daddr", be32, 0), ("skc_rcv_saddr", be32, 32)])
    addrpair = b.struct("", 8, [("skc_addrpair", b.int_("long long unsigned int", 8), 0), ("", addrs, 0)], union=True)
    ports = b.struct("", 4, [("skc_dport", be16, 0), ("skc_num", u16, 16)])
    portpair = b.struct("", 4, [("skc_portpair", u32, 0), ("", ports, 0)], union=True)
    in6 = b.struct("in6_addr", 16, [("in6_u", b.array(u8, u32, 16), 0)])
    v6_at = 56 + v6_gap_bytes
    common = b.struct("sock_common", 136, [
        ("", addrpair, 0), ("skc_hash", u32, 64), ("", portpair, 96), ("skc_family", u16, 128),
        ("skc_state", u8, 144), ("skc_v6_daddr", in6, 448), ("skc_v6_rcv_saddr", in6, v6_at * 8 + 128)])
    proto = u16 if protocol_size == 2 else u8
    # sk_padding is a bitfield (kind_flag set: size << 24 | bit offset), as in struct sock.
    sock = b.struct("sock", 760, [("__sk_common", common, 0), ("sk_padding", u8, (1 << 24) | 4200),
                                  ("sk_protocol", proto, 532 * 8)], bitfields=True)
    inet = b.struct("inet_sock", 1000, [("sk", sock, 0), ("inet_saddr", be32, 760 * 8)])
    icsk = b.struct("inet_connection_sock", 1400, [("icsk_inet", inet, 0)])
    b.struct("tcp_sock", 2400, [("inet_conn", icsk, icsk_at_bits), ("srtt_us", u32, 1680 * 8)])
    return b.blob()


def test_members_are_found_through_anonymous_unions_and_typedefs():
    parsed = BTF(kernel_like_sock())
    common = parsed.struct_id("sock_common")
    assert parsed.member(common, "skc_rcv_saddr") == Member(4, 4)
    assert parsed.member(common, "skc_num") == Member(14, 2)
    assert parsed.member(common, "skc_v6_daddr") == Member(56, 16)


def test_sock_offsets_are_the_kernels_layout():
    assert sock_offsets(BTF(kernel_like_sock())) == {
        "AZP_SK_DADDR": 0, "AZP_SK_RCV_SADDR": 4, "AZP_SK_DPORT": 12, "AZP_SK_NUM": 14, "AZP_SK_FAMILY": 16,
        "AZP_SK_V6_DADDR": 56, "AZP_SK_V6_RCV_SADDR": 72, "AZP_SK_PROTOCOL": 532, "AZP_TP_SRTT_US": 1680,
        "AZP_SK_HEAD_LEN": 18, "AZP_SK_V6_BASE": 56, "AZP_SK_V6_LEN": 32}


@pytest.mark.parametrize("blob, message", [
    (kernel_like_sock(protocol_size=1), "struct sock.sk_protocol is 1 bytes, the probe reads 2"),
    (kernel_like_sock(v6_gap_bytes=64), "IPv6 addresses span 96 bytes"),
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
