"""The collector over real HTTP against fake agents: restarts without double counting,
gaps, slow and dead agents that never stall a cycle, HTTP details (chunked bodies,
keep-alive reuse), and agent discovery from the devconsul catalog."""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web

from azprobe.clients.transport import AgentHttpClient, Endpoint
from azprobe.controller.collect import Collector
from azprobe.controller.window_source import AgentState, AgentTarget
from azprobe.contracts.window import parse_window
from tests.controller_harness import topology
from tests.fakeagent import FakeAgent, FakeAgentServer, PathSpec


def _collector(urls: list[str], **kwargs) -> Collector:
    collector = Collector(evaluation_window_s=kwargs.pop("evaluation_window_s", 30.0),
                          pull_timeout_s=kwargs.pop("pull_timeout_s", 0.5), stale_after_s=5.0,
                          topology=topology(), **kwargs)
    collector.set_targets(AgentTarget(u) for u in urls)
    return collector


def _attempts(collector: Collector) -> int:
    return sum(p.conn_attempts for w in collector.store.windows() for p in w.paths)


def test_agent_restart_over_http_is_not_double_counted():
    agent = FakeAgent("n1", "az-a", [PathSpec(dst="az-b", conn_attempts=10)])
    with FakeAgentServer() as server:
        url = server.add("a1", agent)
        collector = _collector([url])

        async def scenario() -> None:
            for _ in range(5):
                agent.emit()
            await collector.pull_all()
            assert _attempts(collector) == 50
            await collector.pull_all()  # nothing new: nothing counted twice
            assert _attempts(collector) == 50
            agent.restart()  # new boot_id, seq starts again at 1 (below our cursor of 5)
            for _ in range(3):
                agent.emit()
            result = await collector.pull_all()
            assert result.ingested == 3  # re-read from seq 0 of the new boot, same cycle
            assert _attempts(collector) == 80
            await collector.pull_all()
            assert _attempts(collector) == 80
            assert collector.counters.agent_restarts == 1 and collector.counters.gap_events == 0
            await collector.close()

        asyncio.run(scenario())


def test_gap_when_the_ring_wrapped_between_pulls():
    agent = FakeAgent("n1", "az-a", [PathSpec(dst="az-b")], ring_size=3)
    with FakeAgentServer() as server:
        collector = _collector([server.add("a1", agent)])

        async def scenario() -> None:
            agent.emit()
            await collector.pull_all()
            for _ in range(6):  # seqs 2..7; the ring keeps 5..7
                agent.emit()
            await collector.pull_all()
            assert collector.counters.gap_events == 1 and collector.counters.gap_windows == 3
            assert sorted(w.seq for w in collector.store.windows()) == [1, 5, 6, 7]
            await collector.close()

        asyncio.run(scenario())


def test_slow_and_dead_agents_never_stall_the_cycle():
    good = FakeAgent("good", "az-a", [PathSpec(dst="az-b")])
    slow = FakeAgent("slow", "az-a", [PathSpec(dst="az-b")])
    broken = FakeAgent("broken", "az-b", [PathSpec(dst="az-a")])
    slow.delay_s = 120.0  # held until the server stops (a cycle that waited would see it answer)
    broken.fail_status = 500
    with FakeAgentServer() as server:
        urls = [server.add("good", good), server.add("slow", slow), server.add("broken", broken)]
        urls.append("http://127.0.0.1:9/dead")  # nothing listens: connection refused
        collector = _collector(urls, pull_timeout_s=0.3, cycle_budget_s=1.0)

        async def scenario() -> None:
            for agent in (good, slow, broken):
                agent.emit()
            result = await collector.pull_all()
            # The cycle ended while the slow agent still held its answer back: it gave up at
            # the per-request timeout instead of waiting (an ordering, not a stopwatch).
            assert slow.held == 1
            assert result.ingested == 1 and result.failed == 3
            states = {c.target.url.rsplit("/", 1)[1]: c.state(time.monotonic(), 5.0)
                      for c in collector.cursors.values()}
            assert states == {"good": AgentState.UP, "slow": AgentState.FAILING, "broken": AgentState.FAILING,
                              "dead": AgentState.FAILING}
            assert collector.counters.pull_timeouts == 1 and collector.counters.pull_errors == 2
            # The slow agent recovers: its windows are taken on the next pull, nothing lost.
            slow.delay_s = 0.0
            result = await collector.pull_all()
            assert result.ingested == 1
            assert collector.cursors[urls[1]].state(time.monotonic(), 5.0) is AgentState.UP
            await collector.close()

        asyncio.run(scenario())


