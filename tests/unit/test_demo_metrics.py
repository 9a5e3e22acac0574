"""The figures of a scenario run, computed from synthetic KV timelines (pure)."""

from __future__ import annotations

import json

import pytest

from azprobe.dev.demo.metrics import (
    FaultEvent,
    KvSample,
    compute_metrics,
    direction_reversals,
    distinct_generations,
    doc_at,
    percentile,
)
from azprobe.dev.demo.scenarios import ALL_AZS, SCENARIOS, get_scenario
from azprobe.errors import ConfigError


def kv(t: float, gen: int, a: int, b: int, c: int, state: str = "ok", leader: str = "ctl-1") -> KvSample:
    return KvSample(t=t, generation=gen, shares={"az-a": a, "az-b": b, "az-c": c}, state=state, leader=leader)


# A textbook run: baseline 33/34/33, fault at t=10, drained by t=12.5, clear at t=30,
# recovered in steps by t=36.
TEXTBOOK = [
    kv(1.0, 1, 33, 34, 33),
    kv(11.0, 2, 40, 20, 40),
    kv(12.5, 3, 45, 10, 45),
    kv(13.5, 4, 46, 8, 46),
    kv(31.0, 5, 42, 16, 42),
    kv(33.0, 6, 38, 24, 38),
    kv(36.0, 7, 34, 32, 34),
]
EVENTS = [FaultEvent(10.0, "fault"), FaultEvent(30.0, "clear")]


def test_textbook_run_figures() -> None:
    m = compute_metrics(TEXTBOOK, EVENTS, ["az-b"])
    assert m.detect_s == 2.5  # 12.5: first generation with az-b < 15
    assert m.recover_s == 6.0  # 36.0: az-b = 32, within 5 of 34
    assert m.shares_before == {"az-a": 33, "az-b": 34, "az-c": 33}
    assert m.shares_during == {"az-a": 46, "az-b": 8, "az-c": 46}
    assert m.shares_after == {"az-a": 34, "az-b": 32, "az-c": 34}
    assert m.kv_writes == 7
    assert m.direction_reversals == 1  # down, then up
    assert m.min_share_seen == 8
    assert m.max_generation_gap == 17.5  # 13.5 -> 31.0: nothing moved during the fault
    assert m.min_share_during["az-b"] == 8
    assert m.max_share_after_drain == 10  # stayed drained until the clear
    assert m.takeover_s is None


def test_never_drained_means_no_detect_and_instant_recovery() -> None:
    flat = [kv(1.0, 1, 33, 34, 33), kv(20.0, 2, 33, 33, 34)]
    m = compute_metrics(flat, EVENTS, ["az-b"])
    assert m.detect_s is None
    assert m.recover_s == 0.0  # in force at the clear: already within 5 points of baseline


def test_never_recovered_is_none() -> None:
    m = compute_metrics(TEXTBOOK[:5], EVENTS, ["az-b"])  # ends at az-b = 16 (18 from 34)
    assert m.recover_s is None


def test_recovery_counts_only_once_the_share_stays_in_the_band() -> None:
    # Back within 5 points at 32, drained again at 34 (a relapse), back for good at 38.
    samples = [kv(1.0, 1, 33, 34, 33), kv(12.0, 2, 45, 10, 45), kv(32.0, 3, 34, 32, 34),
               kv(34.0, 4, 45, 10, 45), kv(38.0, 5, 34, 31, 35), kv(40.0, 6, 33, 34, 33)]
    m = compute_metrics(samples, EVENTS, ["az-b"])
    assert m.recover_s == 8.0


def test_a_drain_after_the_clear_is_not_a_recovery() -> None:
    # In the band when the fault is cleared (panic spread evenly), then drained: not recovered.
    samples = [kv(1.0, 1, 33, 34, 33), kv(12.0, 2, 34, 33, 33, state="panic"), kv(31.0, 3, 50, 49, 1)]
    m = compute_metrics(samples, EVENTS, ["az-a", "az-b", "az-c"])
    assert m.recover_s is None


