"""A sick host is not a sick zone. Nine fake agents (3 per AZ) serve windows with
the hosts section over real HTTP to a real controller cycle publishing to a real
devconsul; one of az-b's six servers is +200 ms, and every node's pooled P95 toward az-b
shows it. The zone keeps its share, the sick-hosts document names the host, `azprobe
explain` shows it, and `envoy-eds` marks it DEGRADED. Without the hosts section the same
fleet drains az-b. An operator pin (control/host/<addr>) takes the host off the list;
malformed host switches change nothing. Driven round by round on a simulated decision clock."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import consul

from azprobe.contracts.weights_hosts import parse_hosts
from tests.controller_harness import ROOT, drive_rounds, fleet_controller, read_weights
from tests.fakeagent import FakeAgent, FakeAgentServer, HostSpec, PathSpec

AZS = ["az-a", "az-b", "az-c"]
SERVERS = {az: [f"198.18.{i + 1}.{10 + h}" for h in range(6)] for i, az in enumerate(AZS)}
SICK = SERVERS["az-b"][3]
ROUNDS = 16


def _fleet(with_hosts: bool) -> dict[str, FakeAgent]:
    agents = {}
    for az in AZS:
        for i in range(3):
            # the pooled path toward az-b carries the sick server's latency at its P95
            paths = [PathSpec(dst=d, conn_attempts=50, rtt_ms=205.0 if d == "az-b" else 1.0) for d in AZS]
            hosts = [HostSpec(dst=d, addr=a, rtt_ms=205.0 if a == SICK else 0.9, rto=2 if a == SICK else 0)
                     for d in AZS for a in SERVERS[d]] if with_hosts else None
            agents[f"{az}-{i}"] = FakeAgent(f"node-{az}-{i}", az, paths, hosts=hosts)
    return agents


def _run(devconsul, agents: dict[str, FakeAgent], prefix: str) -> list:
    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    with FakeAgentServer() as server:
        urls = [server.add(key, agent) for key, agent in agents.items()]
        ctl = fleet_controller(devconsul.url, urls, prefix, AZS)
        docs = drive_rounds(ctl, agents.values(), lambda: read_weights(client, prefix + "weights"), rounds=ROUNDS)
        ctl.consul.election.release()
    return docs


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "azprobe.commands.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_one_sick_host_is_named_and_its_zone_keeps_its_share(devconsul, tmp_path):
    prefix = f"azprobe/{uuid.uuid4().hex[:8]}/"
    docs = _run(devconsul, _fleet(with_hosts=True), prefix)
    final = docs[-1]
    assert final is not None
    shares = {az: z.share for az, z in final.zones.items()}
    assert all(abs(s - 33) <= 2 for s in shares.values()), shares
    assert all(d is None or d.zones["az-b"].state == "ok" for d in docs), [d and d.zones["az-b"] for d in docs]

    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    _, data = client.kv.get(prefix + "hosts")
    hosts = parse_hosts(data["Value"])
    assert [h.addr for h in hosts.sick()["az-b"]] == [SICK]
    assert "host quorum: 9 of 9 nodes" in hosts.sick()["az-b"][0].reasons[0]
    assert [h.addr for h in hosts.sick("az-a")["az-b"]] == [SICK]  # each source view names it too
    assert set(hosts.sick()) == {"az-b"}

    out = _cli("explain", "az-b", "--consul", devconsul.url, "--prefix", prefix)
    assert out.returncode == 0, out.stderr
    assert "sick hosts (demoted: Envoy DEGRADED):" in out.stdout and f"    - {SICK}" in out.stdout
    assert "a sick host is not a sick zone" in out.stdout
    as_json = json.loads(_cli("explain", "--json", "--consul", devconsul.url, "--prefix", prefix).stdout)
    assert [h["addr"] for h in as_json["sick_hosts"]["az-b"]] == [SICK]

    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps({az: [f"{a}:8080" for a in addrs] for az, addrs in SERVERS.items()}))
    eds = tmp_path / "eds.json"
    out = _cli("envoy-eds", "--cluster", "backend", "--endpoints", str(endpoints), "--out", str(eds),
               "--consul", devconsul.url, "--prefix", prefix)
    assert out.returncode == 0, out.stderr
    rendered = json.loads(eds.read_text())["resources"][0]["endpoints"]
    degraded = [e["endpoint"]["address"]["socket_address"]["address"] for loc in rendered
                for e in loc["lb_endpoints"] if e.get("health_status") == "DEGRADED"]
    assert degraded == [SICK]


def test_without_the_hosts_section_the_same_fleet_drains_the_zone(devconsul):
    prefix = f"azprobe/{uuid.uuid4().hex[:8]}/"
    docs = _run(devconsul, _fleet(with_hosts=False), prefix)
    assert docs[-1].zones["az-b"].state == "degraded" and docs[-1].zones["az-b"].share <= 5
    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    assert client.kv.get(prefix + "hosts")[1] is None  # no host evidence: the KV output is today's


def _named(client: consul.Consul, prefix: str) -> list[str] | None:
    """The global view's sick hosts of az-b in KV (None: no document yet)."""
    _, data = client.kv.get(prefix + "hosts")
    return None if data is None else [h.addr for h in parse_hosts(data["Value"]).sick().get("az-b", ())]


