"""The fallback collector: where the BPF probe cannot load (no BCC, no kernel headers, no
compiler, no CAP_BPF), sample the TCP sockets of this network namespace through
sock_diag/inet_diag (pyroute2) once per interval and turn what changed between two
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
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from azprobe import bpf
from azprobe.agent.lpm import TrieEntry
from azprobe.agent.windows import BPF_COUNTER_FIELDS, Snapshot
from azprobe.contracts.sketch import bucket_index

SOURCE = "sockdiag"
TCP_ESTABLISHED, TCP_SYN_SENT, TCP_TIME_WAIT, TCP_LISTEN = 1, 2, 6, 10
TCP_CA_LOSS = 4
ALL_STATES = 0xFFF
INET_DIAG_INFO_EXT = 1 << (2 - 1)  # request INET_DIAG_INFO (struct tcp_info)
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
            path = lookup.path_of(s.src, s.dst)
            prev = self._seen.get(s.cookie)
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


def _samples(records: Iterable[dict]) -> Iterator[SocketSample]:
    for r in records:
        info = {}
        for name, value in r.get("attrs", ()):
            if name == "INET_DIAG_INFO" and isinstance(value, dict):
                info = value
        yield SocketSample(cookie=r["idiag_cookie"], state=r["idiag_state"], src=r["idiag_src"],
                           dst=r["idiag_dst"], sport=r["idiag_sport"], dport=r["idiag_dport"],
                           srtt_us=info.get("tcpi_rtt", 0), total_retrans=info.get("tcpi_total_retrans", 0),
                           ca_state=info.get("tcpi_ca_state", 0))


def dump_tcp_sockets() -> list[SocketSample]:
    """Every TCP socket of this network namespace, IPv4 and IPv6, with tcp_info."""
    from pyroute2 import DiagSocket  # noqa: PLC0415 - netlink only when this collector runs

    out: list[SocketSample] = []
    with DiagSocket() as ds:
        ds.bind()
        for family in (socket.AF_INET, socket.AF_INET6):
            out.extend(_samples(ds.get_sock_stats(family=family, states=ALL_STATES,
                                                  extensions=INET_DIAG_INFO_EXT)))
    return out


class SockDiagCollector:
    """The Probe's interface for Agent, backed by socket samples instead of BPF maps."""

    source = SOURCE
    lost_events = 0

    def __init__(self, dump: Callable[[], list[SocketSample]] = dump_tcp_sockets) -> None:
        self._dump = dump
        self._lookup = AzLookup([], 0)
        self._tracker = SampleTracker()
        dump()  # fail now (no netlink, no sock_diag), not at the first tick

    def set_topology(self, entries: list[TrieEntry], own_az_id: int) -> None:
        self._lookup = AzLookup(entries, own_az_id)

    def snapshot(self, rtt_paths: Iterable[int] = ()) -> Snapshot:
        self._tracker.update(self._dump(), self._lookup)
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