def test_detect_counts_from_fault_start_not_from_first_sample_after() -> None:
    # Already below the threshold when the fault begins (a previous run): detect = 0.
    m = compute_metrics([kv(1.0, 1, 45, 10, 45)], EVENTS, ["az-b"])
    assert m.detect_s == 0.0


def test_no_baseline_means_no_recover_figure() -> None:
    # First KV write after the fault began: nothing to recover to.
    m = compute_metrics(TEXTBOOK[1:], EVENTS, ["az-b"])
    assert m.shares_before == {}
    assert m.recover_s is None
    assert m.detect_s == 2.5


def test_duplicate_and_backward_generations_are_dropped() -> None:
    samples = [kv(1.0, 1, 33, 34, 33), kv(1.5, 1, 33, 34, 33), kv(2.0, 3, 40, 20, 40), kv(2.5, 2, 10, 80, 10)]
    gens = distinct_generations(samples)
    assert [s.generation for s in gens] == [1, 3]
    m = compute_metrics(samples, [], ["az-b"])
    assert m.kv_writes == 2
    assert m.min_share_seen == 20  # the stale generation 2 never counts


def test_doc_at_is_a_step_function() -> None:
    assert doc_at(TEXTBOOK, 0.5) is None
    assert doc_at(TEXTBOOK, 12.5).generation == 3
    assert doc_at(TEXTBOOK, 12.49).generation == 2


def test_flap_recover_counts_from_the_last_clear() -> None:
    events = [FaultEvent(10.0, "fault"), FaultEvent(15.0, "clear"), FaultEvent(20.0, "fault"),
              FaultEvent(30.0, "clear")]
    m = compute_metrics(TEXTBOOK, events, ["az-b"])
    assert m.recover_s == 6.0
    assert m.detect_s == 2.5


@pytest.mark.parametrize(
    "series, expected",
    [
        ([34, 20, 10, 8, 16, 24, 32], 1),
        ([34, 34, 34], 0),
        ([34, 10, 34, 10, 34], 3),
        ([34, 10, 10, 10, 20], 1),  # flat stretches are not a direction
        ([], 0),
        ([5], 0),
    ],
)
def test_direction_reversals(series: list[int], expected: int) -> None:
    assert direction_reversals(series) == expected


def test_oscillating_run_reports_reversals_for_the_sick_az_only() -> None:
    samples = [kv(float(i), i + 1, 33, b, 67 - b) for i, b in enumerate([34, 10, 30, 10, 30])]
    m = compute_metrics(samples, [FaultEvent(0.5, "fault"), FaultEvent(10.0, "clear")], ["az-b"])
    assert m.direction_reversals == 3
    assert m.max_share_after_drain == 30  # drained at t=1, pulled back to 30 while still sick


def test_all_zones_panic_sums_every_sick_zone_and_sees_the_state() -> None:
    samples = [kv(1.0, 1, 33, 34, 33), kv(12.0, 2, 34, 33, 33, state="panic")]
    m = compute_metrics(samples, EVENTS, ["az-a", "az-b", "az-c"])
    assert m.states_seen == ["ok", "panic"]
    assert m.detect_s is None  # nobody drained
    assert min(m.min_share_during.values()) == 33


def test_failover_takeover_and_gap() -> None:
    samples = [kv(float(t), t, 45, 10, 45, leader="ctl-1") for t in range(1, 11)]
    samples += [kv(13.5, 11, 45, 10, 45, leader="ctl-2"), kv(14.5, 12, 45, 10, 45, leader="ctl-2")]
    events = [FaultEvent(0.5, "fault"), FaultEvent(10.2, "kill-leader", "ctl-1"), FaultEvent(20.0, "clear")]
    leader_events = [(0.2, "ctl-1"), (11.5, None), (12.5, "ctl-2")]
    m = compute_metrics(samples, events, ["az-b"], leader_events=leader_events)
    assert m.takeover_s == 3.3
    assert m.lock_released_s == 1.3  # session expiry freed the lock
    assert m.write_after_release_s == 2.0  # 11.5 -> 13.5: lock-delay + one cycle
    assert m.max_generation_gap == 3.5  # 10.0 -> 13.5
    assert m.leaders_seen == ["ctl-1", "ctl-2"]


