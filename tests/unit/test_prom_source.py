"""The Prometheus source's pure parts: the bucket contract, answers -> per-node windows
(exact against the windows the agent served), and hostile answers."""

from __future__ import annotations

import asyncio
import copy
import json
import math
import time
from array import array

import pytest

from azprobe.agent.prom import AgentCollector
from azprobe.contracts import prom
from azprobe.contracts.sketch import Histogram, bucket_index, bucket_lower_bound
from azprobe.contracts.window import COUNTER_FIELDS
from azprobe.controller.window_source import AgentState
from azprobe.controller.config import parse_config
from azprobe.controller.prom_source import AnswerStream, PrometheusCollector
from azprobe.controller.prom_windows import (MAX_SERIES_CHARS, SERIES_NAMES, NodeSeries, PromAnswerError,
                                             PromAnswerTooLarge, Samples, node_windows, parse_answer, query_for)
from azprobe.errors import ConfigError
from tests.controller_harness import topology
from tests.fakeagent import PathSpec
from tests.promagent import SyntheticAgent

PATHS = [PathSpec("az-a", rtt_ms=0.4, connect_ms=0.3), PathSpec("az-b", failures=7, syn_retrans=3, rto=2, rtt_ms=210),
         PathSpec("other", conn_attempts=5)]


def scrape(agent: SyntheticAgent) -> list:
    """The samples a scrape of the agent's /metrics would read now."""
    return [s for family in AgentCollector(agent).collect() for s in family.samples if s.name in SERIES_NAMES]


def matrix(scrapes: list[tuple[float, list]], instance: str = "10.0.0.1:9740") -> dict:
    """What Prometheus answers to query_for(): raw samples of every scrape, by series."""
    series: dict[tuple, dict] = {}
    for t, samples in scrapes:
        for s in samples:
            labels = {"__name__": s.name, **s.labels, "instance": instance, "job": "azprobe"}
            entry = series.setdefault(tuple(sorted(labels.items())), {"metric": labels, "values": []})
            entry["values"].append([t, repr(float(s.value))])
    return {"status": "success", "data": {"resultType": "matrix", "result": list(series.values())}}


def scraped_agent(ticks: int = 4) -> tuple[SyntheticAgent, dict]:
    agent = SyntheticAgent("node-1", "az-a", PATHS)
    scrapes = [(1000.0, scrape(agent))]
    for i in range(1, ticks + 1):
        agent.tick(end=1000.0 + i)
        scrapes.append((1000.0 + i, scrape(agent)))
    return agent, matrix(scrapes)


# --- the bucket contract --------------------------------------------------------------
def test_bucket_bounds_are_loglin_bounds_four_per_octave():
    bounds = prom.BUCKET_BOUNDS_US
    assert len(bounds) == 65 and bounds[0] == 64 and bounds[-1] == 1 << 22
    assert all(bucket_lower_bound(bucket_index(b)) == b for b in bounds)
    assert all(b2 / b1 <= 1.25 + 1e-9 for b1, b2 in zip(bounds, bounds[1:]))
    assert prom.bound_from_le("6.4e-05") == prom.bound_from_le("0.000064") == 64.0
    assert prom.bound_from_le("0.00007") is None and prom.bound_from_le("NaN") is None
    assert prom.bound_from_le("+Inf") == math.inf


@pytest.mark.parametrize("values", [range(100, 5000, 7), range(20, 60), [150_000] * 50 + [800] * 900,
                                    range(1000, 4_000_000, 40_000)])
def test_coarse_buckets_keep_counts_and_p95_within_a_bucket(values):
    hist = Histogram()
    for v in values:
        hist.record(v)
    below, deltas = 0, {}
    for le, cumulative in prom.cumulative_buckets(hist):
        deltas[prom.bound_from_le(le)] = cumulative - below
        below = cumulative
    back = prom.histogram_from_deltas(deltas)
    assert back.total == hist.total
    exact, coarse = hist.quantile(0.95), back.quantile(0.95)
    # Within one classic bucket: 25 % of its bound above 64 µs, 64 µs absolute below.
    assert abs(coarse - exact) <= max(0.25 * exact, 64) + 1


