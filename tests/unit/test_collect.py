"""Collector cursor logic on response bodies (no HTTP): restarts, gaps, duplicates, garbage,
identity (one URL, one node), the per-node window cap."""

from __future__ import annotations

import asyncio
import math
import statistics
from collections import deque

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from azprobe.controller.collect import GAP_SLACK_WINDOWS, Collector, gap_bound, work_within
from azprobe.controller.window_source import AgentCursor, AgentState, AgentTarget
from azprobe.controller.window_store import WindowStore
from tests.controller_harness import topology
from tests.fakeagent import FakeAgent, PathSpec


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(horizon: float = 5.0):
    clock = Clock()
    collector = Collector(evaluation_window_s=horizon, pull_timeout_s=0.5, stale_after_s=3.0, clock=clock,
                          topology=topology())
    collector.set_targets([AgentTarget("http://agent-1")])
    agent = FakeAgent("n1", "az-a", [PathSpec(dst="az-b", conn_attempts=10)])
    return collector, collector.cursors["http://agent-1"], agent, clock


def total_attempts(collector: Collector) -> int:
    return sum(p.conn_attempts for w in collector.store.windows() for p in w.paths)


def test_pulls_are_idempotent_and_duplicates_ignored():
    collector, cursor, agent, clock = make()
    for i in range(3):
        agent.emit(end=100.0 + i)
    assert collector.ingest(cursor, agent.body(cursor.last_seq), clock()) == 3
    # The same windows again (as if `after` were ignored): nothing new is stored.
    assert collector.ingest(cursor, agent.body(0), clock()) == 0
    assert collector.counters.windows_duplicate == 3
    assert total_attempts(collector) == 30
    assert cursor.last_seq == 3


def test_restart_resets_cursor_without_double_counting():
    collector, cursor, agent, clock = make()
    for i in range(4):
        agent.emit(end=100.0 + i)
    collector.ingest(cursor, agent.body(0), clock())
    old_boot = cursor.boot_id
    agent.restart()
    agent.emit(end=104.0)  # new boot, seq 1 again
    body = agent.body(cursor.last_seq)  # after=4: the new boot's seq 1 is hidden
    assert body["windows"] == []
    assert collector.needs_repull(cursor, body)
    collector.ingest(cursor, body, clock())
    assert cursor.boot_id != old_boot and cursor.last_seq == 0
    assert collector.counters.agent_restarts == 1
    assert collector.ingest(cursor, agent.body(0), clock()) == 1
    assert total_attempts(collector) == 50  # 4 old + 1 new window, each counted once
    assert collector.ingest(cursor, agent.body(0), clock()) == 0


def test_gap_counted_and_rest_taken():
    collector, cursor, agent, clock = make()
    agent.emit(end=100.0)
    collector.ingest(cursor, agent.body(0), clock())
    for i in range(5):
        agent.emit(end=101.0 + i)
    agent.ring.popleft()
    agent.ring.popleft()  # seqs 2, 3 fell off the ring: not read
    agent.ring.popleft()
    collector.ingest(cursor, agent.body(cursor.last_seq), clock())
    assert collector.counters.gap_events == 1
    assert collector.counters.gap_windows == 2  # seq 2 and 3
    assert cursor.last_seq == 6


def test_a_seq_jump_counts_no_more_lost_windows_than_the_agent_could_have_made():
    """The seq is the agent's word: a jump to 2^53 is at most the windows one per
    MIN_INTERVAL_S since its last answer (and the slack), not 2^53 lost windows."""
    collector, cursor, agent, clock = make()
    agent.emit(end=100.0)
    collector.ingest(cursor, agent.body(0), clock())
    cursor.last_ok = clock()
    clock.now += 2.0
    agent.seq = 2**53 - 2
    agent.emit(end=101.0)  # seq 2^53 - 1
    collector.ingest(cursor, agent.body(cursor.last_seq), clock())
    assert collector.counters.gap_events == 1
    assert collector.counters.gap_windows == gap_bound(cursor, clock()) == 20 + GAP_SLACK_WINDOWS
    assert cursor.last_seq == 2**53 - 1


