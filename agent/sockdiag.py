"""The fallback collector: where the BPF probe cannot load (no BCC, no kernel headers, no
compiler, no CAP_BPF), sample the TCP sockets of this network namespace through
sock_diag/inet_diag (a raw NETLINK_SOCK_DIAG socket) once per interval and turn what changed between two
samples into the same cumulative Snapshot the probe gives.

What a sample can and cannot see (docs/probe.md): srtt of every established socket at
the instant of the sample (one RTT sample per socket per interval, not per segment);
connects that reached ESTABLISHED (also those that closed in between and linger in
TIME_WAIT); retransmits as the growth of each socket's tcpi_total_retrans; entries into
TCP_CA_Loss as approximate RTOs. A connect that fails entirely between two samples (a
refused connect, or SYN retransmits of a connect that never establishes) is invisible,
and one seen in SYN_SENT that then disappears is counted as conn_timeout (refused and
timed out cannot be told apart).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from azprobe import bpf
from azprobe.agent.lpm import TrieEntry
from azprobe.agent.windows import BPF_COUNTER_FIELDS, Snapshot
from azprobe.contracts.sketch import bucket_index

SOURCE = "sockdiag"
TCP_ESTABLISHED, TCP_SYN_SENT, TCP_TIME_WAIT, TCP_LISTEN = 1, 2, 6, 10
TCP_CA_LOSS = 4
ALL_STATES = 0xFFF
MAX_ADDR_CACHE = 65536


@dataclass(frozen=True)
class SocketSample:
    """The fields of one inet_diag record the collector uses."""

    cookie: int
    state: int
    src: str
    dst: str
    sport: int
    dport: int
    srtt_us: int = 0
    total_retrans: int = 0
    ca_state: int = 0


class AzLookup:
    """Address -> AZ id by longest prefix, from the same entries the BPF trie gets."""

    def __init__(self, entries: Iterable[TrieEntry], own_az_id: int) -> None:
        self.own_az_id = own_az_id
        by_len: dict[int, dict[int, int]] = {}
        for e in entries:
            net = int.from_bytes(e.addr, "big") >> (128 - e.prefixlen) if e.prefixlen else 0
            by_len.setdefault(e.prefixlen, {})[net] = e.az_id
        self._by_len = sorted(by_len.items(), reverse=True)
        self._cache: dict[str, int | None] = {}

    def az_of(self, addr: str) -> int | None:
        """The AZ id of an address, None when no prefix matches."""
        if addr in self._cache:
            return self._cache[addr]
        ip = ipaddress.ip_address(addr)
        if ip.version == 4:
            ip = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
        value = int(ip)
        found = None
        for prefixlen, nets in self._by_len:
            found = nets.get(value >> (128 - prefixlen) if prefixlen else 0)
            if found is not None:
                break
        if len(self._cache) >= MAX_ADDR_CACHE:
            self._cache.clear()
        self._cache[addr] = found
        return found

    def path_of(self, src: str, dst: str) -> int:
        """Like the program's path_of: unknown source -> own AZ, unknown destination -> other."""
        src_id = self.az_of(src)
        dst_id = self.az_of(dst)
        return (self.own_az_id if src_id is None else src_id) * bpf.constant("MAX_AZ") + (
            bpf.constant("AZ_OTHER") if dst_id is None else dst_id)


