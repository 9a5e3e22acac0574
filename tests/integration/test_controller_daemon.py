"""`azprobe controller` as a real subprocess, with a real devconsul and fake agents over
real HTTP: it writes valid fenced weights, counts and ignores garbage, holds
last-known-good when every agent goes stale and then falls back to equal shares."""

from __future__ import annotations

import consul
import pytest

from azprobe.contracts.weights import WeightsDoc
from tests.controller_harness import ControllerProcess, leader_holder, read_weights
from tests.fakeagent import FakeAgentServer, PathSpec, zone_agents
from tests.helpers import wait_for

AZS = ["az-a", "az-b", "az-c"]
SICK_C = {"az-c": PathSpec(dst="az-c", conn_attempts=50, failures=10, rtt_ms=210.0)}


@pytest.fixture
def agents():
    server = FakeAgentServer(interval_s=0.2)
    for key, agent in zone_agents(AZS, 2, sick=SICK_C).items():
        server.add(key, agent)
    with server:
        yield server


def _client(dc) -> consul.Consul:
    return consul.Consul(host=dc.host, port=dc.port)


def _drained(doc: WeightsDoc | None) -> WeightsDoc | None:
    return doc if doc is not None and doc.zones.get("az-c") is not None and doc.zones["az-c"].share <= 10 else None


def test_writes_fenced_weights_and_per_source_views(devconsul, agents, tmp_path):
    client = _client(devconsul)
    with ControllerProcess.make(tmp_path, "ctl-1", devconsul.url, [agents.url(k) for k in agents.agents]) as ctl:
        doc = wait_for(lambda: _drained(read_weights(client)), timeout=20, message="az-c drained in KV")
        assert set(doc.zones) == set(AZS) and sum(z.share for z in doc.zones.values()) == 100
        assert doc.leader == "ctl-1" and doc.source_az is None and doc.expires_at > doc.generated_at
        assert doc.zones["az-c"].state == "degraded" and doc.zones["az-c"].reasons
        assert leader_holder(client)["name"] == "ctl-1"
        # Every source AZ gets its own view, written in the same transaction (same generation).
        for src in AZS:
            view = wait_for(lambda: read_weights(client, f"azprobe/v1/weights/from/{src}"), timeout=5,
                            message=f"view from {src}")
            assert view.source_az == src and set(view.zones) == set(AZS)
        # Unchanged shares are not rewritten every cycle (heartbeat 30 s): generation stays put
        # while the controller keeps cycling.
        first = read_weights(client).generation
        cycles = ctl.metric("azprobe_controller_cycle_seconds_count")
        wait_for(lambda: ctl.metric("azprobe_controller_cycle_seconds_count") >= cycles + 10, timeout=10,
                 message="ten more cycles")
        assert read_weights(client).generation - first <= 1  # at most one share step in between
        health = ctl.healthz()
        assert health["leader"] is True and health["consul_up"] is True
        assert ctl.metric("azprobe_controller_leader") == 1.0
        assert ctl.metric("azprobe_zone_share", az="az-c") == doc.zones["az-c"].share
        assert ctl.metric("azprobe_controller_kv_writes_total") >= 1
        assert ctl.metric("azprobe_controller_agents", state="up") == 6
        assert "token" not in ctl.log().lower()