def test_first_contact_takes_ring_without_gap_and_skips_old_backlog():
    collector, cursor, agent, clock = make(horizon=5.0)
    for i in range(30):
        agent.emit(end=100.0 + i)
    for _ in range(10):
        agent.ring.popleft()  # ring starts at seq 11
    stored = collector.ingest(cursor, agent.body(0), clock())
    assert collector.counters.gap_events == 0
    # Only windows within the evaluation window (by the agent's own clock) are stored.
    assert stored == 6 and collector.counters.windows_too_old == 14
    assert cursor.last_seq == 30


def test_garbage_counted_and_skipped():
    collector, cursor, agent, clock = make()
    agent.emit(end=100.0)  # seq 1: good
    bad = dict(agent.emit(end=101.0))  # seq 2: negative counter
    agent.ring.pop()
    bad["paths"] = [{"src": "az-a", "dst": "az-b", "conn_ok": -5}]
    agent.push_raw(bad)
    no_seq = {"schema": 1, "hello": "world"}
    agent.push_raw(no_seq)
    foreign = {**agent.emit(end=102.0), "boot_id": "someone-else"}  # seq 3: wrong boot
    agent.ring.pop()
    agent.push_raw(foreign)
    agent.emit(end=103.0)  # seq 4: good
    stored = collector.ingest(cursor, agent.body(0), clock())
    assert collector.counters.windows_garbage == 3
    assert stored == 2 and [w.seq for w in collector.store.windows()] == [1, 4]
    agent.ring.remove(no_seq)
    collector.ingest(cursor, agent.body(cursor.last_seq), clock())
    collector.ingest(cursor, agent.body(1), clock())  # re-read from seq 1 (as if `after` were ignored)
    assert collector.counters.windows_garbage == 3  # seqs already read are duplicates, never re-parsed
    assert [w.seq for w in collector.store.windows()] == [1, 4]


def test_malformed_response_raises():
    collector, cursor, _, clock = make()
    for body in ({}, {"boot_id": "x"}, {"boot_id": "", "windows": []}, [], "nope"):
        try:
            collector.ingest(cursor, body, clock())
        except ValueError:
            continue
        raise AssertionError(f"{body!r} accepted")


def test_store_prunes_by_horizon_and_agent_states():
    collector, cursor, agent, clock = make(horizon=5.0)
    agent.emit(end=100.0)
    collector.ingest(cursor, agent.body(0), clock())
    cursor.last_ok = clock()
    assert cursor.state(clock(), 3.0) is AgentState.UP
    clock.now += 4.0
    assert cursor.state(clock(), 3.0) is AgentState.STALE
    collector.store.prune(clock())
    assert len(collector.store) == 1
    clock.now += 1.5
    collector.store.prune(clock())
    assert len(collector.store) == 0
    cursor.failures = 1
    assert cursor.state(clock(), 3.0) is AgentState.FAILING


def test_store_keeps_order_for_out_of_order_arrivals():
    store = WindowStore(5.0)
    agent = FakeAgent("n", "az-a", [])
    from azprobe.contracts.window import parse_window

    w1, w2 = parse_window(agent.emit(end=1.0)), parse_window(agent.emit(end=2.0))
    assert store.add("a", w2, 10.0) and store.add("a", w1, 8.0)
    assert not store.add("a", w1, 9.0)
    store.prune(13.5)  # cutoff 8.5: w1 goes, w2 stays
    assert [w.seq for w in store.windows()] == [2]
    assert AgentCursor(AgentTarget("x")).state(0.0, 1.0) is AgentState.FAILING