def test_to_json_has_the_contract_keys() -> None:
    doc = compute_metrics(TEXTBOOK, EVENTS, ["az-b"]).to_json()
    for key in ("detect_s", "recover_s", "shares_before", "shares_during", "shares_after", "kv_writes",
                "direction_reversals", "min_share_seen", "max_generation_gap"):
        assert key in doc


def test_percentile_nearest_rank() -> None:
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 100) == 5.0
    assert percentile([2.0], 50) == 2.0
    assert percentile([], 50) is None


# --- scenarios as data -------------------------------------------------------------

def test_default_timeline_is_fault_then_clear() -> None:
    steps = get_scenario("delay-loss").timeline(12)
    assert [(s.at_s, s.action) for s in steps] == [(0.0, "fault"), (12, "clear")]
    assert steps[0].faults[0].az == "az-b"
    assert steps[0].faults[0].fault.delay_ms == 200
    assert steps[0].faults[0].fault.loss_pct == 5


def test_flap_toggles_every_period_and_ends_cleared() -> None:
    steps = get_scenario("flap").timeline(20)
    assert [(s.at_s, s.action) for s in steps] == [
        (0.0, "fault"), (5.0, "clear"), (10.0, "fault"), (15.0, "clear"), (20, "clear")]


def test_failover_kills_the_leader_mid_run() -> None:
    scenario = get_scenario("controller-failover")
    assert scenario.controllers == 2
    steps = scenario.timeline(40)
    assert [(s.at_s, s.action) for s in steps] == [(0.0, "fault"), (10.0, "kill-leader"), (40, "clear")]


def test_all_zones_resolves_to_every_lab_az() -> None:
    scenario = get_scenario("all-zones")
    assert scenario.faults[0].az == ALL_AZS
    assert scenario.sick_azs(["az-a", "az-b", "az-c"]) == ["az-a", "az-b", "az-c"]
    assert get_scenario("blackhole").sick_azs(["az-a", "az-b", "az-c"]) == ["az-b"]


def test_gray_host_hurts_one_server_and_no_zone() -> None:
    from azprobe.dev.demo.scenarios import FaultSpec, Scenario
    from azprobe.dev.lab.faults import Fault

    gray = get_scenario("gray-host")
    assert gray.sick_azs(["az-a", "az-b", "az-c"]) == [] and not gray.expect_drain
    assert gray.servers_per_az >= 2 and [(f.az, f.server) for f in gray.faults] == [("az-b", 1)]
    assert "server 1 of az-b" in gray.faults[0].describe()
    with pytest.raises(ConfigError, match="servers_per_az"):
        Scenario("x", "x", (FaultSpec("az-b", Fault(delay_ms=1), server=1),))
    with pytest.raises(ConfigError, match="server"):
        FaultSpec("az-b", Fault(delay_ms=1), uplink=True, server=0)


def test_every_issue_scenario_exists() -> None:
    assert set(SCENARIOS) >= {"delay-loss", "blackhole", "syn-loss", "all-zones", "flap", "controller-failover"}


def test_unknown_scenario_and_bad_duration_name_the_flag() -> None:
    with pytest.raises(ConfigError, match="--scenario"):
        get_scenario("nope")
    with pytest.raises(ConfigError, match="--fault-s"):
        get_scenario("delay-loss").timeline(0)


# --- the live view (pure rendering) ------------------------------------------------

def _window(seq: int, paths: list[dict]) -> "object":
    from azprobe.contracts.window import parse_window

    return parse_window({"schema": 1, "node": "n", "az": "az-a", "boot_id": "b", "seq": seq,
                         "start": 100.0 + seq, "end": 101.0 + seq, "util": {"cpu": 0.1, "mem": 0.2},
                         "paths": paths, "lost_events": 0})


