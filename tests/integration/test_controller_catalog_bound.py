"""Catalog discovery against real devconsul when the agents' catalog service cannot be
read: registrations anyone with service:write may make push /v1/catalog/service/NAME past
the Consul client's 4 MiB answer bound. The leader keeps its session and lock, keeps
pulling the agents it last discovered, keeps writing weights, counts each failed read and
logs it once; once the catalog reads again, discovery goes on."""

from __future__ import annotations

import json
import logging

import consul
from prometheus_client.parser import text_string_to_metric_families

from azprobe.contracts import prom
from azprobe.controller import consul_duties
from azprobe.controller.config import parse_config
from azprobe.controller.main import Controller
from tests.controller_harness import drive_rounds, leader_holder, read_weights
from tests.fakeagent import FakeAgent, FakeAgentServer, PathSpec

AZS = ["az-a", "az-b", "az-c"]
ROGUES = 10  # registrations of ~460 KB each: the catalog answer passes 4 MiB


def _register(devconsul, node: str, az: str, port: int, tags: list[str]) -> None:
    body = {"Node": node, "Address": "127.0.0.1", "NodeMeta": {"az": az},
            "Service": {"Service": "azprobe-agent", "Port": port, "Tags": tags}}
    assert devconsul.request("PUT", "/v1/catalog/register", body=json.dumps(body)).status == 200


def _catalog_errors(ctl: Controller) -> float:
    series = f"{prom.CATALOG_READ_ERRORS.name}_total"
    text = ctl.metrics.render().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == series)


def test_a_catalog_answer_over_the_bound_keeps_the_lock_and_the_last_agents(devconsul, monkeypatch, caplog):
    caplog.set_level(logging.INFO, "azprobe.controller")
    monkeypatch.setattr(consul_duties, "DISCOVERY_EVERY_S", 0.0)  # read the catalog every Consul round
    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    servers = {az: FakeAgentServer() for az in AZS}
    agents = []
    try:
        for az, server in servers.items():
            agent = FakeAgent(f"node-{az}", az, [PathSpec(dst=d) for d in AZS])
            server.add("", agent)  # at the root, like a real agent
            server.start()
            agents.append(agent)
            _register(devconsul, f"node-{az}", az, server.port, ["azprobe"])
        ctl = Controller(parse_config({
            "controller": {"name": "ctl", "listen": "127.0.0.1:9", "interval_s": 0.2, "evaluation_window_s": 2.0,
                           "lock_delay_s": 0},
            "consul": {"address": devconsul.url}, "agents": {"discover": "consul"}, "topology": {"azs": AZS}}))
        discovered = sorted(f"http://127.0.0.1:{s.port}" for s in servers.values())
        drive_rounds(ctl, agents, rounds=3)
        first = read_weights(client)
        assert first is not None and first.leader == "ctl" and sorted(first.zones) == AZS
        session = leader_holder(client)["session"]

        for i in range(ROGUES):
            _register(devconsul, f"rogue-{i}", "az-a", 9740, ["x" * 1000] * 460)

        def every_round_wants_a_write(i: int) -> None:
            ctl.consul.publisher._last_signatures = None

        flags = drive_rounds(ctl, agents, lambda: (ctl.consul.election.is_leader, ctl.consul.consul_up),
                             rounds=4, before_pull=every_round_wants_a_write)
        assert flags == [(True, True)] * 4, "stepped down for a catalog read"
        assert leader_holder(client)["session"] == session
        assert read_weights(client).generation > first.generation
        assert sorted(c.target.url for c in ctl.collector.cursors.values()) == discovered
        assert _catalog_errors(ctl) == 4
        failures = [r for r in caplog.records if "reading the catalog service 'azprobe-agent' failed" in r.getMessage()]
        assert len(failures) == 1 and failures[0].levelno == logging.WARNING
        assert "exceeds the limit" in failures[0].getMessage() and "deregister" in failures[0].getMessage()

        for i in range(ROGUES):
            client.catalog.deregister(f"rogue-{i}")
        drive_rounds(ctl, agents, rounds=1)
        assert any("works again after 4 failed reads" in r.getMessage() for r in caplog.records)
        assert _catalog_errors(ctl) == 4 and ctl.consul.election.is_leader
        ctl.consul.election.release()
    finally:
        for server in servers.values():
            server.stop()