def test_garbage_between_good_windows_is_not_a_gap():
    collector, cursor, agent, clock = make()
    agent.emit(end=100.0)
    agent.push_raw({"schema": 1, "seq": agent.next_seq()})
    agent.emit(end=102.0)
    collector.ingest(cursor, agent.body(0), clock())
    assert collector.counters.windows_garbage == 1 and collector.counters.gap_events == 0


def test_node_sums_are_the_held_windows_summed_and_a_destination_leaves_with_its_last_window():
    """The store's per-node sums (the quorum's evidence) and the zones seen equal summing
    the windows it holds, after adds and prunes alike."""
    from azprobe.contracts.window import parse_window
    from azprobe.controller.merge import Aggregate, UtilWeights

    store = WindowStore(5.0)
    agents = [FakeAgent(f"n{i}", az, [PathSpec(dst="az-a", conn_attempts=10 + i, failures=i % 3, rtt_ms=5 + i),
                                      PathSpec(dst="az-b", conn_attempts=7, syn_retrans=i, rtt_ms=40 + 3 * i)],
                        cpu=0.1 * (i % 7), mem=0.05 * i)
              for i, az in enumerate(["az-a", "az-a", "az-b", "az-b", "az-b"])]
    only_once = FakeAgent("n9", "az-c", [PathSpec(dst="az-c", conn_attempts=5, rtt_ms=2)])
    store.add(only_once.node, parse_window(only_once.emit(end=100.0)), 1000.0)
    for second in range(5):
        for i, agent in enumerate(agents):
            store.add(agent.node, parse_window(agent.emit(end=100.0 + second)), 1000.0 + second + 0.01 * i)

    def check() -> None:
        held = store.windows()
        nodes = store.node_input()
        assert set(nodes) == {w.node for w in held}
        for node, (_az, dsts) in nodes.items():
            expected: dict[str, Aggregate] = {}
            for w in held:
                if w.node == node:
                    for p in w.paths:
                        expected.setdefault(p.dst, Aggregate()).merge(p)
            assert dsts.keys() == expected.keys()
            for dst, agg in dsts.items():
                want = expected[dst]
                assert agg.rtt_us.counts == want.rtt_us.counts and agg.connect_us.counts == want.connect_us.counts
                assert (agg.conn_attempts, agg.conn_ok, agg.failures, agg.syn_retrans) == (
                    want.conn_attempts, want.conn_ok, want.failures, want.syn_retrans)
        seen = store.zones_seen()
        for az in {w.az for w in held}:
            per_node = [[UtilWeights().combine(w.util.cpu, w.util.mem) for w in held if w.node == n]
                        for n in {w.node for w in held if w.az == az}]
            assert seen.util[az] == pytest.approx(statistics.median(sum(v) / len(v) for v in per_node))

    check()
    assert store.zones_seen().by_source == {"az-a": ("az-a", "az-b"), "az-b": ("az-a", "az-b"), "az-c": ("az-c",)}
    store.prune(1000.0 + 5.0 + 0.5)  # cutoff 1000.5: n9's only window and the first second leave
    check()
    seen = store.zones_seen()
    assert seen.zones == ("az-a", "az-b") and "az-c" not in seen.by_source
    assert len(store) == 20


@settings(max_examples=60, deadline=None)
@example(ats=[997.0, 996.75, 997.25], prunes=[1000.0])  # a cutoff on an arrival, and on either side of it
@given(ats=st.lists(st.integers(3960, 4040).map(lambda t: t / 4) | st.floats(990.0, 1010.0), min_size=1, max_size=40),
       prunes=st.lists(st.integers(3960, 4080).map(lambda t: t / 4) | st.floats(990.0, 1020.0), max_size=4))