def test_latencies_beyond_the_last_bucket_read_as_at_least_the_last_bound():
    hist = Histogram()
    hist.record(9_000_000, 10)
    deltas = {prom.bound_from_le(le): n for le, n in prom.cumulative_buckets(hist) if le == "+Inf"}
    assert prom.histogram_from_deltas(deltas).quantile(0.95) >= prom.BUCKET_BOUNDS_US[-1]


# --- answers -> windows ---------------------------------------------------------------
def test_windows_from_prometheus_equal_the_agents_windows():
    agent, doc = scraped_agent(ticks=4)
    answer = parse_answer(doc, max_series=10_000)
    assert answer.garbage_series == 0 and answer.newest == 1004.0
    (series,) = answer.nodes.values()
    read = node_windows(series, after=None)
    windows = read.windows
    assert read.garbage == 0 and read.newest == 1004.0 and not read.gap
    assert [(w.start, w.end) for w in windows] == [(1000.0 + i, 1001.0 + i) for i in range(4)]
    assert {(w.node, w.az, w.boot_id) for w in windows} == {("node-1", "az-a", agent.boot_id)}
    for got, sent in zip(windows, agent.ring):
        assert got.util == sent.util
        by_path = {(p.src, p.dst): p for p in got.paths}
        assert set(by_path) == {(p.src, p.dst) for p in sent.paths}
        for p in sent.paths:
            q = by_path[(p.src, p.dst)]
            assert {n: getattr(q, n) for n in COUNTER_FIELDS} == {n: getattr(p, n) for n in COUNTER_FIELDS}
            assert q.rtt_us.total == p.rtt_us.total and q.connect_us.total == p.connect_us.total
    # A cursor at 1002 reads only the newer scrapes.
    assert [w.end for w in node_windows(series, after=1002.0).windows] == [1003.0, 1004.0]
    # A lone first scrape makes no window but sets the cursor: the next delta starts there.
    lone = parse_answer(matrix([(1000.0, scrape(agent))]), max_series=10_000)
    (only,) = lone.nodes.values()
    assert node_windows(only, after=None).windows == [] and node_windows(only, after=None).newest == 1000.0
    # A cursor whose scrape is no longer in the answer: the counts since it are lost.
    assert node_windows(series, after=1002.5).gap and not node_windows(series, after=1004.0).gap


def test_a_new_boot_counts_from_zero_and_a_missing_scrape_is_one_longer_window():
    agent = SyntheticAgent("node-1", "az-a", PATHS)
    first = scrape(agent)
    agent.tick(end=1001.0)
    before = scrape(agent)
    restarted = SyntheticAgent("node-1", "az-a", PATHS)  # new boot_id, totals from 0
    restarted.tick(end=1003.0)
    doc = matrix([(1000.0, first), (1001.0, before), (1003.0, scrape(restarted))])
    (series,) = parse_answer(doc, max_series=10_000).nodes.values()
    windows = node_windows(series, after=None).windows
    assert [(w.start, w.end, w.boot_id) for w in windows][-1] == (1001.0, 1003.0, restarted.boot_id)
    assert {p.dst: p.conn_attempts for p in windows[-1].paths} == {"az-a": 100, "az-b": 100, "other": 5}


def test_query_names_every_series_and_the_lookback():
    q = query_for(12.5, 'job="azprobe"')
    assert q.endswith(',job="azprobe"}[12500ms]') and "azprobe_path_rtt_seconds_hits_total" in q and "_bucket" not in q
    assert query_for(0.2).endswith("[1000ms]")


# --- hostile answers ------------------------------------------------------------------
@pytest.mark.parametrize("doc", [None, [], {"status": "error", "error": "bad"}, {"status": "success"},
                                 {"status": "success", "data": {"resultType": "vector", "result": []}},
                                 {"status": "success", "data": {"resultType": "matrix", "result": {}}}])
def test_unusable_answers_are_one_clear_error(doc):
    with pytest.raises(PromAnswerError):
        parse_answer(doc, max_series=10)


def test_too_many_series_is_refused_before_reading_them():
    _, doc = scraped_agent(ticks=1)
    with pytest.raises(PromAnswerError, match="max_series"):
        parse_answer(doc, max_series=5)


