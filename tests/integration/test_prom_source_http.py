"""The Prometheus source against a hostile query API over real HTTP: an answer over
max_response_bytes (announced or not), a slow answer, not JSON, JSON nested thousands
deep, an HTTP error. Each is one failed cycle with every node failing, never an
exception, a hang or a window; the error's text reaches the log escaped."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiohttp import web

from azprobe.controller.window_source import AgentState
from azprobe.controller.config import parse_config
from azprobe.controller.prom_source import PrometheusCollector
from tests.controller_harness import topology
from tests.unit.test_prom_source import scraped_agent

_, GOOD = scraped_agent(ticks=3)
GOOD_BODY = json.dumps(GOOD).encode()


async def _good(_: web.Request) -> web.Response:
    return web.Response(body=GOOD_BODY, content_type="application/json")


async def _big_announced(_: web.Request) -> web.Response:
    return web.Response(body=b" " * 5000 + GOOD_BODY, content_type="application/json")


async def _big_streamed(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()  # chunked: no Content-Length to refuse it by
    await resp.prepare(request)
    for _ in range(2 * len(GOOD_BODY) // 10_000 + 2):
        await resp.write(b" " * 10_000)
    await resp.write_eof()
    return resp


async def _slow(_: web.Request) -> web.Response:
    await asyncio.sleep(1.5)
    return web.Response(body=GOOD_BODY)


async def _not_json(_: web.Request) -> web.Response:
    return web.Response(text="<html>proxy error</html>")


async def _bad_query(_: web.Request) -> web.Response:
    return web.json_response({"status": "error", "errorType": "bad_data", "error": "parse error"}, status=400)


async def _nested(_: web.Request) -> web.Response:
    depth = len(GOOD_BODY) // 2  # thousands of levels, within max_response_bytes
    return web.Response(body=b"[" * depth + b"]" * depth, content_type="application/json")


ESCAPES = "\x1b[2J\x07\x1b]0;owned\x07"


async def _escapes(_: web.Request) -> web.Response:
    return web.Response(text=f"upstream down{ESCAPES}", status=503)


HANDLERS = {"good": _good, "big": _big_announced, "stream": _big_streamed, "slow": _slow, "html": _not_json,
            "400": _bad_query, "nested": _nested, "escapes": _escapes}


def _collector(port: int, name: str) -> PrometheusCollector:
    config = parse_config({"controller": {"name": "c"}, "consul": {}, "agents": {"source": "prometheus"},
                           "prometheus": {"url": f"http://127.0.0.1:{port}/{name}", "query_timeout_s": 0.3,
                                          "max_response_bytes": len(GOOD_BODY) + 1024},
                           "topology": {"azs": ["az-a", "az-b", "az-c"]}})
    return PrometheusCollector(config.prometheus, evaluation_window_s=1e9, stale_after_s=5.0, topology=topology())


@pytest.mark.parametrize("name,why", [("big", "max_response_bytes"), ("stream", "max_response_bytes"),
                                      ("slow", "timeout"), ("html", "not JSON"), ("400", "parse error"),
                                      ("nested", "not JSON"), ("escapes", "HTTP 503: upstream down")])
def test_a_hostile_answer_is_one_failed_cycle(name, why):
    first, result, bad = _one_bad_cycle(name)
    assert first.ingested == 3 and first.failed == 0
    assert result.ingested == 0 and result.failed == 1
    assert bad.counters.pull_errors + bad.counters.pull_timeouts == 1
    assert bad.agent_states()[AgentState.FAILING] == 1
    assert bad.take_new() == []
    (cursor,) = bad.cursors.values()
    assert why in cursor.last_error, cursor.last_error
    # Too large or too slow for a first query: the next one reads half the lookback.
    assert bad.range_s() == (15.0 if name in ("big", "stream", "slow") else 30.0)


def test_prometheus_error_text_reaches_the_log_escaped(caplog):
    """An error body is Prometheus's (or a proxy's) words: logged without a control character."""
    caplog.set_level(logging.INFO, logger="azprobe.controller.prom_source")
    _one_bad_cycle("escapes")
    (line,) = [r.getMessage() for r in caplog.records if "prometheus query failing" in r.getMessage()]
    assert "upstream down\\x1b[2J\\x07" in line, line
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in line), repr(line)


def _one_bad_cycle(name: str) -> tuple:
    """One cycle against the sound answer, then one against handler `name` (same nodes)."""
    async def run() -> tuple:
        app = web.Application()
        for key, handler in HANDLERS.items():
            app.router.add_get(f"/{key}/api/v1/query", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        good, bad = _collector(port, "good"), _collector(port, name)
        try:
            first = await good.pull_all()  # the same collector code reads a sound answer
            # A known node first, so there is something to mark failing.
            bad.cursors = good.cursors
            result = await bad.pull_all()
            return first, result, bad
        finally:
            await good.close()
            await bad.close()
            await runner.cleanup()

    return asyncio.run(run())


def test_a_slow_answer_is_waited_on_by_the_next_cycles_never_asked_twice():
    """A cycle waits at most cycle_budget_s for the answer; the next cycles wait on the
    same query (counted as overruns) instead of sending another, and the one that sees
    it finish ingests it."""
    queries = []

    async def slow_once(_: web.Request) -> web.Response:
        queries.append(1)
        await asyncio.sleep(1.0)
        return web.Response(body=GOOD_BODY, content_type="application/json")

    async def run() -> tuple:
        app = web.Application()
        app.router.add_get("/api/v1/query", slow_once)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        config = parse_config({"controller": {"name": "c"}, "consul": {}, "agents": {"source": "prometheus"},
                               "prometheus": {"url": f"http://127.0.0.1:{port}", "query_timeout_s": 10.0},
                               "topology": {"azs": ["az-a", "az-b", "az-c"]}})
        collector = PrometheusCollector(config.prometheus, evaluation_window_s=1e9, stale_after_s=5.0,
                                        cycle_budget_s=0.05, topology=topology())
        try:
            results = [await collector.pull_all()]
            deadline = asyncio.get_running_loop().time() + 10
            while not results[-1].ingested and asyncio.get_running_loop().time() < deadline:
                results.append(await collector.pull_all())
            return results, collector
        finally:
            await collector.close()
            await runner.cleanup()

    results, collector = asyncio.run(run())
    assert results[0].ingested == 0 and results[0].failed == 0  # not an error: still coming
    assert results[-1].ingested == 3 and len(results) >= 2
    assert len(queries) == 1  # never a second query while the first was in flight
    assert collector.counters.pull_overruns == len(results) - 1
    assert collector.counters.pull_errors == collector.counters.pull_timeouts == 0