def test_a_prune_takes_out_exactly_the_windows_that_arrived_before_the_horizon(ats, prunes):
    """Whatever the order windows arrive in (a backlog is back-dated) and wherever a
    cutoff falls against the store's slots (quarter seconds: on a slot's edge, on a
    window's arrival), a prune leaves exactly the windows whose arrival is at or after
    now - horizon, and the node sums hold just those."""
    from azprobe.contracts.window import parse_window

    store, agent = WindowStore(3.0), FakeAgent("n1", "az-a", [PathSpec(dst="az-b", conn_attempts=1)])
    arrived = {}
    for i, at in enumerate(ats):
        window = parse_window(agent.emit(end=100.0 + i))
        assert store.add(f"http://a/{i}", window, at)
        arrived[window.end] = at
    for now in sorted(prunes):
        store.prune(now)
        want = sorted(end for end, at in arrived.items() if at >= now - 3.0)
        items = store.items()
        assert sorted(item.window.end for item in items) == want and len(store) == len(want)
        assert [item.at for item in items] == sorted(item.at for item in items)
        sums = store.node_input().get("n1", ("", {}))[1]
        assert sum(agg.conn_attempts for agg in sums.values()) == len(want)
        arrived = {end: at for end, at in arrived.items() if at >= now - 3.0}


# --- identity: a URL is one vantage point (docs/quorum.md "Identity") ------------------
def _target(collector: Collector, url: str) -> AgentCursor:
    collector.set_targets([*(c.target for c in collector.cursors.values()), AgentTarget(url)])
    return collector.cursors[url]


def test_an_answer_without_a_node_name_is_refused_and_counted():
    collector, cursor, agent, clock = make()
    neighbour = FakeAgent("n2", "az-a", [PathSpec(dst="az-b", conn_attempts=10)])
    agent.emit(end=100.0)
    body = agent.body(0)
    body["windows"].append(neighbour.emit(end=100.5))
    for headerless in ({k: v for k, v in body.items() if k != "node"}, {**body, "node": ""}):
        with pytest.raises(ValueError, match="^answer refused: answers without a node name") as refused:
            collector.ingest(cursor, headerless, clock())
        assert type(refused.value).__name__ == "AnswerRefused"
    assert collector.counters.answers_refused == 2
    assert len(collector.store) == 0 and cursor.boot_id is None and cursor.last_seq == 0
    # Named, the same answer is taken, and the neighbour's window in it is garbage.
    assert collector.ingest(cursor, body, clock()) == 1
    assert collector.counters.windows_garbage == 1 and list(collector.store.node_input()) == ["n1"]


def test_a_url_keeps_its_first_name_until_that_name_has_been_silent_for_the_forget_time():
    collector, cursor, agent, clock = make(horizon=5.0)
    agent.emit(end=100.0)
    collector.ingest(cursor, agent.body(0), clock())
    agent.node = "n1-renamed"
    agent.cpu = agent.mem = 0.9  # n1 said 0.3 and 0.5
    agent.emit(end=101.0)
    for _ in range(3):
        clock.now += 4.9
        with pytest.raises(ValueError, match="speaks for 'n1'"):
            collector.ingest(cursor, agent.body(cursor.last_seq), clock())
    assert collector.counters.answers_refused == 3 and cursor.node == "n1" and cursor.last_seq == 1
    clock.now += 0.4  # n1 silent for 15.1 s: the rename is taken
    assert collector.ingest(cursor, agent.body(cursor.last_seq), clock()) == 1
    assert cursor.node == "n1-renamed"
    # Until n1's window leaves the horizon the store holds both names; the URL is one
    # vantage point in the votes and in its AZ's utilisation alike.
    assert list(collector.store.node_input()) == ["n1-renamed"]
    assert len(collector.store) == 2
    assert collector.store.zones_seen().util == {"az-a": pytest.approx(0.9), "az-b": None}  # not n1's 0.4 as well
    collector.store.prune(clock())
    assert list(collector.store.node_input()) == ["n1-renamed"]


