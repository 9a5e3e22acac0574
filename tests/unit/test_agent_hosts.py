"""Per-destination-host evidence on the agent's side, without a kernel: the ledger that
files each flow-cache slot's srtt samples under its host and retires idle hosts, the
window's hosts section from snapshot deltas, the page bound, and `[agent] max_hosts`."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from types import SimpleNamespace

import pytest

from azprobe import bpf
from azprobe.agent.config import DEFAULT_MAX_HOSTS, MAX_HOSTS_LIMIT, parse_agent_config
from azprobe.agent.hosts import HostLedger
from azprobe.agent.main import Agent
from azprobe.agent.windows import Snapshot, host_stats, newest_within, snapshot_delta
from azprobe.contracts.window import HOST_RTT_BUCKETS, MAX_HOSTS, HostStats, Utilisation, Window, parse_window
from azprobe.errors import ConfigError

MAX_AZ = bpf.constant("MAX_AZ")
AB = 1 * MAX_AZ + 2  # az-a -> az-b
B1 = ipaddress.IPv6Address("::ffff:198.18.2.6").packed
B2 = ipaddress.IPv6Address("2001:2:0:120::102").packed
ZERO_ROW = [0] * HOST_RTT_BUCKETS


def _row(bucket: int, n: int) -> list[int]:
    row = list(ZERO_ROW)
    row[bucket] = n
    return row


def test_slot_samples_are_filed_under_the_host_the_slot_holds():
    ledger = HostLedger()
    counters = {(AB, B1): (2, 0, 0, 0), (AB, B2): (1, 1, 3, 1)}
    first, idle = ledger.read(counters, {7: ((AB, B1), _row(1, 40)), 9: (None, ZERO_ROW)}, now=0.0)
    assert idle == []
    # The first reading of a slot is its baseline: samples from before this agent are not filed.
    assert {k[:2]: v for k, v in first.items()} == {(AB, B1): (2, 0, 0, 0, *ZERO_ROW), (AB, B2): (1, 1, 3, 1, *ZERO_ROW)}
    second, _ = ledger.read(counters, {7: ((AB, B1), _row(1, 45)), 9: ((AB, B2), _row(5, 2))}, now=1.0)
    by_host = {k[:2]: v for k, v in second.items()}
    assert by_host[(AB, B1)] == (2, 0, 0, 0, *_row(1, 5))
    # Slot 9 was empty at the last reading: every sample since is its new flow's.
    assert by_host[(AB, B2)] == (1, 1, 3, 1, *_row(5, 2))
    assert ledger.dropped == 0


def test_a_slot_that_changed_hands_files_its_samples_under_neither_host():
    ledger = HostLedger()
    counters = {(AB, B1): (1, 0, 0, 0), (AB, B2): (1, 0, 0, 0)}
    ledger.read(counters, {3: ((AB, B1), _row(2, 10))}, now=0.0)
    readings, _ = ledger.read(counters, {3: ((AB, B2), _row(2, 30))}, now=1.0)
    assert all(v[4:] == tuple(ZERO_ROW) for v in readings.values())
    readings, _ = ledger.read(counters, {3: ((AB, B2), _row(2, 31))}, now=2.0)
    assert {k[:2]: v[4:] for k, v in readings.items()}[(AB, B2)] == tuple(_row(2, 1))


def test_samples_of_a_host_outside_the_table_are_counted_as_dropped():
    ledger = HostLedger()
    ledger.read({}, {1: ((AB, B1), ZERO_ROW), 2: ((AB, B1), ZERO_ROW)}, now=0.0)
    readings, _ = ledger.read({}, {1: ((AB, B1), _row(0, 4)), 2: ((AB, B1), _row(0, 1))}, now=1.0)
    assert readings == {} and ledger.dropped == 1  # one host left out in this reading, not one per slot


def test_idle_hosts_leave_the_table_and_come_back_with_a_new_epoch():
    ledger = HostLedger(idle_s=10.0)
    first, _ = ledger.read({(AB, B1): (3, 0, 0, 0)}, {}, now=0.0)
    _, idle = ledger.read({(AB, B1): (3, 0, 0, 0)}, {}, now=9.0)
    assert idle == []
    readings, idle = ledger.read({(AB, B1): (3, 0, 0, 0)}, {}, now=10.0)
    assert idle == [(AB, B1)] and readings == {} and len(ledger) == 0
    # The probe deleted it; a connect inserts it afresh: a new epoch, diffed from zero.
    again, _ = ledger.read({(AB, B1): (1, 0, 0, 0)}, {}, now=11.0)
    assert list(again) != list(first)
    delta = snapshot_delta(Snapshot(hosts=again), Snapshot(hosts=first))
    assert list(delta.hosts.values()) == [(1, 0, 0, 0, *ZERO_ROW)]


def test_samples_keep_a_host_without_connects_in_the_table():
    ledger = HostLedger(idle_s=10.0)
    counters = {(AB, B1): (1, 0, 0, 0)}
    for t in range(0, 30, 5):
        _, idle = ledger.read(counters, {0: ((AB, B1), _row(3, t))}, now=float(t))
        assert idle == []


def test_window_hosts_from_a_delta_name_paths_and_addresses():
    names = {1: "az-a", 2: "az-b", 3: "az-c"}.__getitem__
    prev = Snapshot(hosts={(AB, B1, 1): (5, 1, 0, 0, *ZERO_ROW)}, hosts_dropped=2)
    cur = Snapshot(hosts={(AB, B1, 1): (8, 1, 2, 0, *_row(1, 6)), (AB, B2, 2): (1, 0, 0, 0, *ZERO_ROW),
                          (1 * MAX_AZ + 3, B1, 3): (0, 0, 0, 0, *ZERO_ROW)}, hosts_dropped=5)
    delta = snapshot_delta(cur, prev)
    assert delta.hosts_dropped == 3
    hosts = host_stats(delta, names)
    assert hosts == [HostStats("az-a", "az-b", "198.18.2.6", 3, 0, 2, 0, _row(1, 6)),
                     HostStats("az-a", "az-b", "2001:2:0:120::102", 1, 0, 0, 0, list(ZERO_ROW))]
    window = Window(node="n1", az="az-a", boot_id="b", seq=1, start=1.0, end=2.0, util=Utilisation(0.1, 0.2),
                    paths=[], hosts=hosts, hosts_dropped=delta.hosts_dropped)
    assert parse_window(window.to_json()) == window  # the contract's validator takes what the agent writes


def _window(seq: int, hosts: int) -> Window:
    return Window(node="n", az="az-a", boot_id="b", seq=seq, start=1.0, end=2.0, util=Utilisation(0.1, 0.2),
                  paths=[], hosts=[HostStats("az-a", "az-b", f"198.18.2.{i}") for i in range(hosts)])


def test_a_page_takes_the_newest_windows_whose_hosts_fit():
    windows = [_window(seq, 3) for seq in range(1, 6)]
    assert [w.seq for w in newest_within(windows, 9)] == [3, 4, 5]
    assert [w.seq for w in newest_within(windows, 100)] == [1, 2, 3, 4, 5]
    assert [w.seq for w in newest_within(windows, 1)] == [5]  # the newest always
    assert newest_within([], 5) == []


def test_the_agent_serves_a_bounded_page_and_counts_dropped_hosts():
    config = parse_agent_config({"node": {"name": "n1", "az": "az-a"},
                                 "topology": {"az-a": ["198.18.0.0/24"], "az-b": ["198.18.2.0/24"]}})
    probe = SimpleNamespace(lost_events=0, untracked_connects=0, rtt_sample_ticks=4, hooks="btf", hosts_dropped=7,
                            max_hosts=DEFAULT_MAX_HOSTS)
    agent = Agent(config, probe=probe)  # type: ignore[arg-type]
    per_window = MAX_HOSTS_LIMIT // 3 + 1
    for seq in range(1, 5):
        agent.ring.append(_window(seq, per_window))
    _, page = agent.windows_page(0)
    assert [w.seq for w in page] == [3, 4]
    assert agent.gauges()["hosts_dropped_total"] == 7.0


def test_max_hosts_defaults_bounds_and_errors():
    base = {"node": {"az": "az-a", "name": "n1"}, "topology": {"az-a": ["198.18.0.0/24"]}}
    assert parse_agent_config(base).max_hosts == DEFAULT_MAX_HOSTS == bpf.constant("MAX_HOSTS") == 256
    assert parse_agent_config({**base, "agent": {"max_hosts": 0}}).max_hosts == 0
    assert MAX_HOSTS_LIMIT <= MAX_HOSTS  # every window the agent writes passes the contract's bound
    assert bpf.constant("HOST_RTT_BUCKETS") == HOST_RTT_BUCKETS
    for bad in (-1, MAX_HOSTS_LIMIT + 1):
        with pytest.raises(ConfigError) as exc:
            parse_agent_config({**base, "agent": {"max_hosts": bad}})
        assert str(exc.value) == (f"agent.max_hosts: {bad} is outside 0..{MAX_HOSTS_LIMIT} "
                                  f"(use 1..{MAX_HOSTS_LIMIT} host summaries per node, or 0 for none)")


def test_a_bad_max_hosts_exits_2_with_one_line(tmp_path):
    config = tmp_path / "agent.toml"
    config.write_text('[node]\naz = "az-a"\n[agent]\nmax_hosts = 100000\n[topology]\naz-a = ["198.18.0.0/24"]\n')
    out = subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "agent", "--config", str(config)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "agent.max_hosts" in lines[0], out.stderr
