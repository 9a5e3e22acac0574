"""The controller's two threads under churn: the running daemon (Controller.run: the cycle on
the event loop, the Consul round in its own thread) against a real devconsul and fake
agents over real HTTP, while the agent catalog and the operator keys change every cycle.

It must see no failed round, lose no cycle, always find a valid weights document, and the
collector's agent list must be read and changed on the event loop only (discovery hands
its results over, controller/handover.py). AZPROBE_STRESS_S runs it longer (bench/)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import threading
import time
import uuid

import consul
import pytest

from azprobe.controller import consul_duties
from azprobe.controller.config import parse_config
from azprobe.controller.main import Controller
from tests.controller_harness import read_weights
from tests.fakeagent import FakeAgent, FakeAgentServer, PathSpec

AZS = ["az-a", "az-b", "az-c"]
INTERVAL_S = 0.5
# The catalog and the controls repeat every 6 steps (3 s): 30 s is 10 rounds of every
# change, 60 cycles, each one checked; the stress bench runs it for minutes.
STRESS_S = float(os.environ.get("AZPROBE_STRESS_S", "30"))
PER_AZ = 2


class ThreadRecordingDict(dict):
    """The collector's cursors, noting every thread that reads or changes them."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.threads: set[str] = set()

    def _seen(self) -> None:
        self.threads.add(threading.current_thread().name)

    def __iter__(self):
        self._seen()
        return super().__iter__()

    def __len__(self) -> int:
        self._seen()
        return super().__len__()

    def __contains__(self, key) -> bool:
        self._seen()
        return super().__contains__(key)

    def __getitem__(self, key):
        self._seen()
        return super().__getitem__(key)

    def __setitem__(self, key, value) -> None:
        self._seen()
        super().__setitem__(key, value)

    def __delitem__(self, key) -> None:
        self._seen()
        super().__delitem__(key)

    def get(self, key, default=None):
        self._seen()
        return super().get(key, default)

    def keys(self):
        self._seen()
        return super().keys()

    def values(self):
        self._seen()
        return super().values()

    def items(self):
        self._seen()
        return super().items()


def _register(devconsul, node: str, az: str, port: int) -> None:
    body = {"Node": node, "Address": "127.0.0.1", "NodeMeta": {"az": az},
            "Service": {"Service": "azprobe-agent", "Port": port}}
    assert devconsul.request("PUT", "/v1/catalog/register", body=json.dumps(body)).status == 200


def _deregister(devconsul, node: str) -> None:
    assert devconsul.request("PUT", "/v1/catalog/deregister", body=json.dumps({"Node": node})).status == 200


def _present(step: int, index: int) -> bool:
    """Which agents the catalog lists at `step`: one of each AZ's two always, the other in turns."""
    return index % PER_AZ == 0 or (step + index) % 3 != 0


def _control(client: consul.Consul, prefix: str, step: int) -> None:
    """One operator-key change per cycle: freeze, shift, garbage, an unknown AZ, deletes."""
    control = prefix + "control/"
    until = json.dumps({"until": time.time() + 600, "reason": "stress"})
    change = step % 6
    if change == 0:
        client.kv.put(control + "freeze", "")
    elif change == 1:
        client.kv.put(control + f"shift/{AZS[step % 3]}", until)
    elif change == 2:
        client.kv.delete(control + "freeze")
    elif change == 3:
        client.kv.put(control + "shift/az-zz", "{not json")
    elif change == 4:
        client.kv.delete(control + "shift/", recurse=True)
    else:
        client.kv.put(control + "freeze", json.dumps({"until": time.time() - 5}))  # expired: ignored


def _cycles(ctl: Controller) -> float:
    return ctl.metrics.registry.get_sample_value("azprobe_controller_cycle_seconds_count") or 0.0


def test_catalog_and_operator_churn_every_cycle(devconsul, caplog, monkeypatch):
    monkeypatch.setattr(consul_duties, "DISCOVERY_EVERY_S", 0.0)  # read the catalog every Consul round
    prefix = f"azprobe/{uuid.uuid4().hex[:8]}/"
    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    servers: list[tuple[str, str, FakeAgentServer]] = []
    try:
        for az in AZS:
            for i in range(PER_AZ):
                server = FakeAgentServer(interval_s=INTERVAL_S)
                server.add("", FakeAgent(f"node-{az}-{i}", az, [PathSpec(dst=d, conn_attempts=50) for d in AZS]))
                servers.append((f"node-{az}-{i}", az, server.start()))
        for node, az, server in servers:
            _register(devconsul, node, az, server.port)
        ctl = Controller(parse_config({
            "controller": {"name": "stress", "listen": "127.0.0.1:0", "interval_s": INTERVAL_S,
                           "evaluation_window_s": 3.0, "lock_delay_s": 0},
            "consul": {"address": devconsul.url, "prefix": prefix},
            "agents": {"discover": "consul", "pull_timeout_s": 0.3},
            "topology": {"azs": AZS},
        }))
        cursors = ThreadRecordingDict(ctl.collector.cursors)
        ctl.collector.cursors = cursors
        states_seen: set[str] = set()
        with caplog.at_level(logging.INFO):
            asyncio.run(_churn(devconsul, client, prefix, ctl, servers, states_seen))
    finally:
        for _, _, server in servers:
            server.stop()
    failures = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.ERROR or "round failed" in r.getMessage() or r.exc_info]
    assert not failures, failures[:3]
    assert cursors.threads == {threading.main_thread().name}, cursors.threads  # the event loop's thread only
    assert "frozen" in states_seen and "shifted" in states_seen, states_seen  # the controls got through