def _mutate_series(doc: dict, name: str, change) -> dict:
    doc = copy.deepcopy(doc)
    for entry in doc["data"]["result"]:
        if entry["metric"]["__name__"] == name:
            change(entry)
            break
    return doc


@pytest.mark.parametrize("change", [
    lambda e: e["values"].append([1e12, "1"]),  # timestamp beyond any clock
    lambda e: e["values"].reverse(),  # timestamps not increasing
    lambda e: e["values"][0].__setitem__(1, "NaN"),
    lambda e: e["values"][0].__setitem__(1, "-1"),
    lambda e: e["values"][0].__setitem__(1, "1e300"),
    lambda e: e["values"][0].__setitem__(1, 5),  # a number, not Prometheus's string
    lambda e: e.__setitem__("values", "x"),
    lambda e: e["metric"].__setitem__("node", "n" * 300),
    lambda e: e["metric"].__setitem__("instance", "i" * 300),
    lambda e: e["metric"].__setitem__("job", 7),
    lambda e: e["metric"].update({f"l{i}": "x" for i in range(40)}),
    lambda e: e["metric"].pop("node"),
    lambda e: e["metric"].__setitem__("src_az", ["a"]),
    lambda e: e["metric"].__setitem__("__name__", "something_else"),
])
def test_a_bad_series_is_skipped_and_counted(change):
    _, doc = scraped_agent(ticks=2)
    bad = _mutate_series(doc, prom.COUNTER_SERIES["conn_attempts"], change)
    answer = parse_answer(bad, max_series=10_000)
    assert answer.garbage_series == 1
    for series in answer.nodes.values():
        node_windows(series, after=None)  # never raises


def test_the_agents_counters_outside_the_window_are_neither_asked_for_nor_read():
    """The agent exports syn_rto besides the window's counters (agent/windows.py). Read as
    one, it named no field of a window: a window refused it, and the cycle with it."""
    assert prom.COUNTER_SERIES["syn_rto"] not in SERIES_NAMES
    assert {prom.COUNTER_SERIES[name] for name in COUNTER_FIELDS} <= set(SERIES_NAMES)
    _, doc = scraped_agent(ticks=2)
    (attempts,) = [e for e in doc["data"]["result"] if e["metric"]["__name__"] == prom.COUNTER_SERIES["conn_attempts"]
                   and e["metric"][prom.LABEL_DST] == "az-b"]
    extra = copy.deepcopy(doc)
    extra["data"]["result"].append({**copy.deepcopy(attempts), "metric": {
        **attempts["metric"], "__name__": prom.COUNTER_SERIES["syn_rto"]}})
    answer = parse_answer(extra, max_series=10_000)
    assert answer.garbage_series == 1
    ((_, got),), ((_, want),) = answer.nodes.items(), parse_answer(doc, max_series=10_000).nodes.items()
    assert [w.to_json() for w in node_windows(got, after=None).windows] == \
        [w.to_json() for w in node_windows(want, after=None).windows]


def test_an_unknown_bucket_is_garbage_and_a_window_breaking_the_contract_is_dropped_not_the_cycle():
    _, doc = scraped_agent(ticks=2)
    hits = prom.HITS_SERIES["rtt_us"]
    bad = _mutate_series(doc, hits, lambda e: e["metric"].__setitem__("upper", "0.00007"))
    assert parse_answer(bad, max_series=10_000).garbage_series == 1

    # A CPU utilisation of 150 %: parse_window refuses those windows.
    bad = _mutate_series(doc, prom.CPU_SERIES, lambda e: e.__setitem__("values", [[t, "1.5"] for t, _ in e["values"]]))
    (series,) = parse_answer(bad, max_series=10_000).nodes.values()
    read = node_windows(series, after=None)
    assert read.windows == [] and read.garbage == 2 and read.newest == 1002.0  # the cursor moves past them


