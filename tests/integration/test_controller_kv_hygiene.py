"""KV hygiene: an implausible weights document in KV never wedges the leader, and Consul
failing the weights transaction (HTTP 500) is retried with backoff under the same lock
instead of flapping leadership every tick. Real devconsul; the 500s come from a small
HTTP proxy in front of it that fails /v1/txn while told to."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import aiohttp
import consul
import pytest
from aiohttp import web

from azprobe.controller.config import parse_config
from azprobe.controller.main import Controller
from tests.controller_harness import ControllerProcess, read_weights
from tests.fakeagent import FakeAgentServer, PathSpec, zone_agents
from tests.helpers import wait_for

AZS = ["az-a", "az-b", "az-c"]


class FailingTxnProxy:
    """Forwards every request to devconsul, except PUT /v1/txn while `fail` is set (500)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.fail = False
        self.txn_calls = 0
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.path == "/v1/txn":
            self.txn_calls += 1
            if self.fail:
                return web.Response(status=500, text="injected: rpc error")
        async with aiohttp.ClientSession() as session:
            async with session.request(request.method, self.upstream + request.path_qs, data=body,
                                       headers={k: v for k, v in request.headers.items() if k.lower() != "host"}) \
                    as resp:
                data = await resp.read()
                headers = {k: v for k, v in resp.headers.items()
                           if k.lower() in ("content-type",) or k.lower().startswith("x-consul")}
                return web.Response(status=resp.status, body=data, headers=headers)

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> "FailingTxnProxy":
        threading.Thread(target=self._serve, daemon=True).start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)


def _controller(consul_url: str, urls: list[str]) -> Controller:
    return Controller(parse_config({
        "controller": {"name": "ctl", "listen": "127.0.0.1:9", "interval_s": 0.2, "evaluation_window_s": 2.0,
                       "lock_delay_s": 0},
        "consul": {"address": consul_url},
        "agents": {"static": urls},
        "topology": {"azs": AZS},
    }))


def _rounds(ctl: Controller, server: FakeAgentServer, n: int, between=None) -> None:
    async def run() -> None:
        for i in range(n):
            for agent in server.agents.values():
                agent.emit(interval_s=0.2)
            await ctl.cycle()
            await asyncio.to_thread(ctl.consul_tick)
            if between:
                between(i)
        await ctl.collector.close()

    asyncio.run(run())


@pytest.mark.parametrize("foreign", [
    json.dumps({"schema": 1, "generation": 2**53, "generated_at": time.time(), "expires_at": time.time() + 90,
                "source_az": None, "leader": "someone", "model": "default", "state": "ok",
                "zones": {"az-a": {"weight": 1.0, "share": 100, "health": 1.0, "success": 1.0, "p95_ms": 1.0,
                                   "util": 0.1, "samples": 100, "state": "ok", "reasons": []}}}),
    '{"generation": 1152921504606846976, "garbage": true}',  # not a weights document, generation 2^60
])
def test_an_implausible_generation_in_kv_does_not_wedge_the_leader(devconsul, foreign):
    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    client.kv.put("azprobe/v1/weights", foreign)
    with FakeAgentServer() as server:
        for key, agent in zone_agents(AZS, 1).items():
            server.add(key, agent)
        ctl = _controller(devconsul.url, [server.url(k) for k in server.agents])
        _rounds(ctl, server, 2)
        doc = read_weights(client)  # parses: a valid document replaced the foreign one
        assert doc is not None and doc.leader == "ctl" and 1 <= doc.generation <= 2
        assert sorted(doc.zones) == AZS
        assert ctl.consul.publisher.counters.invalid_docs == 0 and ctl.consul.publisher.counters.generation_restarts == 1
        ctl.consul.election.release()


def test_a_deeply_nested_weights_document_does_not_wedge_the_leader(devconsul, tmp_path):
    """200 KB of [[[...]]] in the weights key: the daemon refuses it like any invalid
    document, starts its term, and publishes a real outage (az-b drained)."""
    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    client.kv.put("azprobe/v1/weights", b"[" * 100_000 + b"]" * 100_000)
    down = {"az-b": PathSpec(dst="az-b", conn_attempts=50, failures=50, rtt_ms=2000.0)}
    with FakeAgentServer(interval_s=0.2) as server:
        for key, agent in zone_agents(AZS, 2, sick=down).items():
            server.add(key, agent)
        with ControllerProcess.make(tmp_path, "ctl-1", devconsul.url, [server.url(k) for k in server.agents]) as ctl:
            doc = wait_for(lambda: (d := read_weights(client)) and d.zones["az-b"].share <= 2 and d,
                           timeout=30, message="az-b drained in KV")
            assert doc.leader == "ctl-1" and doc.zones["az-b"].state != "ok"
            assert sum(z.share for z in doc.zones.values()) == 100
            assert "the weights document in KV is invalid" in ctl.log() and "nested too deeply" in ctl.log()
            assert "RecursionError" not in ctl.log() and ctl.running