def test_view_paths_merge_windows_per_path() -> None:
    from azprobe.commands.top import summarise

    p = {"src": "az-a", "dst": "az-b", "conn_attempts": 10, "conn_ok": 9, "conn_timeout": 1,
         "syn_retrans": 2, "rto": 1, "rtt_us": {"scheme": "loglin-16", "counts": {"196608": 5}}}
    rows = summarise([_window(1, [p]), _window(2, [p])])
    assert len(rows) == 1
    row = rows[0]
    assert (row.src, row.dst) == ("az-a", "az-b")
    assert row.conn_per_s == 10.0  # 20 attempts over 2 s
    assert row.failure_pct == pytest.approx(10.0)
    assert row.syn_retrans == 4 and row.rto == 2
    assert 195 <= row.p95_rtt_ms <= 215
    assert row.p95_connect_ms is None


def test_render_shows_phase_paths_zones_and_figures() -> None:
    from azprobe.dev.demo.view import ViewState, ZoneRow, render, render_line
    from azprobe.commands.top import PathSummary

    state = ViewState(
        scenario="delay-loss", description="az-b sick", phase="fault", phase_elapsed_s=3.0,
        fault="az-b: +200 ms, 5 % loss",
        paths=[PathSummary("az-a", "az-b", 201.0, 203.0, 12.0, 5.0, 3, 1, 24)],
        zones=[ZoneRow("az-a", 46, 1.0, 0.99, "ok"), ZoneRow("az-b", 8, 0.14, 0.1, "degraded"),
               ZoneRow("az-c", 46, 1.0, 0.99, "ok")],
        generation=9, doc_state="degraded", leader="ctl-1", kv_writes=9, detect_s=2.4)
    plain = render(state, ansi=False, sick=["az-b"])
    text = "\n".join(plain)
    assert "FAULT" in text and "+200 ms" in text
    assert "az-a>az-b" in text and "201.0" in text
    assert any(line.startswith("az-b") and "8%" in line and "degraded" in line for line in plain)
    assert "detect 2.4s" in text and "recover -" in text
    assert "\x1b[" not in text
    assert any("\x1b[31m" in line for line in render(state, ansi=True, sick=["az-b"]))
    line = render_line(state, 12.0)
    assert "az-a=46 az-b=8 az-c=46" in line and "phase=fault" in line and "gen=9" in line
    assert "\n" not in line


def test_render_before_any_data_says_what_it_waits_for() -> None:
    from azprobe.dev.demo.view import ViewState, render, render_line

    text = "\n".join(render(ViewState("flap", "d", "starting"), ansi=False))
    assert "waiting for the agent" in text and "waiting for the controller" in text
    assert "shares=-" in render_line(ViewState("flap", "d", "starting"), 0.0)


# --- generated configs ---------------------------------------------------------------

def test_generated_controller_config_passes_the_controllers_parser() -> None:
    import tomllib

    from azprobe.dev.demo.configs import ControllerPlan, controller_config
    from azprobe.controller.config import parse_config

    text = controller_config(ControllerPlan("ctl-2", "127.0.0.1:19741"), consul_url="http://127.0.0.1:18500",
                             prefix="azprobe/demo-1/", agent_urls=["http://127.0.0.1:19740"],
                             azs=["az-a", "az-b"], lock_delay_s=2.0, heartbeat_s=1.0)
    config = parse_config(tomllib.loads(text))
    assert config.controller.name == "ctl-2"
    assert config.controller.lock_delay_s == 2.0 and config.controller.session_ttl_s == 10.0
    assert config.controller.interval_s == 1.0
    assert config.controller.listen == ("127.0.0.1", 19741)
    assert config.agents.static == ("http://127.0.0.1:19740",)
    assert config.consul.prefix == "azprobe/demo-1/"
    assert config.heartbeat_s == 1.0
    assert config.topology.azs == ("az-a", "az-b")