def test_more_az_names_than_a_topology_holds_are_garbage():
    _, doc = scraped_agent(ticks=1)
    template = next(e for e in doc["data"]["result"]
                    if e["metric"]["__name__"] == prom.COUNTER_SERIES["conn_ok"])
    for i in range(40):
        extra = copy.deepcopy(template)
        extra["metric"]["dst_az"] = f"az-x{i}"
        doc["data"]["result"].append(extra)
    answer = parse_answer(doc, max_series=10_000)
    (series,) = answer.nodes.values()
    assert len(series.azs) == prom.MAX_AZ_NAMES and answer.garbage_series > 0


def test_collector_ingests_once_and_counts_garbage():
    agent, doc = scraped_agent(ticks=3)
    config = parse_config({"controller": {"name": "c"}, "consul": {}, "agents": {"source": "prometheus"},
                           "prometheus": {"url": "http://127.0.0.1:9"}, "topology": {"azs": ["az-a"]}})
    now = [5000.0]
    collector = PrometheusCollector(config.prometheus, evaluation_window_s=10.0, stale_after_s=5.0,
                                    clock=lambda: now[0], topology=topology())
    answer = parse_answer(doc, max_series=10_000)
    assert collector.range_s() == 30.0  # first contact: the whole lookback (the backlog)
    assert collector.ingest(answer, now[0]) == 3
    collector._remember_position(answer)
    # Then only back to the node's cursor (its newest scrape) plus the margin. The
    # scrapes here are stamped 1003 s (1970): by our clock that is the whole lookback.
    assert collector.range_s() == 30.0
    collector._oldest_cursor = collector._newest = time.time() - 0.5
    assert 2.0 <= collector.range_s() < 2.5
    assert collector.ingest(answer, now[0]) == 0  # overlapping lookback: nothing twice
    assert [w.seq for w in collector.take_new()] == [1001000, 1002000, 1003000]
    assert collector.agent_states()[AgentState.UP] == 1
    (cursor,) = collector.cursors.values()
    assert (cursor.node, cursor.az, cursor.boot_id) == ("node-1", "az-a", agent.boot_id)
    # An unreachable Prometheus: every node is failing, nothing is stored, no exception.
    result = asyncio.run(collector.pull_all())
    assert result.failed == 1 and collector.counters.pull_errors == 1 and cursor.failures == 1
    assert collector.agent_states()[AgentState.FAILING] == 1
    asyncio.run(collector.close())


@pytest.mark.parametrize("agents,prometheus,field", [
    ({"source": "pull"}, None, "agents.source"),
    ({"source": "prometheus", "static": ["http://127.0.0.1:9740"]}, {"url": "http://x:9090"}, "agents.source"),
    ({"source": "prometheus"}, {}, "prometheus.url"),
    ({"source": "prometheus"}, {"url": "ftp://x"}, "prometheus.url"),
    ({"source": "prometheus"}, {"url": "http://x:9090", "selector": "{job=\"a\"}"}, "prometheus.selector"),
    ({"source": "prometheus"}, {"url": "http://x:9090", "lookback_s": 0}, "prometheus.lookback_s"),
    ({"source": "prometheus"}, {"url": "http://x:9090", "typo": 1}, "prometheus.typo"),
    ({"static": ["http://127.0.0.1:9740"]}, {"url": "http://x:9090"}, "prometheus"),
])
def test_config_errors_name_the_field(agents, prometheus, field):
    doc = {"controller": {"name": "c"}, "consul": {}, "agents": agents}
    if prometheus is not None:
        doc["prometheus"] = prometheus
    with pytest.raises(ConfigError) as exc:
        parse_config(doc)
    assert str(exc.value).startswith(f"{field}:") or f" {field}:" in str(exc.value) or field in str(exc.value)


def _collector(now: float = 5000.0) -> PrometheusCollector:
    config = parse_config({"controller": {"name": "c"}, "consul": {}, "agents": {"source": "prometheus"},
                           "prometheus": {"url": "http://127.0.0.1:9"}, "topology": {"azs": ["az-a", "az-b"]}})
    return PrometheusCollector(config.prometheus, evaluation_window_s=10.0, stale_after_s=5.0, clock=lambda: now,
                               topology=topology(("az-a", "az-b")))


def _as_target(doc: dict, instance: str, node: str | None = None) -> list:
    """The answer's series as another scrape target's (optionally under another node name)."""
    entries = copy.deepcopy(doc["data"]["result"])
    for entry in entries:
        entry["metric"]["instance"] = instance
        if node is not None:
            entry["metric"]["node"] = node
    return entries


