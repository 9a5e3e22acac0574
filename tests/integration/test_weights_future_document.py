"""A valid weights document dated far in the future (generation 2^52 + 1, generated_at
9e10) must not freeze the readers: the real controller (in-process, real devconsul, real
fake agents over HTTP) restarts its numbering in a new term, and a real WeightWatcher -
one that held a good document before, and one started while the future document was in
KV - refuses the future document and follows the new term down to az-b drained."""

from __future__ import annotations

import asyncio
import json

import consul

from azprobe.clients.consul import ConsulSettings
from azprobe.consumers.watch import EMPTY, FRESH, WeightWatcher
from azprobe.controller.config import parse_config
from azprobe.controller.main import Controller
from tests.controller_harness import read_weights
from tests.fakeagent import FakeAgentServer, PathSpec, zone_agents
from tests.helpers import wait_for

AZS = ["az-a", "az-b", "az-c"]
KEY = "azprobe/v1/weights"
FUTURE_GENERATION = 2**52 + 1
DOWN = PathSpec(dst="az-b", conn_attempts=50, failures=50, rtt_ms=2000.0)


def _future_document() -> str:
    zone = {"weight": 1.0, "health": 1.0, "success": 1.0, "p95_ms": 10.0, "util": 0.3, "samples": 500,
            "state": "ok", "reasons": ["forged"]}
    return json.dumps({"schema": 1, "generation": FUTURE_GENERATION, "generated_at": 9e10,
                       "expires_at": 9e10 + 90, "source_az": None, "leader": "ctl-old", "model": "default",
                       "state": "ok", "zones": {"az-a": {**zone, "share": 34}, "az-b": {**zone, "share": 33},
                                                "az-c": {**zone, "share": 33}}})


def _controller(name: str, consul_url: str, urls: list[str]) -> Controller:
    return Controller(parse_config({
        "controller": {"name": name, "listen": "127.0.0.1:9", "interval_s": 0.2, "evaluation_window_s": 1.0,
                       "lock_delay_s": 0},
        "consul": {"address": consul_url},
        "agents": {"static": urls},
        "topology": {"azs": AZS},
        "safety": {"drain_dwell_s": 0},
    }))


def _run_until(ctl: Controller, server: FakeAgentServer, done, timeout: float = 30.0) -> None:
    """Controller rounds (agents emit, cycle, Consul tick) until done() or the deadline."""
    async def run() -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while not done():
                assert loop.time() < deadline, "the controller never got there"
                for agent in server.agents.values():
                    agent.emit(interval_s=0.2)
                await ctl.cycle()
                await asyncio.to_thread(ctl.consul_tick)
        finally:
            await ctl.collector.close()

    asyncio.run(run())


def _watcher(url: str) -> WeightWatcher:
    return WeightWatcher(ConsulSettings(address=url), wait_s=5.0, backoff_base_s=0.05, backoff_cap_s=0.5)


def test_a_future_dated_document_neither_freezes_a_running_watcher_nor_a_new_one(devconsul):
    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    with FakeAgentServer() as server, _watcher(devconsul.url) as running:
        agents = zone_agents(AZS, 1)
        for key, agent in agents.items():
            server.add(key, agent)
        urls = [server.url(k) for k in server.agents]

        first = _controller("ctl-1", devconsul.url, urls)
        _run_until(first, server, lambda: running.snapshot() is not None)
        held = running.snapshot()
        assert held.leader == "ctl-1" and running.status().state == FRESH
        first.consul.election.release()

        rejected = running.rejected
        client.kv.put(KEY, _future_document())
        wait_for(lambda: running.rejected > rejected or running.snapshot() != held, timeout=5,
                 message="the running watcher answering the future document")
        refused_while_running = (running.rejected - rejected, running.snapshot() == held, running.status().state)

        with _watcher(devconsul.url) as started_late:
            assert started_late.wait_answered(timeout=10)
            wait_for(lambda: started_late.rejected or started_late.snapshot(), timeout=5,
                     message="the late watcher answering the future document")
            refused_at_start = (started_late.status().state, started_late.status().last_error or "")

            second = _controller("ctl-2", devconsul.url, urls)
            _run_until(second, server, lambda: (read_weights(client) or held).leader == "ctl-2")
            restarted = read_weights(client)
            assert restarted.generation == 1 and second.consul.publisher.counters.generation_restarts == 1
            for agent in agents.values():  # az-b's outage, seen from every AZ
                agent.paths = [DOWN if p.dst == "az-b" else p for p in agent.paths]

            def drained() -> bool:
                doc = read_weights(client)
                return doc.zones["az-b"].state == "degraded" and doc.zones["az-b"].share <= 5

            _run_until(second, server, drained)
            outage = read_weights(client)
            assert 2 <= outage.generation < 100
            for watcher in (running, started_late):
                wait_for(lambda: (watcher.snapshot() or held).generation == outage.generation, timeout=5,
                         message="the watcher following the new term")
                status = watcher.status()
                assert status.state == FRESH and status.doc.generation != FUTURE_GENERATION
                assert watcher.snapshot().zones["az-b"].share == outage.zones["az-b"].share <= 5
            second.consul.election.release()
        assert refused_while_running == (1, True, FRESH)  # refused, the good document kept
        assert refused_at_start[0] == EMPTY and "from the future" in refused_at_start[1]
        assert restarted.term is not None and restarted.term != held.term and outage.term == restarted.term
