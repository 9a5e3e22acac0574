"""`azprobe xds serve` over real gRPC (sockets, the official stubs from xds-protos),
against a real devconsul: views by zone, the shared rendering on the wire, SotW NACKs,
delta subscriptions, hostile clients, a client that stops reading, the Consul catalog,
fail-static with Consul down, and the SIGTERM drain.

Every ClusterLoadAssignment a test receives is checked on the wire: never empty, never a
weight of 0 (assert_never_empty)."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest

from azprobe.consumers.envoy import render_cluster_load_assignment
from tests import xds_harness as h
from tests.helpers import sample_weights_doc

pytestmark = pytest.mark.slow
BIG = 3000  # endpoints per AZ of the `big` service: one assignment is ~0.3 MB


def put_weights(dc, doc, key: str = "weights", prefix: str = "azprobe/v1/") -> None:
    assert dc.request("PUT", f"/v1/kv/{prefix}{key}", doc.dumps()).status == 200


def big_endpoints() -> dict[str, list[str]]:
    return {az: [f"198.18.{k + 1}.{i // 250}:{8000 + i % 250}" for i in range(BIG)]
            for k, az in enumerate(("az-a", "az-b", "az-c"))}


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    """devconsul + one `azprobe xds` with two static services (backend, frontend) and a
    large one (big), for the tests that do not stop either."""
    from azprobe.dev.devconsul.testing import DevConsul

    work = tmp_path_factory.mktemp("xds")
    with DevConsul(data_dir=work / "dc") as dc:
        (work / "big.json").write_text(json.dumps(big_endpoints()))
        cfg = h.write_config(work, dc.url, xds={"max_resource_names": 100, "max_message_bytes": 262144},
                             services=[{"name": "backend", "endpoints_file": str(work / "endpoints.json")},
                                       {"name": "frontend", "endpoints_file": str(work / "endpoints.json")},
                                       {"name": "big", "endpoints_file": str(work / "big.json")}])
        xds = h.XdsProcess(cfg, work).start()
        try:
            yield dc, xds
        finally:
            xds.stop()


class Generations:
    """Each call: a new document (a new generation) whose shares differ from the last."""

    def __init__(self) -> None:
        self.n = int(time.time()) % 100000

    def __call__(self, shares: dict[str, int] | None = None, **kw):
        self.n += 1
        a = 40 + self.n % 20
        return sample_weights_doc(self.n, shares or {"az-a": a, "az-b": 100 - a - 10, "az-c": 10}, **kw)


GEN = Generations()


async def _cla(stream: h.Stream, timeout: float = 10.0):
    r = await stream.recv(timeout)
    assert r is not None, "no response"
    clas = [h.assignment(x.resource if hasattr(x, "name") and x.HasField("resource") else x)
            for x in r.resources]
    for cla in clas:
        h.assert_never_empty(cla)
    return r, clas


def test_both_doors_render_the_same_localities_for_the_same_document(plane):
    dc, xds = plane
    priorities = []
    for doc in (GEN({"az-a": 70, "az-b": 27, "az-c": 3}),  # az-c degraded at 3 %: drained, priority 1
                GEN({"az-a": 50, "az-b": 50})):  # az-c absent from the document: the floor share
        put_weights(dc, doc)
        file_door = render_cluster_load_assignment("backend", h.ENDPOINTS, doc)["resources"][0]["endpoints"]
        expected = [(l["locality"]["zone"], l["load_balancing_weight"], l.get("priority", 0),
                     [(e["endpoint"]["address"]["socket_address"]["address"],
                       e["endpoint"]["address"]["socket_address"]["port_value"]) for e in l["lb_endpoints"]])
                    for l in file_door]

        async def run():
            async with grpc.aio.insecure_channel(xds.address) as ch:
                deadline = time.monotonic() + 10
                while True:
                    s = h.Stream(h.ads_stub(ch).StreamAggregatedResources())
                    await s.send(h.sotw(h.CLA, ["backend"]))
                    _, clas = await _cla(s)
                    s.cancel()
                    if h.localities(clas[0]) == expected or time.monotonic() > deadline:
                        return h.localities(clas[0])
                    await asyncio.sleep(0.05)

        assert asyncio.run(run()) == expected
        priorities.append({zone: p for zone, _, p, _ in expected})
    assert priorities == [{"az-a": 0, "az-b": 0, "az-c": 1}, {"az-a": 0, "az-b": 0, "az-c": 0}]


def test_each_client_gets_its_zones_view_and_an_unknown_zone_the_global_one(plane):
    dc, xds = plane
    put_weights(dc, GEN({"az-a": 60, "az-b": 30, "az-c": 10}))
    put_weights(dc, GEN({"az-a": 90, "az-b": 5, "az-c": 5}, source_az="az-a"), "weights/from/az-a")

    async def run():
        async with grpc.aio.insecure_channel(xds.address) as ch:
            got = {}
            for zone in ("az-a", "az-zz", ""):
                deadline = time.monotonic() + 10
                while True:
                    s = h.Stream(h.ads_stub(ch).StreamAggregatedResources())
                    await s.send(h.sotw(h.CLA, ["backend"], zone=zone))
                    _, clas = await _cla(s)
                    weights = {l[0]: l[1] for l in h.localities(clas[0])}
                    views = {st["node"]: st["view"] for st in xds.status()["streams"]}
                    s.cancel()
                    if weights["az-a"] == (90 if zone == "az-a" else 60) or time.monotonic() > deadline:
                        got[zone] = (weights["az-a"], views)
                        break
                    await asyncio.sleep(0.05)
            return got

    got = asyncio.run(run())
    assert got["az-a"][0] == 90 and got["az-zz"][0] == 60 and got[""][0] == 60, got
    assert "az-a" in json.dumps(xds.status()["views"])


def test_a_nacking_stream_gets_one_response_per_change_and_the_nack_is_counted(plane):
    dc, xds = plane
    put_weights(dc, GEN())
    nacks_before = xds.metric("azprobe_xds_nacks_total", type="ClusterLoadAssignment")

    async def run():
        async with grpc.aio.insecure_channel(xds.address) as ch:
            s = h.Stream(h.ads_stub(ch).StreamAggregatedResources())
            await s.send(h.sotw(h.CLA, ["frontend"], zone="az-b"))
            r1, _ = await _cla(s)
            versions = [r1.version_info]
            for _ in range(3):
                await s.send(h.sotw(h.CLA, ["frontend"], zone=None, nonce=r1.nonce, version="",
                                    error="test: rejecting this assignment"))
                put_weights(dc, GEN())
                r1, _ = await _cla(s)
                versions.append(r1.version_info)
            mine = [st for st in xds.status()["streams"] if st["kind"] == "ads-sotw" and st["view"] == "az-b"]
            s.cancel()
            return versions, mine

    versions, mine = asyncio.run(run())
    # each response after a NACK is the next change, never the rejected version again
    assert len(set(versions)) == len(versions), versions
    assert [st["responses"] for st in mine] == [4] and mine[0]["nacks"] == 3, mine
    assert xds.metric("azprobe_xds_nacks_total", type="ClusterLoadAssignment") == nacks_before + 3


def test_delta_subscribe_unsubscribe_and_missing_names_as_the_protocol_says(plane):
    dc, xds = plane

    async def run():
        async with grpc.aio.insecure_channel(xds.address) as ch:
            d = h.Stream(h.ads_stub(ch).DeltaAggregatedResources())
            await d.send(h.delta(h.LDS, zone="az-c"))  # no names: the wildcard
            r = await d.recv()
            listeners = sorted(x.name for x in r.resources)
            await d.send(h.delta(h.LDS, zone=None, nonce=r.nonce))  # ACK
            await d.send(h.delta(h.CLA, ["backend", "nope"], zone=None))
            r = await d.recv()
            first = (sorted(x.name for x in r.resources), list(r.removed_resources))
            for x in r.resources:
                h.assert_never_empty(h.assignment(x.resource))
            await d.send(h.delta(h.CLA, ["frontend"], ["backend"], zone=None, nonce=r.nonce))
            r = await d.recv()
            second = (sorted(x.name for x in r.resources), list(r.removed_resources))
            put_weights(dc, GEN())  # a change: only what is still subscribed comes
            r = await d.recv()
            third = (r.type_url, sorted(x.name for x in r.resources), list(r.removed_resources))
            await d.send(h.delta(h.CLA, ["frontend"], zone=None, nonce=r.nonce))  # subscribe again: resent
            r = await d.recv()
            fourth = sorted(x.name for x in r.resources)
            d.cancel()
            return listeners, first, second, third, fourth

    listeners, first, second, third, fourth = asyncio.run(run())
    assert listeners == ["backend", "big", "frontend"]
    assert first == (["backend"], ["nope"])  # a name that does not exist: removed, once
    assert second == (["frontend"], [])
    assert third == (h.CLA, ["frontend"], [])
    assert fourth == ["frontend"]


def test_a_hostile_client_gets_an_error_on_its_own_stream_only(plane):
    dc, xds = plane

    async def run():
        async with grpc.aio.insecure_channel(xds.address, options=[("grpc.max_send_message_length", 8 << 20)]) as ch:
            stub = h.ads_stub(ch)
            bystander = h.Stream(stub.DeltaAggregatedResources())
            await bystander.send(h.delta(h.CLA, ["backend"], zone="az-b"))
            r = await bystander.recv()
            assert r is not None and [x.name for x in r.resources] == ["backend"]
            outcomes = {}

            async def hostile(label, requests, delta_stream=False):
                s = h.Stream(stub.DeltaAggregatedResources() if delta_stream else stub.StreamAggregatedResources())
                for req in requests:
                    await s.send(req)
                outcomes[label] = (await s.ended(), s.details)
                s.cancel()

            await hostile("unknown type", [h.sotw("type.googleapis.com/not.a.Type", ["x"])])
            await hostile("10,000 names", [h.sotw(h.CLA, [f"svc-{i}" for i in range(10_000)])])
            await hostile("10,000 names delta", [h.delta(h.CLA, [f"svc-{i}" for i in range(10_000)])], True)
            await hostile("invented nonce", [h.sotw(h.CLA, ["backend"], nonce="987654")])
            await hostile("oversize", [h.sotw(h.CLA, ["x" * 300_000])])
            # a stale nonce is ignored (the protocol's rule): the stream stays and answers
            s = h.Stream(stub.StreamAggregatedResources())
            await s.send(h.sotw(h.CLA, ["backend"]))
            r1 = await s.recv()
            await s.send(h.sotw(h.CLA, ["backend", "frontend"], zone=None, nonce=r1.nonce))
            r2 = await s.recv()
            await s.send(h.sotw(h.CLA, ["frontend"], zone=None, nonce=r1.nonce))  # stale: ignored
            put_weights(dc, GEN())
            r3 = await s.recv()
            stale = (s.status, sorted(h.assignment(x).cluster_name for x in r3.resources))
            s.cancel()
            put_weights(dc, GEN())
            after = await bystander.recv()
            bystander.cancel()
            return outcomes, stale, after

    outcomes, stale, after = asyncio.run(run())
    assert outcomes["unknown type"][0] == grpc.StatusCode.INVALID_ARGUMENT, outcomes
    assert "unknown type_url" in outcomes["unknown type"][1]
    assert outcomes["10,000 names"][0] == grpc.StatusCode.RESOURCE_EXHAUSTED, outcomes
    assert outcomes["10,000 names delta"][0] == grpc.StatusCode.RESOURCE_EXHAUSTED, outcomes
    assert outcomes["invented nonce"][0] == grpc.StatusCode.INVALID_ARGUMENT, outcomes
    assert outcomes["oversize"][0] == grpc.StatusCode.RESOURCE_EXHAUSTED, outcomes
    assert stale == (None, ["backend", "frontend"]), stale
    assert after is not None and [x.name for x in after.resources] == ["backend"]  # the others go on
    assert xds.metric("azprobe_xds_refused_streams_total", reason="protocol") >= 4


def test_a_client_that_stops_reading_stalls_nobody_and_holds_one_response(plane):
    dc, xds = plane

    async def run():
        # No BDP probing: the slow client keeps HTTP/2's initial 64 KiB window, as a stuck client does.
        async with grpc.aio.insecure_channel(xds.address, options=[("grpc.http2.bdp_probe", 0)]) as slow_ch, \
                grpc.aio.insecure_channel(xds.address, options=[("grpc.max_receive_message_length", 8 << 20)]) as ch:
            slow = h.ads_stub(slow_ch).StreamAggregatedResources()
            await slow.write(h.sotw(h.CLA, ["big"], zone="az-c"))  # and never reads
            fast = h.Stream(h.ads_stub(ch).StreamAggregatedResources())
            await fast.send(h.sotw(h.CLA, ["big"], zone="az-c"))
            r = await fast.recv()
            rss0 = xds.rss_kb()
            received = 1
            for _ in range(25):
                put_weights(dc, GEN())
                r2 = await fast.recv()
                assert r2 is not None and r2.version_info != r.version_info
                await fast.send(h.sotw(h.CLA, ["big"], zone=None, nonce=r2.nonce, version=r2.version_info))
                r, received = r2, received + 1
            streams = [st for st in xds.status()["streams"] if st["view"] == "az-c" and st["kind"] == "ads-sotw"]
            rss1 = xds.rss_kb()
            slow.cancel()
            fast.cancel()
            return received, streams, rss1 - rss0

    received, streams, growth_kb = asyncio.run(run())
    assert received == 26
    responses = sorted(st["responses"] for st in streams)
    assert responses[0] <= 2 and responses[-1] == 26, streams  # the slow one got no queue of pushes
    # 25 assignments of ~0.3 MB queued for the slow stream would be ~8 MB
    assert growth_kb < 6 * 1024, growth_kb


def test_consul_catalog_endpoints_by_topology_and_the_ones_outside_counted(devconsul, tmp_path):
    dc = devconsul
    for i, (node, addr, port) in enumerate([("n1", "198.18.1.10", 8080), ("n2", "198.18.2.10", 8080),
                                            ("n3", "198.18.2.11", 8081), ("n4", "203.0.113.5", 8080)]):
        body = {"Node": node, "Address": addr, "Service": {"ID": f"api-{i}", "Service": "api", "Port": port}}
        assert dc.request("PUT", "/v1/catalog/register", json.dumps(body)).status == 200
    cfg = h.write_config(tmp_path, dc.url, services=[{"name": "api", "consul_service": "api"}],
                         topology={"az-a": ["198.18.1.0/24"], "az-b": ["198.18.2.0/24"]})
    xds = h.XdsProcess(cfg, tmp_path).start()
    try:
        async def run():
            async with grpc.aio.insecure_channel(xds.address) as ch:
                s = h.Stream(h.eds_stub(ch).StreamEndpoints())  # the standalone EDS service
                await s.send(h.sotw(h.CLA, ["api"], zone="az-a"))
                _, clas = await _cla(s)
                first = h.localities(clas[0])
                body = {"Node": "n5", "Address": "198.18.1.11", "Service": {"ID": "api-9", "Service": "api",
                                                                            "Port": 8080}}
                assert dc.request("PUT", "/v1/catalog/register", json.dumps(body)).status == 200
                _, clas = await _cla(s)
                s.cancel()
                return first, h.localities(clas[0])

        first, second = asyncio.run(run())
        assert first == [("az-a", 1, 0, [("198.18.1.10", 8080)]),
                         ("az-b", 1, 0, [("198.18.2.10", 8080), ("198.18.2.11", 8081)])]
        assert second[0] == ("az-a", 1, 0, [("198.18.1.10", 8080), ("198.18.1.11", 8080)])
        assert xds.metric("azprobe_xds_endpoints_outside_topology", service="api") == 1
    finally:
        xds.stop()


def test_fail_static_consul_down_keeps_the_last_assignment_and_a_fresh_start_serves_equal(devconsul, tmp_path):
    dc = devconsul
    doc = GEN({"az-a": 70, "az-b": 25, "az-c": 5})
    put_weights(dc, doc)
    cfg = h.write_config(tmp_path, dc.url)
    xds = h.XdsProcess(cfg, tmp_path).start()

    async def fetch():
        async with grpc.aio.insecure_channel(xds.address) as ch:
            d = h.Stream(h.ads_stub(ch).DeltaAggregatedResources())
            await d.send(h.delta(h.CLA, ["backend"], zone="az-a"))
            r = await d.recv()
            d.cancel()
            cla = h.assignment(r.resources[0].resource)
            h.assert_never_empty(cla)
            return {l[0]: l[1] for l in h.localities(cla)}

    try:
        assert asyncio.run(fetch()) == {"az-a": 70, "az-b": 25, "az-c": 5}
        dc.kill()
        asyncio.run(h.wait_until(lambda: xds.metric("azprobe_xds_consul_errors_total") > 0, 20, "a Consul error"))
        assert asyncio.run(fetch()) == {"az-a": 70, "az-b": 25, "az-c": 5}  # the last good one
        xds.stop()
        xds = h.XdsProcess(cfg, tmp_path).start()  # a fresh start with Consul down
        assert asyncio.run(fetch()) == {"az-a": 1, "az-b": 1, "az-c": 1}
    finally:
        xds.stop()


def test_sigterm_drains_the_streams_and_exits_0(devconsul, tmp_path):
    cfg = h.write_config(tmp_path, devconsul.url, xds={"drain_s": 1.0})
    xds = h.XdsProcess(cfg, tmp_path).start()

    async def run():
        async with grpc.aio.insecure_channel(xds.address) as ch:
            streams = [h.Stream(h.ads_stub(ch).DeltaAggregatedResources()) for _ in range(20)]
            for s in streams:
                await s.send(h.delta(h.CLA, ["backend"]))
            for s in streams:
                assert await s.recv() is not None
            xds.proc.terminate()
            return [await s.ended(15) for s in streams]

    try:
        ended = asyncio.run(run())
        assert ended == [grpc.StatusCode.OK] * 20, ended
        assert xds.proc.wait(timeout=15) == 0
    finally:
        xds.stop()


def test_sick_hosts_are_degraded_on_the_wire_as_in_the_file(plane):
    """The sick-hosts document beside the weights: the named address's endpoints (250
    ports of one address in the `big` service) are DEGRADED on the wire, the others not,
    the same endpoints as the file door marks; weights and lists unchanged."""
    from envoy.config.core.v3 import health_check_pb2

    from azprobe.contracts.weights_hosts import HostsDoc, SickHostEntry

    dc, xds = plane
    doc = GEN({"az-a": 34, "az-b": 33, "az-c": 33})
    now = time.time()
    hosts = HostsDoc(generation=doc.generation, generated_at=now, expires_at=now + 60,
                     global_view={"az-a": (SickHostEntry("198.18.1.0", ("host quorum: ...",)),)}, from_views={})
    put_weights(dc, doc)
    assert dc.request("PUT", "/v1/kv/azprobe/v1/hosts", hosts.dumps()).status == 200
    sick = {"az-a": ["198.18.1.0"]}
    file_door = render_cluster_load_assignment("big", big_endpoints(), doc, sick)["resources"][0]["endpoints"]
    want = {(loc["locality"]["zone"], e["endpoint"]["address"]["socket_address"]["address"],
             e["endpoint"]["address"]["socket_address"]["port_value"])
            for loc in file_door for e in loc["lb_endpoints"] if e.get("health_status") == "DEGRADED"}
    assert len(want) == 250

    async def run():
        async with grpc.aio.insecure_channel(xds.address) as ch:
            deadline = time.monotonic() + 10
            while True:
                s = h.Stream(h.ads_stub(ch).StreamAggregatedResources())
                await s.send(h.sotw(h.CLA, ["big"]))
                _, clas = await _cla(s, timeout=20)
                s.cancel()
                got = {(loc.locality.zone, e.endpoint.address.socket_address.address,
                        e.endpoint.address.socket_address.port_value)
                       for loc in clas[0].endpoints for e in loc.lb_endpoints
                       if e.health_status == health_check_pb2.DEGRADED}
                if got == want or time.monotonic() > deadline:
                    return got, clas[0]

    got, cla = asyncio.run(run())
    assert got == want
    assert [len(loc.lb_endpoints) for loc in cla.endpoints] == [BIG] * 3
    assert dc.request("DELETE", "/v1/kv/azprobe/v1/hosts").status == 200