def test_a_node_spoken_for_by_one_url_cannot_be_taken_by_another():
    collector, first, agent, clock = make(horizon=5.0)
    second = _target(collector, "http://agent-2")
    liar = FakeAgent("n1", "az-a", [PathSpec(dst="az-b", conn_attempts=10, failures=10)])  # n1's name
    agent.emit(end=100.0)
    liar.emit(end=100.5)
    collector.ingest(first, agent.body(0), clock())
    for _ in range(4):  # first keeps answering: n1 stays its
        clock.now += 5.0
        with pytest.raises(ValueError, match="which http://agent-1 speaks for"):
            collector.ingest(second, liar.body(0), clock())
        collector.ingest(first, agent.body(first.last_seq), clock())
    assert collector.counters.answers_refused == 4
    assert all(item.agent == "http://agent-1" for item in collector.store.items())
    assert sum(p.conn_timeout for w in collector.store.windows() for p in w.paths) == 0
    # first falls silent (the node moved to the second URL): after the forget time, it is taken
    clock.now += 15.0
    liar.emit(end=101.0)
    assert collector.ingest(second, liar.body(0), clock()) == 2
    assert collector.store.agent_node["http://agent-2"] == "n1"
    with pytest.raises(ValueError, match="which http://agent-2 speaks for"):
        collector.ingest(first, agent.body(first.last_seq), clock())


def test_names_silent_for_the_forget_time_are_forgotten():
    from azprobe.controller.collect import Identities

    identities = Identities(forget_after_s=10.0)
    for i in range(100):
        assert identities.claim(f"http://a{i}", f"n{i}", float(i)) == ""
    identities.prune(105.0)  # n0..n95 silent for 10 s or more
    assert [identities.node_of(f"http://a{i}") for i in (95, 96, 99)] == [None, "n96", "n99"]
    assert identities.claim("http://a0", "n97", 105.0) != ""  # a97 spoke 8 s ago
    assert identities.claim("http://a0", "n1", 105.0) == ""


# --- bounds on what one agent can make the store hold ----------------------------------
def test_one_node_cannot_flood_the_store():
    collector, cursor, agent, clock = make(horizon=5.0)
    cap = 65  # 5 s at the agents' shortest interval (0.1 s), a quarter more, and 2
    agent.ring = deque(maxlen=5000)
    for i in range(2000):  # 2,000 windows of 1 ms in the last 2 s, as valid as any
        agent.emit(end=100.0 + i * 1e-3, interval_s=1e-3)
    assert collector.ingest(cursor, agent.body(0), clock()) == cap
    assert len(collector.store) == cap and collector.counters.windows_over_cap == 2000 - cap
    assert collector.store.max_node_windows == cap
    assert sorted(w.seq for w in collector.store.windows()) == list(range(2001 - cap, 2001))  # the newest
    assert cursor.last_seq == 2000 and collector.counters.gap_events == 0  # stepped past, not a gap
    agent.emit(end=102.0)
    assert collector.ingest(cursor, agent.body(cursor.last_seq), clock()) == 0  # still full
    clock.now += 5.1
    collector.store.prune(clock())  # the evaluation window moved on: room again
    agent.emit(end=103.0)
    assert collector.ingest(cursor, agent.body(cursor.last_seq), clock()) == 1


def test_an_agent_at_the_shortest_interval_loses_no_window_to_the_cap():
    collector, cursor, agent, clock = make(horizon=5.0)
    end = 100.0
    for _ in range(40):  # pulls 1 s apart, 10 windows each; pruned before and after, as pull_all does
        collector.store.prune(clock())
        for _ in range(10):
            end += 0.1
            agent.emit(end=end, interval_s=0.1)
        assert collector.ingest(cursor, agent.body(cursor.last_seq), clock()) == 10
        collector.store.prune(clock())
        clock.now += 1.0
    assert collector.counters.windows_over_cap == 0


