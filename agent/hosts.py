"""Per-destination-host evidence: the kernel's readings -> cumulative per-host values.

The probe counts connects, failures, retransmits and RTOs per host (path, destination
address) in the `hosts` table, and srtt samples per flow-cache slot in `flow_rtt`
(tcp_probe holds the slot, not the host: a hash lookup there would cost every sampled
segment; docs/probe.md "Hosts"). Each reading, HostLedger files a slot's new samples
under the host that slot holds, and names the hosts idle for `idle_s`, which the probe
then deletes, so the table holds the hosts in use. Pure: tested without a kernel.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from azprobe.agent.windows import counts_since
from azprobe.contracts.window import HOST_RTT_BUCKETS

HostKey = tuple[int, bytes]  # (path id, 16-byte address, IPv4 as ::ffff:a.b.c.d)
# A reading's key: the host and its epoch, new each time the host enters the table, so a
# host deleted and inserted again is diffed from zero, not against its old counts.
ReadingKey = tuple[int, bytes, int]
# A host idle this long leaves the table: a minute of windows holds no evidence of it.
DEFAULT_IDLE_S = 60.0


@dataclass
class _LedgerHost:
    epoch: int
    counters: tuple[int, ...]
    rtt: list[int] = field(default_factory=lambda: [0] * HOST_RTT_BUCKETS)
    changed_at: float = 0.0


class HostLedger:
    """Cumulative per-host values from the probe's cumulative readings."""

    def __init__(self, idle_s: float = DEFAULT_IDLE_S) -> None:
        self.idle_s = idle_s
        # Samples of hosts not in the table (left out when it was full, or deleted as idle
        # while a connection of theirs stayed open): their summaries could not be kept.
        self.dropped = 0
        self._hosts: dict[HostKey, _LedgerHost] = {}
        self._slots: dict[int, tuple[HostKey | None, Sequence[int]]] = {}
        self._epochs = itertools.count(1)

    def read(self, counters: Mapping[HostKey, Sequence[int]],
             slots: Mapping[int, tuple[HostKey | None, Sequence[int]]],
             now: float) -> tuple[dict[ReadingKey, tuple[int, ...]], list[HostKey]]:
        """`counters`: the table's hosts, CPUs summed, in window.HOST_COUNTER_FIELDS order
        (the kernel's struct azp_host_counters); `slots`: every flow-cache slot -> (the host it holds, None when it holds none,
        and its cumulative srtt row). Returns every host's cumulative values (counters,
        then HOST_RTT_BUCKETS counts) by ReadingKey, and the hosts to delete (idle)."""
        for key, values in counters.items():
            host = self._hosts.get(key)
            if host is None:
                self._hosts[key] = _LedgerHost(next(self._epochs), tuple(values), changed_at=now)
            elif tuple(values) != host.counters:
                host.counters, host.changed_at = tuple(values), now
        for key in [k for k in self._hosts if k not in counters]:
            del self._hosts[key]  # deleted from the table (by this ledger, or the probe reloaded)
        self._file_samples(slots, now)
        idle = [k for k, h in self._hosts.items() if now - h.changed_at >= self.idle_s]
        for key in idle:
            del self._hosts[key]
        readings = {(path, addr, h.epoch): (*h.counters, *h.rtt) for (path, addr), h in self._hosts.items()}
        return readings, idle

    def _file_samples(self, slots: Mapping[int, tuple[HostKey | None, Sequence[int]]], now: float) -> None:
        dropped_hosts: set[HostKey] = set()
        for slot, (owner, row) in slots.items():
            prev = self._slots.get(slot)
            self._slots[slot] = (owner, tuple(row))
            if prev is None or owner is None:
                continue  # the first reading is the baseline; an empty slot has no host
            prev_owner, prev_row = prev
            # A slot that changed hands since the last reading holds samples of either
            # flow: filed under neither, so no host is given another's samples.
            if prev_owner not in (None, owner):
                continue
            new = counts_since(row, prev_row)
            if not any(new):
                continue
            host = self._hosts.get(owner)
            if host is None:
                dropped_hosts.add(owner)
                continue
            host.rtt = [a + b for a, b in zip(host.rtt, new)]
            host.changed_at = now
        self.dropped += len(dropped_hosts)

    def __len__(self) -> int:
        return len(self._hosts)

