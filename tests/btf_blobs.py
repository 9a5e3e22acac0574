"""BTF blobs built type by type as the kernel lays them out, for the tests of
agent/btf.py and of `azprobe doctor`'s BTF check."""

from __future__ import annotations

import struct

from azprobe.agent import btf


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

    def ptr(self, target: int) -> int:
        return self._add("", btf.KIND_PTR, 0, target)

    def const(self, target: int) -> int:
        return self._add("", btf.KIND_CONST, 0, target)

    def func_proto(self, params: list[int]) -> int:
        """A void function of `params` (type ids)."""
        return self._add("", btf.KIND_FUNC_PROTO, len(params), 0, b"".join(struct.pack("<II", 0, p) for p in params))

    def struct(self, name: str, size: int, members: list[tuple[str, int, int]], *, union: bool = False,
               bitfields: bool = False) -> int:
        """members: (name, type id, bit offset, or (bitfield size << 24 | bit offset))."""
        extra = b"".join(struct.pack("<III", self._name(n), t, off) for n, t, off in members)
        return self._add(name, btf.KIND_UNION if union else btf.KIND_STRUCT, len(members), size, extra,
                         kind_flag=bitfields)

    def blob(self, magic: int = btf.BTF_MAGIC) -> bytes:
        header = struct.pack("<HBBIIIII", magic, 1, 0, 24, 0, len(self.types), len(self.types), len(self.strings))
        return header + bytes(self.types) + bytes(self.strings)


def kernel_like_sock(*, protocol_size: int = 2, icsk_at_bits: int = 0,
                     tracepoints: dict[str, int] | None = None, first_arg: str = "sock") -> bytes:
    """struct sock_common, sock and tcp_sock (through inet_sock and inet_connection_sock)
    shaped like 6.x's, with their anonymous unions; and a btf_trace_<name> typedef per
    entry of `tracepoints` (name -> arguments after the context; default: the probe's
    hooks), whose first argument points to a const struct `first_arg`."""
    b = BlobBuilder()
    u8, u16, u32 = b.int_("unsigned char", 1), b.int_("unsigned short", 2), b.int_("unsigned int", 4)
    be32, be16 = b.typedef("__be32", u32), b.typedef("__be16", u16)
    addrs = b.struct("", 8, [("skc_daddr", be32, 0), ("skc_rcv_saddr", be32, 32)])
    addrpair = b.struct("", 8, [("skc_addrpair", b.int_("long long unsigned int", 8), 0), ("", addrs, 0)], union=True)
    ports = b.struct("", 4, [("skc_dport", be16, 0), ("skc_num", u16, 16)])
    portpair = b.struct("", 4, [("skc_portpair", u32, 0), ("", ports, 0)], union=True)
    in6 = b.struct("in6_addr", 16, [("in6_u", b.array(u8, u32, 16), 0)])
    common = b.struct("sock_common", 136, [
        ("", addrpair, 0), ("skc_hash", u32, 64), ("", portpair, 96), ("skc_family", u16, 128),
        ("skc_state", u8, 144), ("skc_v6_daddr", in6, 448), ("skc_v6_rcv_saddr", in6, 72 * 8)])
    proto = u16 if protocol_size == 2 else u8
    # sk_padding is a bitfield (kind_flag set: size << 24 | bit offset), as in struct sock.
    sock = b.struct("sock", 760, [("__sk_common", common, 0), ("sk_padding", u8, (1 << 24) | 4200),
                                  ("sk_protocol", proto, 532 * 8)], bitfields=True)
    inet = b.struct("inet_sock", 1000, [("sk", sock, 0), ("inet_saddr", be32, 760 * 8)])
    icsk = b.struct("inet_connection_sock", 1400, [("icsk_inet", inet, 0)])
    b.struct("tcp_sock", 2400, [("inet_conn", icsk, icsk_at_bits), ("srtt_us", u32, 1680 * 8)])
    arg_struct = sock if first_arg == "sock" else b.struct(first_arg, 8, [])
    ctx, sock_arg = b.ptr(0), b.ptr(b.const(arg_struct))
    for name, nargs in (btf.BTF_TRACEPOINTS if tracepoints is None else tracepoints).items():
        b.typedef(f"btf_trace_{name}", b.ptr(b.func_proto([ctx, sock_arg] + [u32] * (nargs - 1))))
    return b.blob()