def test_a_target_whose_series_carry_several_node_names_is_refused_whole():
    # One hostile target (sorting first) exposes its series as node-1, the honest node's
    # name, and as four invented nodes: it may speak for none of them.
    honest, doc = scraped_agent(ticks=3)
    _, evil = scraped_agent(ticks=3)
    hostile = [e for name in ("node-1", "fake-1", "fake-2", "fake-3", "fake-4")
               for e in _as_target(evil, "10.0.0.0:9740", name)]
    doc["data"]["result"] += hostile
    answer = parse_answer(doc, max_series=100_000)
    assert [s.node for s in answer.nodes.values()] == ["node-1"] and answer.refused_targets == 1
    assert answer.garbage_series == len(hostile)
    collector = _collector()
    assert collector.ingest(answer, 5000.0) == 3
    (cursor,) = collector.cursors.values()
    assert "10.0.0.1:9740" in cursor.target.url and cursor.boot_id == honest.boot_id
    assert sorted(collector.store.node_input()) == ["node-1"]


def test_a_name_two_targets_claim_stays_with_its_holder_or_goes_to_neither():
    honest, doc = scraped_agent(ticks=3)
    _, other = scraped_agent(ticks=3)  # another target naming node-1: another job, a replica, a liar
    both = copy.deepcopy(doc)
    both["data"]["result"] += _as_target(other, "10.0.0.0:9740")  # sorts first
    # Neither held the name: which comes first proves nothing, it goes to neither.
    collector = _collector()
    assert collector.ingest(parse_answer(both, max_series=10_000), 5000.0) == 0
    assert collector.cursors == {} and collector.counters.answers_refused == 2
    # The honest target held it first: it keeps it, the newcomer is refused.
    collector = _collector()
    assert collector.ingest(parse_answer(doc, max_series=10_000), 5000.0) == 3
    answer = parse_answer(both, max_series=10_000)
    assert len(answer.nodes) == 2 and answer.garbage_series == 0  # the collector decides, by who held it
    collector.ingest(answer, 5001.0)
    (cursor,) = collector.cursors.values()
    assert "10.0.0.1:9740" in cursor.target.url and cursor.boot_id == honest.boot_id
    assert collector.counters.answers_refused == 1
    assert {w.boot_id for w in collector.take_new()} == {honest.boot_id}  # one target's samples, never mixed


def test_cumulative_counters_past_2_32_are_counted_exactly():
    # An honest long-running agent: 2^32 connects and retransmits on every path so far.
    # Each window's delta is small; only the cumulative sample passes 2^32.
    agent = SyntheticAgent("node-1", "az-a", PATHS)
    agent.tick(end=999.0)
    for key in agent.totals:
        for name in ("conn_attempts", "conn_ok", "retrans"):
            agent.totals[key][name] += 2**32
    scrapes = [(1000.0, scrape(agent))]
    for i in range(1, 4):
        agent.tick(end=1000.0 + i)
        scrapes.append((1000.0 + i, scrape(agent)))
    answer = parse_answer(matrix(scrapes), max_series=10_000)
    assert answer.garbage_series == 0
    (series,) = answer.nodes.values()
    windows = node_windows(series, after=None).windows
    assert len(windows) == 3
    for got, sent in zip(windows, list(agent.ring)[-3:]):
        counts = {(p.src, p.dst): {n: getattr(p, n) for n in COUNTER_FIELDS} for p in got.paths}
        assert counts == {(p.src, p.dst): {n: getattr(p, n) for n in COUNTER_FIELDS} for p in sent.paths}


def test_a_garbage_series_drops_its_nodes_windows_not_a_part_of_them():
    # conn_ok with one sample out of bounds: windows built without it would be connects
    # without their successes (success 0 %); none of the node's windows of that answer
    # is built, and the cursor moves past them.
    _, doc = scraped_agent(ticks=2)
    ok = prom.COUNTER_SERIES["conn_ok"]
    bad = copy.deepcopy(doc)
    entry = next(e for e in bad["data"]["result"]
                 if e["metric"]["__name__"] == ok and e["metric"]["dst_az"] == "az-b")
    entry["values"][1][1] = "-1"
    answer = parse_answer(bad, max_series=10_000)
    assert answer.garbage_series == 1
    (series,) = answer.nodes.values()
    read = node_windows(series, after=None)
    assert read.windows == [] and read.garbage == 2 and read.newest == 1002.0