class SampleTracker:
    """Cumulative counters from successive socket samples (pure: tested without sockets)."""

    def __init__(self) -> None:
        self.counters: dict[int, dict[str, int]] = {}
        self.rtt: dict[int, dict[int, int]] = {}
        self._seen: dict[int, SocketSample] = {}

    def _add(self, path: int, name: str, n: int = 1) -> None:
        row = self.counters.setdefault(path, dict.fromkeys(BPF_COUNTER_FIELDS, 0))
        row[name] += n

    def update(self, sockets: Iterable[SocketSample], lookup: AzLookup) -> None:
        sockets = list(sockets)
        listening = {s.sport for s in sockets if s.state == TCP_LISTEN}
        other = bpf.constant("AZ_OTHER")
        max_az = bpf.constant("MAX_AZ")
        current: dict[int, SocketSample] = {}
        for s in sockets:
            if s.state == TCP_LISTEN:
                continue
            current[s.cookie] = s
            prev = self._seen.get(s.cookie)
            if prev is s:  # an unchanged TIME_WAIT socket: nothing new to count
                continue
            path = lookup.path_of(s.src, s.dst)
            if prev is not None and s.total_retrans > prev.total_retrans:
                self._add(path, "retrans", s.total_retrans - prev.total_retrans)
                if s.state == TCP_SYN_SENT:
                    self._add(path, "syn_retrans", s.total_retrans - prev.total_retrans)
            if s.ca_state == TCP_CA_LOSS and (prev is None or prev.ca_state != TCP_CA_LOSS):
                self._add(path, "syn_rto" if s.state == TCP_SYN_SENT else "rto")
            if s.sport in listening:  # an accepted socket: not a connect of this node
                continue
            if prev is None:
                self._add(path, "conn_attempts")
                if s.state != TCP_SYN_SENT:
                    self._add(path, "conn_ok")
            elif prev.state == TCP_SYN_SENT and s.state != TCP_SYN_SENT:
                self._add(path, "conn_ok")
            if s.state == TCP_ESTABLISHED and s.srtt_us > 0 and path % max_az != other:
                row = self.rtt.setdefault(path, {})
                bucket = bucket_index(s.srtt_us)
                row[bucket] = row.get(bucket, 0) + 1
        for cookie, prev in self._seen.items():
            if prev.state == TCP_SYN_SENT and cookie not in current and prev.sport not in listening:
                self._add(lookup.path_of(prev.src, prev.dst), "conn_timeout")
        self._seen = current

    @property
    def seen(self) -> dict[int, SocketSample]:
        """The last sample's sockets by cookie."""
        return self._seen


NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST_DUMP = 0x1 | 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO = 2
_NLMSG = struct.Struct("=IHHII")        # nlmsghdr
_REQ = struct.Struct("=BBBxI48x")       # inet_diag_req_v2 (the socket id left zero: dump all)
_MSG = struct.Struct("=BBBB")           # inet_diag_msg: family, state, timer, retrans
_PORTS = struct.Struct(">HH")           # inet_diag_sockid: sport, dport (network order)
_COOKIE = struct.Struct("=Q")
_RTA = struct.Struct("=HH")
_TCPI_HEAD = struct.Struct("=BB")       # tcp_info: state, ca_state
_TCPI_RTT = struct.Struct("=I")         # tcp_info.tcpi_rtt at 68 (us)
_TCPI_TOTAL_RETRANS = struct.Struct("=I")  # tcp_info.tcpi_total_retrans at 100
MAX_DUMP_BYTES = 1 << 28                # bound one dump (about 2 million sockets)


def _parse(buf: memoryview, out: list[SocketSample], known: dict[int, SocketSample]) -> bool:
    """Append the sockets of one recv() of a dump; False once the dump is done. A socket
    already `known` in TIME_WAIT is appended as that same object without parsing: at
    hundreds of connections per second they are most of the dump and never change."""
    offset = 0
    while offset + _NLMSG.size <= len(buf):
        length, kind, _, _, _ = _NLMSG.unpack_from(buf, offset)
        if length < _NLMSG.size:
            return False
        if kind == NLMSG_DONE:
            return False
        if kind == NLMSG_ERROR:
            errno = -struct.unpack_from("=i", buf, offset + _NLMSG.size)[0]
            raise OSError(errno, f"sock_diag dump: {os.strerror(errno)}")
        body = offset + _NLMSG.size
        family, state, _, _ = _MSG.unpack_from(buf, body)
        (cookie,) = _COOKIE.unpack_from(buf, body + 44)
        if state == TCP_TIME_WAIT:
            prev = known.get(cookie)
            if prev is not None and prev.state == TCP_TIME_WAIT:
                out.append(prev)
                offset += (length + 3) & ~3
                continue
        sport, dport = _PORTS.unpack_from(buf, body + 4)
        alen = 4 if family == socket.AF_INET else 16
        src = socket.inet_ntop(family, bytes(buf[body + 8:body + 8 + alen]))
        dst = socket.inet_ntop(family, bytes(buf[body + 24:body + 24 + alen]))
        srtt = retrans = ca_state = 0
        attr = body + 72
        end = offset + length
        while attr + _RTA.size <= end:
            alen_, atype = _RTA.unpack_from(buf, attr)
            if alen_ < _RTA.size:
                break
            if atype == INET_DIAG_INFO and alen_ >= _RTA.size + 104:
                info = attr + _RTA.size
                ca_state = _TCPI_HEAD.unpack_from(buf, info)[1]
                (srtt,) = _TCPI_RTT.unpack_from(buf, info + 68)
                (retrans,) = _TCPI_TOTAL_RETRANS.unpack_from(buf, info + 100)
            attr += (alen_ + 3) & ~3
        out.append(SocketSample(cookie=cookie, state=state, src=src, dst=dst, sport=sport, dport=dport,
                                srtt_us=srtt, total_retrans=retrans, ca_state=ca_state))
        offset += (length + 3) & ~3
    return True