async def _churn(devconsul, client, prefix: str, ctl: Controller, servers, states_seen: set[str]) -> None:
    stop = asyncio.Event()
    daemon = asyncio.create_task(ctl.run(stop))
    try:
        deadline = time.monotonic() + 30
        while _cycles(ctl) < 1 or await asyncio.to_thread(read_weights, client, prefix + "weights") is None:
            assert time.monotonic() < deadline, "no weights document within 30 s"
            assert not daemon.done(), daemon
            await asyncio.sleep(0.05)
        started, cycles_at_start = time.monotonic(), _cycles(ctl)
        step = 0
        while time.monotonic() - started < STRESS_S:
            listed = {node for i, (node, _, _) in enumerate(servers) if _present(step, i)}

            def change() -> None:
                for i, (node, az, server) in enumerate(servers):
                    if node in listed:
                        _register(devconsul, node, az, server.port)
                    else:
                        _deregister(devconsul, node)
                _control(client, prefix, step)

            await asyncio.to_thread(change)
            doc = await asyncio.to_thread(read_weights, client, prefix + "weights")  # parse_weights: valid or raises
            assert doc is not None and set(doc.zones) == set(AZS) and sum(z.share for z in doc.zones.values()) == 100
            states_seen.add(doc.state)
            states_seen.update(z.state for z in doc.zones.values())
            assert not daemon.done(), daemon
            step += 1
            await asyncio.sleep(INTERVAL_S)
        elapsed, cycles = time.monotonic() - started, _cycles(ctl) - cycles_at_start
        # Every interval had its cycle (next_start rests after an overrun, never a whole tick).
        assert cycles >= math.floor(elapsed / INTERVAL_S) - 1, (cycles, elapsed)
        # The last catalog reaches the collector: discovery's hand-over works, not just survives.
        wanted = {f"http://127.0.0.1:{server.port}" for i, (_, _, server) in enumerate(servers) if _present(step - 1, i)}
        deadline = time.monotonic() + 10
        while set(ctl.collector.cursors) != wanted:
            assert time.monotonic() < deadline, (sorted(ctl.collector.cursors), sorted(wanted))
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(daemon, 30)
    assert daemon.exception() is None




def test_a_decision_is_written_when_it_is_made_not_at_the_next_consul_round(devconsul):
    """The Consul round runs on the cycle's grid, just before the cycle's decision exists:
    waiting for the next round would add an interval to every detection. With a 20 s
    interval, the first cycle held until the Consul side leads, its document must reach KV
    long before the next round."""
    prefix = f"azprobe/{uuid.uuid4().hex[:8]}/"
    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    server = FakeAgentServer(interval_s=INTERVAL_S)
    server.add("", FakeAgent("node-az-a-0", "az-a", [PathSpec(dst=d, conn_attempts=50) for d in AZS]))
    server.start()
    try:
        ctl = Controller(parse_config({
            "controller": {"name": "prompt", "listen": "127.0.0.1:0", "interval_s": 20.0,
                           "evaluation_window_s": 20.0, "lock_delay_s": 0},
            "consul": {"address": devconsul.url, "prefix": prefix},
            "agents": {"static": [f"http://127.0.0.1:{server.port}"], "pull_timeout_s": 0.3},
            "topology": {"azs": AZS},
        }))
        decide = ctl.cycle

        async def after_the_term_starts():  # the order a busy leader meets every cycle
            while not ctl.consul.term_started:
                await asyncio.sleep(0.01)
            return await decide()

        ctl.cycle = after_the_term_starts  # type: ignore[method-assign]

        async def run() -> float:
            stop = asyncio.Event()
            daemon = asyncio.create_task(ctl.run(stop))
            started = time.monotonic()
            try:
                while await asyncio.to_thread(read_weights, client, prefix + "weights") is None:
                    assert time.monotonic() - started < 10.0, "no document 10 s into a 20 s interval"
                    assert not daemon.done(), daemon
                    await asyncio.sleep(0.05)
                return time.monotonic() - started
            finally:
                stop.set()
                await asyncio.wait_for(daemon, 30)

        written_after = asyncio.run(run())
    finally:
        server.stop()
    assert written_after < 10.0 and ctl.consul.publisher.generation >= 1