def test_http_client_chunked_bodies_and_keepalive():
    """An agent behind another HTTP stack may answer chunked; connections are reused."""
    peers: set = set()

    async def scenario() -> None:
        async def chunked(request: web.Request) -> web.StreamResponse:
            peers.add(request.transport.get_extra_info("peername"))
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for part in (b'{"node": "n", ', b'"az": "az-a", "boot_id": "b", ', b'"windows": []}'):
                await resp.write(part)
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_get("/x/v1/windows", chunked)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        client = AgentHttpClient()
        try:
            ep = Endpoint.parse(f"http://127.0.0.1:{port}/x")
            for _ in range(3):
                response = await client.get(ep, "/v1/windows?after=0")
                assert response.status == 200 and json.loads(response.body)["boot_id"] == "b"
            assert (await client.get(ep, "/nope")).status == 404
            assert len(peers) == 1  # one kept-alive connection served every request
            # With no room left in the idle pool (the file-limit cap), nothing is kept.
            capped = AgentHttpClient(max_idle_total=0)
            for _ in range(3):
                assert (await capped.get(ep, "/v1/windows?after=0")).status == 200
            assert len(peers) == 4
            capped.close()
        finally:
            client.close()
            await runner.cleanup()

    asyncio.run(scenario())


def test_agents_discovered_from_the_catalog(devconsul):
    """discover = "consul": agents come from the catalog service `azprobe-agent`, each at
    its ServiceAddress (or node Address) and ServicePort, with the node meta `az`."""
    from azprobe.controller.config import parse_config
    from azprobe.controller.main import Controller

    servers = {az: FakeAgentServer() for az in ("az-a", "az-b")}
    for az, server in servers.items():
        agent = FakeAgent(f"node-{az}", az, [PathSpec(dst=d) for d in servers])
        agent.emit()
        server.add("", agent)  # answers at the root, like a real agent
        server.start()
    try:
        for az, server in servers.items():
            service = {"Service": "azprobe-agent", "Port": server.port, "Tags": ["azprobe"]}
            if az == "az-b":
                service["Address"] = "127.0.0.1"  # ServiceAddress wins over the node's Address
            body = {"Node": f"node-{az}", "Address": "127.0.0.1" if az == "az-a" else "198.18.2.2",
                    "NodeMeta": {"az": az}, "Service": service}
            assert devconsul.request("PUT", "/v1/catalog/register", body=json.dumps(body)).status == 200
        config = parse_config({"controller": {"name": "c", "listen": "127.0.0.1:9"},
                               "consul": {"address": devconsul.url}, "agents": {"discover": "consul"},
                               "topology": {"azs": ["az-a", "az-b", "az-c"]}})
        ctl = Controller(config)
        ctl.consul_tick()
        assert ctl.consul.consul_up is True

        async def one_cycle():
            out = await ctl.cycle()
            await ctl.collector.close()
            return out

        out = asyncio.run(one_cycle())
        assert sorted((c.target.url, c.target.az) for c in ctl.collector.cursors.values()) == sorted(
            (f"http://127.0.0.1:{s.port}", az) for az, s in servers.items())
        assert out.pull.ingested == 2 and out.pull.failed == 0
        assert set(out.seen.zones) == {"az-a", "az-b"}
        ctl.consul.election.release()
    finally:
        for server in servers.values():
            server.stop()


def test_pulls_from_the_real_agents_http_server():
    """The agent's own HTTP server (stdlib, HTTP/1.1 keep-alive), with windows from a fake ring."""
    from azprobe.agent.http import make_server, serve_in_background

    fake = FakeAgent("n1", "az-a", [PathSpec(dst="az-b", conn_attempts=10)])

    class State:
        def windows_page(self, after: int) -> tuple[dict, list]:
            doc = fake.body(after)
            return doc, [parse_window(w) for w in doc["windows"]]

    server = make_server("127.0.0.1", 0, State())  # type: ignore[arg-type]
    serve_in_background(server)
    try:
        collector = _collector([f"http://127.0.0.1:{server.server_address[1]}"])

        async def scenario() -> None:
            for round_ in range(3):
                fake.emit()
                result = await collector.pull_all()
                assert result.ingested == 1 and result.failed == 0, round_
            await collector.close()

        asyncio.run(scenario())
        assert _attempts(collector) == 30 and fake.pulls == 3
    finally:
        server.shutdown()
        server.server_close()


def test_agents_cut_by_the_budget_go_first_next_cycle():
    slow = FakeAgent("slow", "az-a", [PathSpec(dst="az-b")])
    fast = [FakeAgent(f"fast{i}", "az-a", [PathSpec(dst="az-b")]) for i in range(2)]
    slow.delay_s = 2.0
    with FakeAgentServer() as server:
        urls = [server.add("slow", slow)] + [server.add(a.node, a) for a in fast]
        collector = _collector(urls, pull_timeout_s=1.0, cycle_budget_s=0.3, concurrency=1)

        async def scenario() -> None:
            for agent in [slow, *fast]:
                agent.emit()
            first = await collector.pull_all()  # one worker, stuck on the slow agent
            assert first.ingested == 0 and first.failed == 3
            assert collector.cursors[urls[1]].last_error == "not reached within the cycle budget"
            second = await collector.pull_all()  # the two it never reached go first now
            assert second.ingested == 2
            assert [collector.cursors[u].state(time.monotonic(), 5.0) for u in urls] == [
                AgentState.FAILING, AgentState.UP, AgentState.UP]
            await collector.close()

        asyncio.run(scenario())