def test_a_timestamp_past_float_range_is_garbage_not_an_error():
    # A JSON integer of 400 digits: float() raises OverflowError, no ValueError handler
    # catches it. The series is garbage, the answer and the cycle go on.
    _, doc = scraped_agent(ticks=2)
    entry = next(e for e in doc["data"]["result"] if e["metric"]["__name__"] == prom.INFO_SERIES)
    entry["values"][0][0] = 10**400
    answer = parse_answer(doc, max_series=10_000)
    assert answer.garbage_series == 1 and len(answer.nodes) == 1


def test_a_forgotten_node_leaves_the_store_too():
    # Target churn (a new instance label per pod): each forgotten cursor takes its entry
    # in the store's agent -> node map with it, or the map grows for ever.
    now = [5000.0]
    config = parse_config({"controller": {"name": "c"}, "consul": {}, "agents": {"source": "prometheus"},
                           "prometheus": {"url": "http://127.0.0.1:9"}, "topology": {"azs": ["az-a", "az-b"]}})
    collector = PrometheusCollector(config.prometheus, evaluation_window_s=3.0, stale_after_s=5.0,
                                    clock=lambda: now[0], topology=topology(("az-a", "az-b")))
    _, doc = scraped_agent(ticks=2)

    async def churn() -> None:
        for i in range(5):
            pod = copy.deepcopy(doc)
            pod["data"]["result"] = _as_target(doc, f"10.1.0.{i}:9740", f"pod-{i}")
            assert collector.ingest(parse_answer(pod, max_series=10_000), now[0]) == 2
            now[0] += 100.0  # each pod long gone before the next appears
            await collector.pull_all()  # Prometheus unreachable: the cycle still prunes and forgets
        await collector.close()

    asyncio.run(churn())
    assert collector.cursors == {} and len(collector.store) == 0 and collector.store.agent_node == {}


def test_a_sample_missing_from_a_series_is_not_counted_twice_or_as_a_birth():
    agent, doc = scraped_agent(ticks=3)
    attempts = prom.COUNTER_SERIES["conn_attempts"]
    for entry in doc["data"]["result"]:
        if entry["metric"]["__name__"] == attempts:
            del entry["values"][1]  # the sample of the second scrape is missing
    (series,) = parse_answer(doc, max_series=10_000).nodes.values()
    windows = node_windows(series, after=None).windows
    per_window = [sum(p.conn_attempts for p in w.paths) for w in windows]
    assert sum(per_window) == sum(p.conn_attempts for w in agent.ring for p in w.paths)
    assert max(per_window) <= 2 * sum(p.conn_attempts for p in agent.ring[-1].paths)


# --- the answer as it streams in ------------------------------------------------------
def _stream(body: bytes, piece: int, max_series: int = 10_000):
    stream = AnswerStream(max_series)
    for i in range(0, len(body), piece):
        stream.feed(body[i:i + piece])
    return stream.close()


@pytest.mark.parametrize("piece", [1, 7, 1000, 1 << 20])
def test_the_stream_reads_what_json_loads_reads_wherever_the_body_is_cut(piece):
    _, doc = scraped_agent(ticks=3)
    for entry in doc["data"]["result"]:
        entry["metric"]["job"] = "zoné ✓"  # multi-byte UTF-8, cut anywhere
    doc = {"status": "success", "warnings": ["a", {"b": [1.5e3, None, True]}], "n": -12.5e-3,
           "data": {"extra": {"x": []}, **doc["data"]}}
    body = json.dumps(doc, ensure_ascii=False, indent=1).encode()
    got, want = _stream(body, piece), parse_answer(json.loads(body), max_series=10_000)
    assert got.garbage_series == want.garbage_series == 0 and got.newest == want.newest == 1003.0
    assert got.nodes.keys() == want.nodes.keys() and len(got.nodes) == 1
    for key in want.nodes:
        windows = node_windows(got.nodes[key], None).windows
        assert [w.to_json() for w in windows] == [w.to_json() for w in node_windows(want.nodes[key], None).windows]
        assert len(windows) == 3