def test_garbage_windows_counted_and_ignored(devconsul, agents, tmp_path):
    client = _client(devconsul)
    victim = agents.agents["az-a-0"]
    with ControllerProcess.make(tmp_path, "ctl-1", devconsul.url, [agents.url(k) for k in agents.agents]) as ctl:
        wait_for(lambda: _drained(read_weights(client)), timeout=20, message="first weights")
        garbage = [
            {"schema": 1, "seq": victim.next_seq(), "node": "x"},  # fields missing
            {**victim.emit(), "seq": victim.next_seq(), "util": {"cpu": float("nan"), "mem": 0.1}},
            {**victim.emit(), "seq": victim.next_seq(),
             "paths": [{"src": "az-a", "dst": "az-b", "conn_attempts": -1}]},
            {**victim.emit(), "seq": victim.next_seq(), "schema": 99},
        ]
        for doc in garbage:
            victim.push_raw(doc)
        wait_for(lambda: ctl.metric("azprobe_controller_collect_windows_garbage_total") == 4, timeout=10,
                 message="4 garbage windows counted")
        # Ignored, not fatal: the controller keeps writing valid documents and the agent stays up.
        doc = read_weights(client)
        assert sum(z.share for z in doc.zones.values()) == 100
        wait_for(lambda: ctl.metric("azprobe_controller_agents", state="up") == 6, timeout=5, message="all up")
        assert ctl.running
        # Each garbage window is counted once, not once per pull.
        cycles = ctl.metric("azprobe_controller_cycle_seconds_count")
        wait_for(lambda: ctl.metric("azprobe_controller_cycle_seconds_count") >= cycles + 5, timeout=10,
                 message="five more cycles")
        assert ctl.metric("azprobe_controller_collect_windows_garbage_total") == 4


def test_all_agents_stale_holds_last_known_good_then_equal(devconsul, agents, tmp_path):
    client = _client(devconsul)
    with ControllerProcess.make(tmp_path, "ctl-1", devconsul.url, [agents.url(k) for k in agents.agents],
                                safety={"stale_after_s": 2, "equal_after_s": 5}) as ctl:
        wait_for(lambda: _drained(read_weights(client)), timeout=20, message="az-c drained")
        # Let the drain settle (share steps are capped per cycle) before freezing the agents.
        wait_for(lambda: read_weights(client).zones["az-c"].share == 1, timeout=20, message="az-c at the floor")
        before = read_weights(client)
        for agent in agents.agents.values():
            agent.paused = True  # agents answer, but no new windows: the data goes stale
        held = wait_for(lambda: (d := read_weights(client)) is not None and d.state == "stale" and d,
                        timeout=15, message="overall state stale")
        # Past stale_after_s every zone is marked stale, and the shares are still held.
        stale = wait_for(lambda: (d := read_weights(client)) is not None
                         and all(z.state == "stale" for z in d.zones.values()) and d,
                         timeout=15, message="every zone stale")
        # Last-known-good: exactly the shares from before, never zero or empty.
        lkg = {az: z.share for az, z in before.zones.items()}
        assert {az: z.share for az, z in held.zones.items()} == lkg
        assert {az: z.share for az, z in stale.zones.items()} == lkg
        equal = wait_for(lambda: (d := read_weights(client)) is not None
                         and sorted(z.share for z in d.zones.values()) == [33, 33, 34] and d,
                         timeout=15, message="equal shares after equal_after_s")
        assert equal.state == "stale" and equal.generated_at - held.generated_at >= 3  # equal_after_s 5 minus slack for load
        assert ctl.metric("azprobe_controller_agents", state="stale") == 6
        # Agents come back: fresh evidence drains az-c again.
        for agent in agents.agents.values():
            agent.paused = False
        wait_for(lambda: read_weights(client).zones["az-c"].share <= 10, timeout=20, message="az-c drained again")


def test_sighup_reloads_the_agent_list_and_survives_a_bad_edit(devconsul, agents, tmp_path):
    import signal

    from azprobe.config import dump_toml

    urls = [agents.url(k) for k in agents.agents]
    with ControllerProcess.make(tmp_path, "ctl-1", devconsul.url, urls[:2]) as ctl:
        wait_for(lambda: ctl.metric("azprobe_controller_agents", state="up") == 2, timeout=15, message="2 agents")
        ctl.config["agents"]["static"] = urls
        ctl.config_path.write_text(dump_toml(ctl.config))
        ctl.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: ctl.metric("azprobe_controller_agents", state="up") == 6, timeout=15,
                 message="6 agents after SIGHUP")
        ctl.config_path.write_text("[agents]\nstatic = [\n")  # a broken edit
        ctl.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload failed" in ctl.log(), timeout=10, message="the failed reload is logged")
        assert ctl.running and ctl.metric("azprobe_controller_agents", state="up") == 6