def test_agent_config_copy_changes_only_listen_and_interval() -> None:
    import tomllib

    from azprobe.agent.config import parse_agent_config
    from azprobe.dev.demo.configs import agent_config_for_demo

    lab_doc = {"node": {"name": "lab", "az": "az-a"}, "agent": {"listen": "127.0.0.1:9740", "interval_s": 1.0},
               "topology": {"az-a": ["198.18.1.0/24"], "az-b": ["198.18.2.0/24", "2001:2:0:20::/60"]}}
    config = parse_agent_config(tomllib.loads(agent_config_for_demo(lab_doc, "127.0.0.1:19999")))
    assert config.listen == ("127.0.0.1", 19999)
    assert config.az == "az-a" and config.interval_s == 1.0
    faster = parse_agent_config(tomllib.loads(agent_config_for_demo(lab_doc, "127.0.0.1:19999", interval_s=0.5)))
    assert faster.interval_s == 0.5 and faster.topology == config.topology
    assert [str(n) for n in config.topology["az-b"]] == ["198.18.2.0/24", "2001:2:0:20::/60"]


def test_sample_from_a_real_weights_document() -> None:
    from azprobe.contracts.weights import parse_weights

    zone = {"weight": 1.0, "health": 0.99, "success": 0.999, "p95_ms": 1.2, "util": 0.1, "samples": 500,
            "state": "ok", "reasons": []}
    doc = parse_weights(json.dumps({
        "schema": 1, "generation": 7, "generated_at": 1.0e9, "expires_at": 1.0e9 + 30, "source_az": None,
        "leader": "ctl-1", "model": "default", "state": "degraded",
        "zones": {"az-a": {**zone, "share": 46}, "az-b": {**zone, "share": 8, "weight": 0.2, "state": "degraded"},
                  "az-c": {**zone, "share": 46}}}))
    s = KvSample.from_doc(3.5, doc)
    assert (s.t, s.generation, s.state, s.leader) == (3.5, 7, "degraded", "ctl-1")
    assert s.shares == {"az-a": 46, "az-b": 8, "az-c": 46}
    assert s.zone_states["az-b"] == "degraded" and s.weights["az-b"] == 0.2

    from azprobe.dev.demo.view import zone_rows

    rows = zone_rows(doc)
    assert [(r.az, r.share, r.state) for r in rows] == [("az-a", 46, "ok"), ("az-b", 8, "degraded"),
                                                         ("az-c", 46, "ok")]


def test_frame_redraws_in_place() -> None:
    from azprobe.dev.demo.view import ERASE_BELOW, ERASE_LINE, HOME, frame

    out = frame(["a", "bb"])
    assert out.startswith(HOME) and out.endswith(ERASE_BELOW)
    assert out.count(ERASE_LINE) == 2 and "\x1b[2J" not in out  # no full clear: no flicker


def test_run_checks_and_summary_follow_the_scenario() -> None:
    from azprobe.dev.demo.cli import _summary
    from azprobe.dev.demo.runner import ScenarioResult

    drained = ScenarioResult("delay-loss", ["az-b"], 30.0, compute_metrics(TEXTBOOK, EVENTS, ["az-b"]), TEXTBOOK, EVENTS)
    assert drained.checks() == {"recovered": True, "drained": True}
    never = compute_metrics(TEXTBOOK[:5], EVENTS, ["az-b"])
    panic = ScenarioResult("all-zones", ["az-b"], 30.0, never, TEXTBOOK[:5], EVENTS, expect_drain=False, expect_panic=True)
    assert panic.checks() == {"recovered": False, "panic_seen": False}
    text = _summary(panic.to_json())
    assert "recover   never" in text and "panic_seen FAILED" in text
    doc = drained.to_json()
    assert doc["scenario"] == "delay-loss" and doc["detect_s"] == 2.5 and doc["checks"]["drained"]
