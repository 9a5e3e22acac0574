"""The catalog slice the controller uses to discover agents: register/deregister (catalog
and local-agent style), service listing with node-meta filtering, blocking on changes,
and /v1/agent/self for health checks."""

from __future__ import annotations

import json
import threading

import consul

from tests.helpers import wait_for


def _client(dc) -> consul.Consul:
    return consul.Consul(host=dc.host, port=dc.port)


def test_register_and_discover_agents_by_az(devconsul):
    client = _client(devconsul)
    # NodeMeta goes in the body: py-consul's register(node_meta=...) sends it as a query
    # filter, which Consul (and devconsul) ignore on a write
    for node, addr, az in (("client-a", "198.18.1.2", "az-a"), ("client-b", "198.18.2.2", "az-b")):
        body = {"Node": node, "Address": addr, "NodeMeta": {"az": az},
                "Service": {"Service": "azprobe-agent", "Port": 9740, "Tags": ["azprobe"]}}
        resp = devconsul.request("PUT", "/v1/catalog/register", body=json.dumps(body))
        assert resp.status == 200 and resp.text == "true"
    _, services = client.catalog.services()
    assert services["azprobe-agent"] == ["azprobe"]
    _, rows = client.catalog.service("azprobe-agent")
    assert [(r["Node"], r["Address"], r["ServicePort"], r["NodeMeta"]["az"]) for r in rows] == [
        ("client-a", "198.18.1.2", 9740, "az-a"), ("client-b", "198.18.2.2", 9740, "az-b")]
    _, only_b = client.catalog.service("azprobe-agent", node_meta={"az": "az-b"})
    assert [r["Node"] for r in only_b] == ["client-b"]
    assert client.catalog.deregister("client-a") is True
    assert [r["Node"] for r in client.catalog.service("azprobe-agent")[1]] == ["client-b"]


def test_blocking_catalog_query_sees_a_new_agent(devconsul):
    client = _client(devconsul)
    index, rows = client.catalog.service("azprobe-agent")
    assert rows == []
    result = {}

    def watch() -> None:
        result["value"] = _client(devconsul).catalog.service("azprobe-agent", index=index, wait="30s")

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    wait_for(lambda: devconsul.parked_queries() == 1, timeout=5, message="catalog watcher parked")
    client.catalog.register("late", "198.18.3.2", service={"Service": "azprobe-agent", "Port": 9740})
    thread.join(timeout=5)
    new_index, rows = result["value"]
    assert int(new_index) > int(index) and [r["Node"] for r in rows] == ["late"]


def test_local_agent_service_registration_and_agent_self(devconsul):
    client = _client(devconsul)
    me = client.agent.self()["Config"]["NodeName"]
    assert client.agent.service.register("azprobe-agent", service_id="agent-1", port=9740, tags=["x"]) is True
    assert client.agent.services()["agent-1"]["Port"] == 9740
    assert [r["Node"] for r in client.catalog.service("azprobe-agent")[1]] == [me]
    assert client.agent.service.deregister("agent-1") is True
    assert client.catalog.service("azprobe-agent")[1] == []
    missing = devconsul.request("PUT", "/v1/agent/service/deregister/agent-1")
    assert missing.status == 404
    assert devconsul.request("PUT", "/v1/catalog/register", body="{bad").status == 400
