"""`azprobe model eval --safety` and the daemon decide the same: a real controller cycle
(9 fake agents over real HTTP, the collector, the merge, Controller.decide) and the real
command line, fed the evidence the daemon judged, give the same shares. The case is one
where the healthy band decides: az-b is healthy but slower than az-a (health ~0.97), so
without the band weight^6 would give az-a ~58 % and az-b ~41 %; with it they share one
weight, while az-c (half its connects failing) drains."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from azprobe.config import dump_toml
from azprobe.controller.config import parse_config
from azprobe.controller.decide import GLOBAL_VIEW
from azprobe.controller.main import Controller
from azprobe.controller.quorum import NodeEvidence
from tests.fakeagent import FakeAgentServer, HostSpec, PathSpec, zone_agents

AZS = ["az-a", "az-b", "az-c"]
SLOW_B = PathSpec(dst="az-b", conn_attempts=50, rtt_ms=40.0, connect_ms=40.0)
SICK_C = PathSpec(dst="az-c", conn_attempts=50, failures=25)


def _config(urls: list[str], quorum: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "controller": {"name": "ctl", "listen": "127.0.0.1:9", "interval_s": 0.2, "evaluation_window_s": 2.0},
        "consul": {"address": "http://127.0.0.1:9"},  # never contacted: only the cycle runs
        "agents": {"static": urls},
        "topology": {"azs": AZS},
        "quorum": quorum or {},
    }


def _daemon_cycle(config: dict[str, Any], server: FakeAgentServer) -> tuple[dict[str, int], list[NodeEvidence]]:
    """One cycle of the real controller: the global view's shares and the evidence it judged."""
    ctl = Controller(parse_config(config))

    async def run() -> tuple[dict[str, int], list[NodeEvidence]]:
        for agent in server.agents.values():
            agent.emit(interval_s=0.2)
        outcome = await ctl.cycle()
        evidence = ctl.decider.evidence(outcome.seen)
        await ctl.collector.close()
        return {az: z.share for az, z in outcome.views[GLOBAL_VIEW].zones.items()}, evidence

    return asyncio.run(run())


def _what_if(tmp_path: Path, config: dict[str, Any], stats: dict[str, Any], name: str) -> dict[str, int]:
    config_path, stats_path = tmp_path / f"{name}.toml", tmp_path / f"{name}.json"
    config_path.write_text(dump_toml(config))
    stats_path.write_text(json.dumps(stats))
    r = subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "model", "eval", "--safety", "--config", str(config_path),
                        str(stats_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return {az: z["share"] for az, z in json.loads(r.stdout)["zones"].items()}


def _zones_json(zones) -> dict[str, Any]:
    return {az: z.to_json() for az, z in sorted(zones.items())}


def test_what_if_gives_the_daemons_shares_healthy_band_included(tmp_path):
    with FakeAgentServer() as server:
        for key, agent in zone_agents(AZS, 3, sick={"az-b": SLOW_B, "az-c": SICK_C}).items():
            server.add(key, agent)
        config = _config([server.url(k) for k in server.agents])
        daemon, evidence = _daemon_cycle(config, server)

    assert len(evidence) == 9
    # every node saw the same figures: the per-zone form states them once
    per_zone = _zones_json(evidence[0].zones)
    assert all(_zones_json(n.zones) == per_zone for n in evidence)
    assert abs(daemon["az-a"] - daemon["az-b"]) <= 1 and daemon["az-c"] <= 2, daemon  # the band levels a and b

    assert _what_if(tmp_path, config, {"zones": per_zone}, "zones") == daemon
    nodes = [{"node": n.node, "az": n.az, "zones": _zones_json(n.zones)} for n in evidence]
    assert _what_if(tmp_path, config, {"nodes": nodes}, "nodes") == daemon

    # the band is what levels them, and the what-if reads it from [quorum] as the daemon does
    no_band = {**config, "quorum": {"healthy_band": 0.0}}
    unlevelled = _what_if(tmp_path, no_band, {"zones": per_zone}, "no-band")
    assert unlevelled["az-a"] - unlevelled["az-b"] >= 10, unlevelled


def test_what_if_per_node_form_gives_the_daemons_shares_with_a_liar(tmp_path):
    """One node reports az-a failing: the quorum outvotes it in the daemon and in the
    what-if's per-node form alike."""
    with FakeAgentServer() as server:
        agents = zone_agents(AZS, 3, sick={"az-b": SLOW_B})
        agents["az-c-0"].paths = [PathSpec(dst="az-a", conn_attempts=50, failures=50, rtt_ms=2000.0),
                                  *agents["az-c-0"].paths[1:]]
        for key, agent in agents.items():
            server.add(key, agent)
        config = _config([server.url(k) for k in server.agents])
        daemon, evidence = _daemon_cycle(config, server)

    nodes = [{"node": n.node, "az": n.az, "zones": _zones_json(n.zones)} for n in evidence]
    assert len({json.dumps(n["zones"], sort_keys=True) for n in nodes}) == 2  # the liar and everyone else
    assert _what_if(tmp_path, config, {"nodes": nodes}, "nodes") == daemon
    assert max(daemon.values()) - min(daemon.values()) <= 1, daemon  # nobody drained, a and b level


def test_what_if_per_node_form_with_hosts_gives_the_daemons_decision(tmp_path):
    """One of az-b's six servers is +200 ms and every node's pooled P95 shows it: the
    daemon keeps az-b in play and names the host, and so does the what-if fed the same
    per-node evidence, host sums included."""
    servers = {az: [f"198.18.{i + 1}.{10 + h}" for h in range(6)] for i, az in enumerate(AZS)}
    sick = servers["az-b"][1]
    with FakeAgentServer() as server:
        for key, agent in zone_agents(AZS, 3, sick={"az-b": PathSpec(dst="az-b", conn_attempts=50,
                                                                      rtt_ms=205.0)}).items():
            agent.hosts = [HostSpec(dst=d, addr=a, rtt_ms=205.0 if a == sick else 0.9) for d in AZS
                           for a in servers[d]]
            server.add(key, agent)
        config = _config([server.url(k) for k in server.agents])
        daemon, evidence = _daemon_cycle(config, server)

    assert all(n.hosts for n in evidence)
    nodes = [{"node": n.node, "az": n.az, "zones": _zones_json(n.zones),
              "hosts": [{"src": n.az, "dst": dst, "addr": addr, "connects": s.connects, "failures": s.failures,
                         "retrans": s.retrans, "rto": s.rto, "rtt_buckets": s.rtt} for (dst, addr), s in n.hosts.items()]}
             for n in evidence]
    stats_path, config_path = tmp_path / "hosts.json", tmp_path / "hosts.toml"
    stats_path.write_text(json.dumps({"nodes": nodes}))
    config_path.write_text(dump_toml(config))
    r = subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "model", "eval", "--safety", "--config",
                        str(config_path), str(stats_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {az: z["share"] for az, z in out["zones"].items()} == daemon
    assert max(daemon.values()) - min(daemon.values()) <= 1, daemon  # az-b kept its share
    assert [h["addr"] for h in out["sick_hosts"]["az-b"]] == [sick]