def test_an_operator_pin_takes_the_host_off_the_list_and_a_malformed_key_changes_nothing(devconsul):
    """Rounds 0-9: the host is named. Round 10: malformed host switches (the sick host's
    pin without an until, one beyond 3 days, a pin of no address): nothing changes but
    the ignored-keys gauge. Round 16: a valid pin; the round after the controller reads
    it, the host is off the list, the zone keeps its share and explain says why."""
    prefix = f"azprobe/{uuid.uuid4().hex[:8]}/"
    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    agents = _fleet(with_hosts=True)
    control = prefix + "control/host/"

    def operator(i: int) -> None:
        now = ctl.consul.wall()
        if i == 10:
            client.kv.put(control + SICK, json.dumps({"reason": "no until"}))
            client.kv.put(control + SERVERS["az-b"][1], json.dumps({"until": now + 4 * 86400}))
            client.kv.put(control + "web-3", json.dumps({"until": now + 600}))
            client.kv.put(prefix + "control/hosts-off", json.dumps({"until": "later"}))
        if i == 16:
            client.kv.put(control + SICK, json.dumps({"until": now + 600, "reason": "checked by hand, ticket 7"}))

    def read() -> tuple:
        return _named(client, prefix), read_weights(client, prefix + "weights"), \
            ctl.metrics.registry.get_sample_value("azprobe_controller_control_keys_ignored")

    with FakeAgentServer() as server:
        urls = [server.add(key, agent) for key, agent in agents.items()]
        ctl = fleet_controller(devconsul.url, urls, prefix, AZS)
        rounds = drive_rounds(ctl, agents.values(), read, rounds=20, before_pull=operator)
        sick_metric = ctl.metrics.registry.get_sample_value("azprobe_controller_sick_hosts", {"az": "az-b"})
        pinned_metric = ctl.metrics.registry.get_sample_value("azprobe_controller_pinned_hosts")
        ctl.consul.election.release()
    named = [r[0] for r in rounds]
    assert named[9] == [SICK], named
    assert all(n == [SICK] for n in named[10:17]), named  # the malformed keys change nothing
    assert rounds[10][2] == 4 and pinned_metric == 1
    before = {az: z.share for az, z in rounds[9][1].zones.items()}
    assert {az: z.share for az, z in rounds[16][1].zones.items()} == before
    # read in round 16's Consul tick, decided in round 17's cycle, written in its tick
    assert named[17] == [] and named[19] == [], named
    assert sick_metric == 0
    final = rounds[19][1]
    assert final.zones["az-b"].state == "ok" and abs(final.zones["az-b"].share - 33) <= 2
    assert any("pinned healthy by operator" in r and "ticket 7" in r for r in final.zones["az-b"].reasons)

    out = _cli("explain", "az-b", "--consul", devconsul.url, "--prefix", prefix)
    assert out.returncode == 0, out.stderr
    assert f"hosts: {SICK} pinned healthy by operator (control/host/{SICK})" in out.stdout
    assert "checked by hand, ticket 7" in out.stdout and f"    - {SICK}" not in out.stdout