# --- one bad window does not silence its agent -----------------------------------------
@pytest.mark.parametrize("bad_end", [1e300, float("inf")])
def test_a_window_with_an_absurd_end_does_not_silence_its_agent(bad_end):
    from azprobe.contracts.windowcodec import COMPACT_TYPE, decode_page, encode_compact_page

    collector, cursor, agent, clock = make(horizon=5.0)
    agent.emit(end=100.0)
    bad = dict(agent.emit(end=101.0))
    agent.ring.pop()
    bad["end"] = bad_end
    agent.push_raw(bad)
    agent.emit(end=102.0)
    doc = agent.body(0)
    # JSON has no infinity: +inf reaches the controller in the compact form only
    raw = [msgspec.msgpack.encode([w["schema"], w["node"], w["az"], w["boot_id"], w["seq"], w["start"], w["end"],
                                   0.5, 0.5, 0, []]) for w in doc["windows"]]
    page = decode_page(encode_compact_page("n1", "az-a", doc["boot_id"], raw), COMPACT_TYPE, max_bytes=1 << 20)
    assert collector.ingest(cursor, page if math.isinf(bad_end) else doc, clock()) == 2
    assert collector.counters.windows_garbage == 1 and cursor.newest_end == 102.0
    agent.emit(end=103.0)
    assert collector.ingest(cursor, agent.body(cursor.last_seq), clock()) == 1
    assert collector.counters.windows_too_old == 0


@pytest.mark.parametrize("field", ["end", "start", "cpu", "mem"])
def test_a_json_integer_past_a_floats_range_is_a_garbage_window_not_a_crash(field):
    # JSON integers have no bound: float(10**400) raises OverflowError, which no ValueError
    # handler catches, and the pull worker died with it
    collector, cursor, agent, clock = make(horizon=5.0)
    agent.emit(end=100.0)
    bad = dict(agent.emit(end=101.0))
    agent.ring.pop()
    if field in ("cpu", "mem"):
        bad["util"] = {**bad["util"], field: 10**400}
    else:
        bad[field] = 10**400
    agent.push_raw(bad)
    agent.emit(end=102.0)
    assert collector.ingest(cursor, agent.body(0), clock()) == 2
    assert collector.counters.windows_garbage == 1 and cursor.newest_end == 102.0


# --- the pool of pulls under the cycle budget (work_within) ---------------------------
def _within(jobs: list[int], work, workers: int, budget_s: float = 0.01) -> tuple[list[int], int, list[int]]:
    started: list[int] = []

    async def tracked(job: int) -> None:
        started.append(job)
        await work(job)

    async def run() -> tuple[list[int], int]:
        # The pool must return by itself; this bound only turns a hang into a failure.
        return await asyncio.wait_for(work_within(budget_s, jobs, tracked, workers), 10)

    unstarted, cut = asyncio.run(run())
    return unstarted, cut, started


async def _forever(job: int) -> None:
    await asyncio.Event().wait()


def test_the_pool_runs_every_job_within_the_budget():
    async def quick(job: int) -> None:
        await asyncio.sleep(0)

    assert _within(list(range(10)), quick, workers=3, budget_s=10.0) == ([], 0, list(range(10)))


def test_the_budget_cuts_the_jobs_in_flight_and_starts_no_other():
    unstarted, cut, started = _within(list(range(6)), _forever, workers=2)
    assert (unstarted, cut, started) == ([2, 3, 4, 5], 2, [0, 1])


def test_a_job_that_swallows_its_cancellation_stops_its_worker_at_the_budget():
    """asyncio.wait_for (Python 3.11) returns its result when a cancellation meets the
    completion of what it waited for: the cancellation is lost, the job ends normally.
    Its worker must not go on with the next job (a whole cycle's worth, past the budget)."""
    async def swallows(job: int) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if job != 0:
                raise

    unstarted, cut, started = _within(list(range(5)), swallows, workers=1)
    assert (unstarted, cut, started) == ([1, 2, 3, 4], 0, [0])
