"""The controller's cycle in-process (fake agents over real HTTP, a real devconsul): operator
controls read from KV and shown in the document, and the spike detector's wiring into
metrics and logs. Driven round by round (cycle(), consul_tick()), so nothing waits on a
timer."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import consul

from azprobe.controller.config import parse_config
from azprobe.controller.detector import DetectorConfig, ZoneSpikeDetectors
from azprobe.controller.main import Controller
from tests.controller_harness import drive_rounds, read_weights
from tests.fakeagent import FakeAgentServer, PathSpec, zone_agents

AZS = ["az-a", "az-b", "az-c"]


def _controller(devconsul, server: FakeAgentServer) -> Controller:
    config = parse_config({
        "controller": {"name": "ctl", "listen": "127.0.0.1:9", "interval_s": 0.2, "evaluation_window_s": 2.0,
                       "lock_delay_s": 0},
        "consul": {"address": devconsul.url},
        "agents": {"static": [server.url(k) for k in server.agents]},
        "safety": {"drain_dwell_s": 0, "max_decrease_points": 100, "max_increase_points": 100},
        "topology": {"azs": ["az-a", "az-b", "az-c"]},
    })
    return Controller(config)


def _rounds(ctl: Controller, server: FakeAgentServer, n: int) -> None:
    drive_rounds(ctl, server.agents.values(), rounds=n, simulated_clock=False)


def test_operator_shift_and_freeze_are_honoured_and_shown(devconsul):
    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    with FakeAgentServer() as server:
        for key, agent in zone_agents(AZS, 1).items():
            server.add(key, agent)
        ctl = _controller(devconsul, server)
        _rounds(ctl, server, 3)
        assert sorted(z.share for z in read_weights(client).zones.values()) == [33, 33, 34]

        client.kv.put("azprobe/v1/control/shift/az-b", json.dumps({"until": time.time() + 600,
                                                                   "reason": "maintenance"}))
        _rounds(ctl, server, 3)
        doc = read_weights(client)
        assert doc.zones["az-b"].state == "shifted" and doc.zones["az-b"].share == 1
        assert any("control/shift/az-b" in r for r in doc.zones["az-b"].reasons)
        assert doc.state == "degraded"
        shifted_shares = {az: z.share for az, z in doc.zones.items()}

        client.kv.put("azprobe/v1/control/freeze", "")
        client.kv.delete("azprobe/v1/control/shift/az-b")
        _rounds(ctl, server, 3)
        doc = read_weights(client)
        assert doc.state == "frozen" and all(z.state == "frozen" for z in doc.zones.values())
        assert {az: z.share for az, z in doc.zones.items()} == shifted_shares  # held, not recomputed

        client.kv.delete("azprobe/v1/control/freeze")
        _rounds(ctl, server, 3)
        doc = read_weights(client)
        assert doc.state == "ok" and doc.zones["az-b"].share > 1
        ctl.consul.election.release()


def test_spike_detector_is_wired_to_metrics_and_logs(devconsul, caplog):
    with FakeAgentServer() as server:
        agents = zone_agents(AZS, 1)
        for key, agent in agents.items():
            server.add(key, agent)
        ctl = _controller(devconsul, server)
        # Short detector buckets so the 60-bucket method warms up within the test; the
        # daemon uses the documents' 10 s buckets.
        ctl.decider.detectors = ZoneSpikeDetectors(DetectorConfig(bucket_s=0.05, warmup_buckets=3, min_failures=5))
        quiet = PathSpec(dst="az-c", conn_attempts=50, failures=1)
        for agent in agents.values():
            agent.paths = [p if p.dst != "az-c" else quiet for p in agent.paths]

        clock = [time.time()]
        ctl.decider.wall = ctl.consul.wall = lambda: clock[0]

        async def run() -> None:
            for _ in range(8):
                for agent in agents.values():
                    agent.emit(interval_s=0.2)
                await ctl.cycle()
                clock[0] += 0.05  # one detector bucket per round
            burst = PathSpec(dst="az-c", conn_attempts=50, failures=40)
            for agent in agents.values():
                agent.paths = [p if p.dst != "az-c" else burst for p in agent.paths]
                agent.emit(interval_s=0.2)
            with caplog.at_level(logging.INFO, logger="azprobe.controller"):
                await ctl.cycle()
            await ctl.collector.close()

        asyncio.run(run())
        render = ctl.metrics.render().decode()
        assert 'azprobe_detector_spike{az="az-c"} 1.0' in render
        assert 'azprobe_detector_spikes_total{az="az-c"} 1.0' in render
        assert 'azprobe_detector_spike{az="az-a"} 0.0' in render
        assert any(r.getMessage().startswith("zone az-c: spike:") for r in caplog.records)
        ctl.consul.election.release()
