"""Probe._read_hosts when deleting an idle host from the `hosts` map raises KeyError (the
entry was already gone: BCC raises KeyError for any failed bpf_delete_elem, and for a
per-CPU hash from a syscall that is ENOENT): the host is counted once, leaves the
ledger once, is not deleted again at the next reading, and a later connect to it is a
new host counted from zero.

The map is the smallest faithful stand-in for BCC's PerCpuHash (keyed by the key's
bytes; deleting an absent key raises KeyError, as BCC's TableBase.__delitem__ does). The
ledger's clock is the test's (HostLedger.read takes `now`); the flow cache is empty."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pytest

from azprobe.agent import probe as probe_module
from azprobe.agent.hosts import HostLedger
from azprobe.agent.probe import Probe
from azprobe.contracts.window import HOST_COUNTER_FIELDS, HOST_RTT_BUCKETS

PATH = 7
ADDR = bytes(range(16))


class MapKey(ctypes.Structure):
    _fields_ = [("path", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("addr", ctypes.c_ubyte * 16)]


class PerCpuHashStandIn:
    """Per-CPU values as BCC gives them: one struct per CPU."""

    Key = MapKey
    CPUS = 2

    def __init__(self) -> None:
        self.entries: dict[bytes, tuple[MapKey, list[SimpleNamespace]]] = {}
        self.deletes: list[bytes] = []  # every delete asked for, absent or not
        self.vanish_before_delete = False  # the race: gone between the read and the delete

    def put(self, connects: int) -> None:
        key = MapKey(PATH, 0, (ctypes.c_ubyte * 16)(*ADDR))
        per_cpu = [SimpleNamespace(**dict.fromkeys(HOST_COUNTER_FIELDS, 0)) for _ in range(self.CPUS)]
        per_cpu[0].connects = connects
        self.entries[bytes(key)] = (key, per_cpu)

    def items_lookup_batch(self) -> list[tuple[MapKey, list[SimpleNamespace]]]:
        items = list(self.entries.values())
        if self.vanish_before_delete:
            self.entries.clear()
        return items

    def __delitem__(self, key: MapKey) -> None:
        self.deletes.append(bytes(key))
        if bytes(key) not in self.entries:
            raise KeyError
        del self.entries[bytes(key)]


@pytest.fixture
def probe(monkeypatch):
    table = PerCpuHashStandIn()
    monkeypatch.setattr(probe_module, "flow_rows", lambda _program: {})
    p = Probe({b"hosts": table}, [], rtt_sample_ticks=1, max_hosts=16)
    clock = [0.0]
    ledger = HostLedger(idle_s=60.0)
    read = ledger.read
    monkeypatch.setattr(ledger, "read", lambda counters, slots, _now: read(counters, slots, clock[0]))
    p.host_ledger = ledger
    return p, table, clock


def test_an_idle_host_already_gone_from_the_map_is_counted_once_and_deleted_once(probe):
    p, table, clock = probe
    table.put(connects=5)
    assert p._read_hosts() == {(PATH, ADDR, 1): (5, 0, 0, 0, *[0] * HOST_RTT_BUCKETS)}

    clock[0], table.vanish_before_delete = 100.0, True  # idle for 100 s; the entry goes meanwhile
    assert p._read_hosts() == {}
    assert len(table.deletes) == 1 and len(p.host_ledger) == 0

    table.vanish_before_delete = False
    clock[0] = 101.0
    assert p._read_hosts() == {}
    assert len(table.deletes) == 1, "the host was deleted again"
    assert p.host_ledger.dropped == 0

    table.put(connects=2)  # a connect to it again: the kernel's new entry counts from zero
    clock[0] = 102.0
    assert p._read_hosts() == {(PATH, ADDR, 2): (2, 0, 0, 0, *[0] * HOST_RTT_BUCKETS)}  # a new epoch: diffed from zero
