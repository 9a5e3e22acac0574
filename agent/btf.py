"""Struct member offsets and tracepoint ids from the running kernel's BTF
(/sys/kernel/btf/vmlinux).

The probe's BTF-typed tracepoint handlers (tp_btf) read a few socket fields themselves
(docs/probe.md "BTF-typed tracepoints"). The installed kernel headers belong to another
kernel, so their offsets would be wrong; the kernel's own type information is not. This
reads just enough of the BTF format (include/uapi/linux/btf.h) to find a struct by name
and a member's byte offset and size, looking through anonymous unions and structs the
way C does, and the `btf_trace_<tracepoint>` typedef a tp_btf program attaches to.
Pure: bytes in, numbers out.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")
BTF_MAGIC = 0xEB9F

# BTF kinds (btf.h) and the bytes of trailing data each has after its 12-byte header.
KIND_INT, KIND_PTR, KIND_ARRAY, KIND_STRUCT, KIND_UNION, KIND_ENUM = 1, 2, 3, 4, 5, 6
KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_FUNC = 8, 9, 10, 11, 12
KIND_FUNC_PROTO, KIND_VAR, KIND_DATASEC, KIND_DECL_TAG, KIND_TYPE_TAG, KIND_ENUM64 = 13, 14, 15, 17, 18, 19
_FIXED_EXTRA = {KIND_INT: 4, KIND_ARRAY: 12, KIND_VAR: 4, KIND_DECL_TAG: 4}
_PER_VLEN_EXTRA = {KIND_STRUCT: 12, KIND_UNION: 12, KIND_ENUM: 8, KIND_FUNC_PROTO: 8, KIND_DATASEC: 12,
                   KIND_ENUM64: 12}
_MODIFIERS = (KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG)
_MAX_DEPTH = 32  # modifier chains and anonymous nesting: a bound, not a real-world limit


class BTFError(ValueError):
    """The BTF is unreadable, or lacks what was asked for."""


@dataclass(frozen=True)
class Member:
    offset: int  # bytes from the start of the outer struct
    size: int    # bytes


@dataclass(frozen=True)
class _Type:
    kind: int
    name_off: int
    vlen: int
    kind_flag: bool
    size_or_type: int
    extra: int  # offset of the trailing data in the type section


class BTF:
    """One parsed BTF blob (the types are indexed, members read on demand)."""

    def __init__(self, blob: bytes) -> None:
        if len(blob) < 24:
            raise BTFError("BTF blob shorter than its header")
        magic, _version, _flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<HBBIIIII", blob)
        if magic != BTF_MAGIC:
            raise BTFError(f"not BTF (magic {magic:#x}; big-endian BTF is not supported)")
        types_at, strings_at = hdr_len + type_off, hdr_len + str_off
        if types_at + type_len > len(blob) or strings_at + str_len > len(blob):
            raise BTFError("BTF sections run past the end of the blob")
        self._blob = blob
        self._strings = (strings_at, strings_at + str_len)
        self._types: list[_Type | None] = [None]  # type id 0 is void
        pos, end = types_at, types_at + type_len
        while pos < end:
            if pos + 12 > end:
                raise BTFError("BTF type section ends inside a type")
            name_off, info, size_or_type = struct.unpack_from("<III", blob, pos)
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            extra = _FIXED_EXTRA.get(kind, 0) + _PER_VLEN_EXTRA.get(kind, 0) * vlen
            self._types.append(_Type(kind, name_off, vlen, bool(info >> 31), size_or_type, pos + 12))
            pos += 12 + extra
        if pos != end:
            raise BTFError("BTF type section does not end on a type boundary")

    @classmethod
    def from_file(cls, path: Path = VMLINUX_BTF) -> "BTF":
        try:
            return cls(path.read_bytes())
        except OSError as exc:
            raise BTFError(f"cannot read {path}: {exc.strerror}") from None

    def _name(self, name_off: int) -> str:
        start, end = self._strings
        at = start + name_off
        stop = self._blob.find(b"\0", at, end)
        if at >= end or stop < 0:
            raise BTFError(f"BTF name offset {name_off} outside the string section")
        return self._blob[at:stop].decode("ascii", "replace")

    def _type(self, type_id: int) -> _Type:
        if not 0 < type_id < len(self._types):
            raise BTFError(f"BTF type id {type_id} does not exist")
        return self._types[type_id]  # type: ignore[return-value]

    def _named(self, name: str, kind: int) -> int | None:
        """The first type of `kind` called `name`. The name is found in the string section
        first (a byte search), then the one type that points at it: no index of every
        name is built, which would cost the agent's resident memory for a few lookups."""
        start, end = self._strings
        wanted = b"\0" + name.encode() + b"\0"
        at = self._blob.find(wanted, start, end)
        while at >= 0:
            name_off = at + 1 - start
            for type_id, t in enumerate(self._types):
                if t is not None and t.kind == kind and t.name_off == name_off:
                    return type_id
            at = self._blob.find(wanted, at + 1, end)  # the same name stored twice
        return None

    def struct_id(self, name: str) -> int:
        """The id of the struct called `name`."""
        found = self._named(name, KIND_STRUCT)
        if found is None:
            raise BTFError(f"the kernel's BTF has no struct {name}")
        return found

    def function_id(self, name: str) -> int:
        """The id of the kernel function (or kfunc) called `name`."""
        found = self._named(name, KIND_FUNC)
        if found is None:
            raise BTFError(f"the kernel's BTF has no function {name}")
        return found

    def tracepoint_id(self, tracepoint: str, nargs: int) -> int:
        """The id of the `btf_trace_<tracepoint>` typedef, a tp_btf program's attach
        point, checked to be a function taking the context and then `nargs` arguments,
        the first a `struct sock *` (what the handlers read through)."""
        typedef = self._named(f"btf_trace_{tracepoint}", KIND_TYPEDEF)
        if typedef is None:
            raise BTFError(f"the kernel's BTF has no tracepoint {tracepoint} (btf_trace_{tracepoint})")
        ptr = self._type(self._type(typedef).size_or_type)
        proto = self._type(ptr.size_or_type) if ptr.kind == KIND_PTR else ptr
        if proto.kind != KIND_FUNC_PROTO or proto.vlen != 1 + nargs:
            raise BTFError(f"tracepoint {tracepoint} does not take {nargs} arguments in this kernel's BTF")
        _name_off, first = struct.unpack_from("<II", self._blob, proto.extra + 8)
        arg = self._type(self._unqualified(first))
        pointee = self._unqualified(arg.size_or_type) if arg.kind == KIND_PTR else 0
        if not pointee or self._type(pointee).kind != KIND_STRUCT or \
                self._name(self._type(pointee).name_off) != "sock":
            raise BTFError(f"tracepoint {tracepoint}'s first argument is not a struct sock * in this kernel's BTF")
        return typedef

    def size_of(self, type_id: int) -> int:
        """Bytes of a type, through typedefs and qualifiers."""
        for _ in range(_MAX_DEPTH):
            t = self._type(type_id)
            if t.kind in _MODIFIERS:
                type_id = t.size_or_type
                continue
            if t.kind in (KIND_INT, KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_ENUM64):
                return t.size_or_type
            if t.kind == KIND_PTR:
                return 8
            if t.kind == KIND_ARRAY:
                elem, _index, count = struct.unpack_from("<III", self._blob, t.extra)
                return self.size_of(elem) * count
            raise BTFError(f"BTF type id {type_id} (kind {t.kind}) has no size")
        raise BTFError("BTF type chain too deep")

    def member(self, struct_id: int, name: str, _depth: int = 0) -> Member:
        """Byte offset and size of member `name` of a struct or union, also when it sits
        in an anonymous union or struct (as `skc_daddr` in `struct sock_common` does)."""
        if _depth > _MAX_DEPTH:
            raise BTFError("BTF anonymous members nested too deep")
        t = self._type(struct_id)
        if t.kind not in (KIND_STRUCT, KIND_UNION):
            raise BTFError(f"BTF type id {struct_id} is not a struct or union")
        for i in range(t.vlen):
            name_off, member_type, offset = struct.unpack_from("<III", self._blob, t.extra + 12 * i)
            bits = offset & 0xFFFFFF if t.kind_flag else offset
            if t.kind_flag and offset >> 24:
                continue  # a bitfield: never what the probe reads
            if name_off and self._name(name_off) == name:
                if bits % 8:
                    raise BTFError(f"member {name} is not byte-aligned")
                return Member(bits // 8, self.size_of(member_type))
            if not name_off:
                inner = self._unqualified(member_type)
                if self._type(inner).kind in (KIND_STRUCT, KIND_UNION):
                    try:
                        found = self.member(inner, name, _depth + 1)
                    except BTFError:
                        continue
                    return Member(bits // 8 + found.offset, found.size)
        raise BTFError(f"no member {name} in BTF type id {struct_id}")

    def _unqualified(self, type_id: int) -> int:
        for _ in range(_MAX_DEPTH):
            t = self._type(type_id)
            if t.kind not in _MODIFIERS:
                return type_id
            type_id = t.size_or_type
        raise BTFError("BTF type chain too deep")


# What the BTF-typed handlers read: (struct, member, expected size, -D name). struct
# sock begins with its struct sock_common (`__sk_common`), and struct tcp_sock with its
# struct sock (inet_conn.icsk_inet.sk), so every offset is one from the socket's address;
# that is checked, not assumed. The verifier checks each load against the same BTF.
SOCK_FIELDS = (
    ("sock_common", "skc_daddr", 4, "AZP_SK_DADDR"),
    ("sock_common", "skc_rcv_saddr", 4, "AZP_SK_RCV_SADDR"),
    ("sock_common", "skc_dport", 2, "AZP_SK_DPORT"),
    ("sock_common", "skc_num", 2, "AZP_SK_NUM"),
    ("sock_common", "skc_family", 2, "AZP_SK_FAMILY"),
    ("sock_common", "skc_v6_daddr", 16, "AZP_SK_V6_DADDR"),
    ("sock_common", "skc_v6_rcv_saddr", 16, "AZP_SK_V6_RCV_SADDR"),
    ("sock", "sk_protocol", 2, "AZP_SK_PROTOCOL"),
    ("tcp_sock", "srtt_us", 4, "AZP_TP_SRTT_US"),
)
# Each struct's first member, down to struct sock_common.
PREFIX_CHAIN = (("tcp_sock", "inet_conn"), ("inet_connection_sock", "icsk_inet"), ("inet_sock", "sk"),
                ("sock", "__sk_common"))

# The tracepoints the probe hooks as tp_btf, and how many arguments each takes after the
# context (include/trace/events/tcp.h, sock.h); the first is always the socket.
BTF_TRACEPOINTS = {"tcp_probe": 2, "inet_sock_set_state": 3, "tcp_receive_reset": 1, "tcp_cong_state_set": 2}


def sock_offsets(btf: BTF) -> dict[str, int]:
    """The -D name -> byte offset in `struct sock` of every field in SOCK_FIELDS; BTFError
    naming the first field that is missing or not the size the handler reads."""
    ids = {name: btf.struct_id(name) for name, _ in PREFIX_CHAIN}
    ids["sock_common"] = btf.struct_id("sock_common")
    for name, first in PREFIX_CHAIN:
        at = btf.member(ids[name], first).offset
        if at != 0:
            raise BTFError(f"struct {name}'s {first} is at offset {at}, not 0")
    out = {}
    for struct_name, field, size, define in SOCK_FIELDS:
        m = btf.member(ids[struct_name], field)
        if m.size != size:
            raise BTFError(f"struct {struct_name}.{field} is {m.size} bytes, the probe reads {size}")
        out[define] = m.offset
    return out


def tracepoint_ids(btf: BTF) -> dict[str, int]:
    """Tracepoint -> attach BTF id of every hook in BTF_TRACEPOINTS; BTFError naming the
    first the kernel lacks or types differently."""
    return {tp: btf.tracepoint_id(tp, nargs) for tp, nargs in BTF_TRACEPOINTS.items()}


def tp_btf_requirements(btf: BTF) -> tuple[dict[str, int], dict[str, int]]:
    """What the tp_btf handlers need, (sock_offsets, tracepoint_ids); BTFError naming the
    first thing missing. The agent decides its hooks by this, and `azprobe doctor`
    reports by it, so the two never disagree."""
    return sock_offsets(btf), tracepoint_ids(btf)