def test_consul_failing_the_txn_backs_off_and_keeps_the_lock(devconsul, caplog):
    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    with FailingTxnProxy(devconsul.url) as proxy, FakeAgentServer() as server:
        for key, agent in zone_agents(AZS, 1).items():
            server.add(key, agent)
        ctl = _controller(f"http://127.0.0.1:{proxy.port}", [server.url(k) for k in server.agents])
        clock = [1000.0]
        ctl.consul.publisher.clock = lambda: clock[0]
        _rounds(ctl, server, 2)
        first = read_weights(client)
        assert first is not None and ctl.consul.election.is_leader
        proxy.fail = True
        calls = proxy.txn_calls
        leader_flags = []

        def tick(i: int) -> None:
            leader_flags.append(ctl.consul.election.is_leader)
            clock[0] += 0.2  # 12 ticks: 2.4 s of the publisher's clock
            ctl.consul.publisher._last_signatures = None  # every tick wants to write

        _rounds(ctl, server, 12, between=tick)
        assert all(leader_flags), "stepped down on a failed write"
        failed = proxy.txn_calls - calls
        assert 2 <= failed <= 5  # backoff 0.4, 0.8, 1.6 s ...: not one per tick
        assert ctl.consul.publisher.counters.write_errors == failed
        proxy.fail = False
        clock[0] += 20.0  # past the longest backoff
        _rounds(ctl, server, 1)
        doc = read_weights(client)
        assert doc.generation > first.generation and ctl.consul.election.is_leader
        assert sum("became leader" in r.getMessage() for r in caplog.records) <= 1
        ctl.consul.election.release()


def test_a_control_prefix_over_the_answer_bound_keeps_the_last_controls_and_the_lock(devconsul, caplog):
    """Keys under control/ whose recursive read passes the 4 MiB answer bound (anyone can
    write there): a new leader still starts its term and writes, a running one keeps its
    lock and the last controls it read, and the failure is logged once, not per round."""
    caplog.set_level(logging.INFO, "azprobe.controller")
    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    junk = [f"azprobe/v1/control/junk-{i}" for i in range(9)]

    def add_junk() -> None:
        for key in junk:
            assert client.kv.put(key, b"x" * 500_000)

    add_junk()
    with FakeAgentServer() as server:
        for key, agent in zone_agents(AZS, 1).items():
            server.add(key, agent)
        ctl = _controller(devconsul.url, [server.url(k) for k in server.agents])
        leader_flags: list[bool] = []
        _rounds(ctl, server, 3, between=lambda i: leader_flags.append(ctl.consul.election.is_leader))
        doc = read_weights(client)
        assert all(leader_flags) and doc is not None and doc.leader == "ctl" and sorted(doc.zones) == AZS
        assert ctl.consul.publisher.counters.control_read_errors == 3
        assert sum("operator controls: reading" in r.getMessage() for r in caplog.records) == 1

        # readable again: a freeze is read and in force
        client.kv.delete("azprobe/v1/control/", recurse=True)
        client.kv.put("azprobe/v1/control/freeze", b"investigating")
        _rounds(ctl, server, 1)
        assert ctl.handover.take_inputs().controls.controls.freeze is True
        assert any("works again after 3 failed reads" in r.getMessage() for r in caplog.records)

        # unreadable again with the freeze deleted: the last good controls (frozen) hold
        add_junk()
        client.kv.delete("azprobe/v1/control/freeze")
        leader_flags.clear()
        _rounds(ctl, server, 2, between=lambda i: leader_flags.append(ctl.consul.election.is_leader))
        assert all(leader_flags) and ctl.handover.take_inputs().controls.controls.freeze is True
        assert ctl.consul.publisher.counters.control_read_errors == 5
        ctl.consul.election.release()