def dump_tcp_sockets(known: dict[int, SocketSample] | None = None) -> list[SocketSample]:
    """Every TCP socket of this network namespace, IPv4 and IPv6, with tcp_info: one
    sock_diag dump per family on a raw netlink socket (parsed here with struct: a
    general netlink library costs ~0.5 ms per socket, this ~5 us)."""
    out: list[SocketSample] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(5.0)
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            req = _REQ.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), ALL_STATES)
            nl.send(_NLMSG.pack(_NLMSG.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST_DUMP, seq, 0) + req)
            received = 0
            while True:
                data = nl.recv(1 << 20)
                received += len(data)
                if received > MAX_DUMP_BYTES:
                    raise OSError(f"sock_diag dump larger than {MAX_DUMP_BYTES} bytes")
                if not _parse(memoryview(data), out, known or {}):
                    break
    return out


def _unmapped(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    return (addr.ipv4_mapped or addr) if addr.version == 6 else addr


class SockDiagCollector:
    """The Probe's interface for Agent, backed by socket samples instead of BPF maps."""

    source = SOURCE
    lost_events = 0

    def __init__(self, dump: Callable[[dict[int, SocketSample]], list[SocketSample]] = dump_tcp_sockets) -> None:
        self._dump = dump
        self._lookup = AzLookup([], 0)
        self._tracker = SampleTracker()
        self._node_addrs: frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address] = frozenset()
        dump({})  # fail now (no netlink, no sock_diag), not at the first tick

    def set_node_addresses(self, keys: list[bytes]) -> None:
        """`[node] addresses` as the probe takes them (16-byte trie keys): keep only
        sockets whose local address is one of them; none: every socket is this node's."""
        addrs = set()
        for key in keys:
            addr = ipaddress.IPv6Address(key)
            addrs.add(addr.ipv4_mapped or addr)
        self._node_addrs = frozenset(addrs)

    def _owned(self, samples: list[SocketSample]) -> list[SocketSample]:
        if not self._node_addrs:
            return samples
        return [s for s in samples if _unmapped(s.src) in self._node_addrs]

    def set_topology(self, entries: list[TrieEntry], own_az_id: int) -> None:
        self._lookup = AzLookup(entries, own_az_id)

    def snapshot(self, rtt_paths: Iterable[int] = ()) -> Snapshot:
        self._tracker.update(self._owned(self._dump(self._tracker.seen)), self._lookup)
        rtt_kind = bpf.constant("HIST_RTT")
        return Snapshot(counters={p: dict(c) for p, c in self._tracker.counters.items()},
                        hists={(p, rtt_kind): dict(row) for p, row in self._tracker.rtt.items()})

    def open_events(self, on_event: Callable) -> None:
        """No per-event stream: connect failures show in the windows' counters only."""

    def poll_events(self, timeout_ms: float) -> None:
        time.sleep(max(0.0, timeout_ms) / 1000.0)

    def program_stats(self) -> dict[str, tuple[int, int]]:
        return {}

    def close(self) -> None:
        """Nothing held between samples."""