def test_the_stream_refuses_the_series_past_max_series_before_the_answer_ends():
    _, doc = scraped_agent(ticks=1)
    body = json.dumps(doc).encode()
    cut = body[:body.rindex(b"]")]  # every series, the answer not finished
    stream = AnswerStream(max_series=5)
    with pytest.raises(PromAnswerTooLarge, match="max_series"):
        stream.feed(cut)


def test_the_stream_refuses_a_series_over_its_bound_before_it_ends():
    stream = AnswerStream(max_series=10)
    stream.feed(b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[')
    fed = 0
    with pytest.raises(PromAnswerTooLarge, match="characters"):
        while fed <= 2 * MAX_SERIES_CHARS:
            stream.feed(b'[1000.5,"1"],' * 1000)
            fed += 13_000
    assert fed <= MAX_SERIES_CHARS + 13_000


@pytest.mark.parametrize("body,error", [
    (b"<html>proxy error</html>", "not JSON"),
    (b'{"status":"error","errorType":"bad_data","error":"parse error"}', "query failed: parse error"),
    (b'{"status":"success","data":{"resultType":"vector","result":[]}}', "data: expected"),
    (b'{"status":"success","data":[1,2]}', "data: expected"),
    (b'{"status":"success","data":{"resultType":"matrix","result":[', "ends early"),
    (b'{"status":"success","data":{"resultType":"matrix","result":[]}} x', "extra data"),
    (b'{"status":"success","data":{"resultType":"matrix","result":[{"a":1 x}]}}', "not JSON"),
    (b'{"status":"success","n":12x,"data":{"resultType":"matrix","result":[]}}', "not JSON"),
    (b'{"status":"success","data":{"resultType":"matrix","result":[]},"s":"\xff"}', "utf-8"),
    (b'{7:1}', "not JSON"),
])
def test_the_stream_says_what_is_wrong_with_a_broken_answer(body, error):
    with pytest.raises(ValueError, match=error):
        _stream(body, 3)


# --- windows: one pass, only inside the horizon ---------------------------------------
def _node(info: list[float], counter: dict[float, float]) -> NodeSeries:
    series = NodeSeries(node="n1", info={t: ("az-a", "boot") for t in info})
    series.counters[("az-a", "az-b", "conn_attempts")] = Samples(array("d", counter), array("d", counter.values()))
    return series


def test_only_the_scrapes_inside_the_horizon_become_windows_counted_in_one_pass():
    # 4000 scrapes; the counter has a sample at every other one, so each window's t0 is
    # missing from it and counts from the sample before (what made the old delta rescan).
    scrapes = [1000.0 + i for i in range(4000)]
    series = _node(scrapes, {t: 7.0 * i for i, t in enumerate(scrapes) if i % 2})
    read = node_windows(series, None, horizon_s=5.0)
    assert [w.end for w in read.windows] == scrapes[-6:] and read.too_old == 3999 - 6
    assert [sum(p.conn_attempts for p in w.paths) for w in read.windows] == [0, 14, 0, 14, 0, 14]
    everything = node_windows(series, None)
    assert [w.to_json() for w in everything.windows[-6:]] == [w.to_json() for w in read.windows]
    assert len(everything.windows) == 3999
    # Born at the second scrape (counted from 0), then 14 every other window.
    assert sum(p.conn_attempts for w in everything.windows for p in w.paths) == 7 * 3999


def test_a_sample_between_two_scrapes_does_not_move_the_windows_start():
    # The sample at 1001.5 is no scrape of the node (its info sample is missing): the
    # window (1001, 1002] still counts from the sample at 1001.
    series = _node([1000.0, 1001.0, 1002.0], {1000.0: 10.0, 1001.0: 20.0, 1001.5: 25.0, 1002.0: 40.0})
    counts = [sum(p.conn_attempts for p in w.paths) for w in node_windows(series, None).windows]
    assert counts == [10, 20]
