"""`azprobe xds serve`'s stream bounds over real gRPC: the per-client-address stream limit
refuses only the stream over it, and a stream on which nothing moves for idle_timeout_s
is ended by the server with UNAVAILABLE and a message saying why."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from tests import xds_harness as h
from tests.helpers import sample_weights_doc

pytestmark = pytest.mark.slow


def _put(dc, generation: int, az_a: int) -> None:
    doc = sample_weights_doc(generation, {"az-a": az_a, "az-b": 90 - az_a, "az-c": 10}, ttl_s=3600)
    assert dc.request("PUT", "/v1/kv/azprobe/v1/weights", doc.dumps()).status == 200


def _weights(r) -> dict[str, int]:
    cla = h.assignment(r.resources[0].resource)
    h.assert_never_empty(cla)
    return {l[0]: l[1] for l in h.localities(cla)}


def test_streams_over_the_per_client_limit_are_refused_and_the_others_keep_being_served(devconsul, tmp_path):
    _put(devconsul, 1, 50)
    xds = h.XdsProcess(h.write_config(tmp_path, devconsul.url, xds={"max_streams_per_client": 3}), tmp_path).start()

    async def run():
        async with grpc.aio.insecure_channel(xds.address) as ch:
            stub = h.ads_stub(ch)
            held = [h.Stream(stub.DeltaAggregatedResources()) for _ in range(3)]
            last = []
            for s in held:
                await s.send(h.delta(h.CLA, ["backend"]))
                last.append(await s.recv())
            # Refused as it opens (by peer, before any request): a request written into
            # the refusal would fail in gRPC's core with INTERNAL, hiding the status.
            extra = h.Stream(stub.DeltaAggregatedResources())
            refused = (await extra.ended(10), extra.details)
            for s, r in zip(held, last):
                await s.send(h.delta(h.CLA, zone=None, nonce=r.nonce))  # ACK
            _put(devconsul, 2, 70)
            updates = [await s.recv() for s in held]
            held[0].cancel()
            await h.wait_until(lambda: len(xds.status()["streams"]) == 2, 10, "the closed stream to leave")
            again = h.Stream(stub.DeltaAggregatedResources())  # a freed slot admits a new stream
            await again.send(h.delta(h.CLA, ["backend"]))
            readmitted = await again.recv()
            for s in (*held, again):
                s.cancel()
            return refused, [s.status for s in held[1:]], updates, readmitted

    try:
        refused, held_status, updates, readmitted = asyncio.run(run())
        assert refused[0] == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
        assert "maximum of 3 streams" in refused[1]
        assert held_status == [None, None]  # the held streams were not touched
        assert [_weights(r)["az-a"] for r in updates] == [70, 70, 70]
        assert readmitted is not None and _weights(readmitted)["az-a"] == 70
        assert xds.metric("azprobe_xds_refused_streams_total", reason="per_client") == 1
    finally:
        xds.stop()


def test_a_stream_idle_past_the_timeout_is_ended_with_unavailable_and_a_busy_one_stays(devconsul, tmp_path):
    _put(devconsul, 1, 50)
    xds = h.XdsProcess(h.write_config(tmp_path, devconsul.url, xds={"idle_timeout_s": 1}), tmp_path).start()

    async def run():
        async with grpc.aio.insecure_channel(xds.address) as ch:
            stub = h.ads_stub(ch)
            idle, busy = h.Stream(stub.DeltaAggregatedResources()), h.Stream(stub.DeltaAggregatedResources())
            for s in (idle, busy):
                await s.send(h.delta(h.CLA, ["backend"]))
            r_idle, r_busy = await idle.recv(), await busy.recv()
            await idle.send(h.delta(h.CLA, zone=None, nonce=r_idle.nonce))  # ACK, then nothing
            quiet_from = time.monotonic()
            # the busy stream asks again (subscribing resends) every 0.3 s: something moves
            while idle.status is None and time.monotonic() - quiet_from < 10:
                await busy.send(h.delta(h.CLA, ["backend"], zone=None, nonce=r_busy.nonce))
                r_busy = await busy.recv()
                await asyncio.sleep(0.3)  # the busy client's pace, not a synchronisation
            ended_after = time.monotonic() - quiet_from
            busy_status = busy.status
            idle.cancel()
            busy.cancel()
            return idle.status, idle.details, ended_after, busy_status

    try:
        status, details, ended_after, busy_status = asyncio.run(run())
        assert status == grpc.StatusCode.UNAVAILABLE, (status, details)
        assert "no request or response on this stream for 1 s" in details
        assert 1.0 <= ended_after < 5.0, ended_after
        assert busy_status is None  # still open
        assert xds.metric("azprobe_xds_refused_streams_total", reason="idle") == 1
    finally:
        xds.stop()


def test_a_wildcard_delta_stream_cycling_invented_names_is_answered_and_stays_bounded(devconsul, tmp_path):
    # Each request subscribes to names that do not exist and unsubscribes the previous
    # ones, within max_resource_names. The server answers each name absent once and
    # forgets it on unsubscribe: the stream is served to the end, not ended for what it
    # tracks (2 x 8 names + the snapshot's resources), and no memory is left behind.
    _put(devconsul, 1, 50)
    xds = h.XdsProcess(h.write_config(tmp_path, devconsul.url, xds={"max_resource_names": 8}), tmp_path).start()

    async def run():
        async with grpc.aio.insecure_channel(xds.address) as ch:
            s = h.Stream(h.ads_stub(ch).DeltaAggregatedResources())
            await s.send(h.delta(h.CDS))  # legacy wildcard
            first = await s.recv()
            removed, prev, nonce = [], [], first.nonce
            for round_ in range(10):
                names = [f"nope-{round_}-{i}" for i in range(4)]
                await s.send(h.delta(h.CDS, names, prev, zone=None, nonce=nonce))
                r = await s.recv()
                if r is None:
                    break
                removed.append(sorted(r.removed_resources))
                prev, nonce = names, r.nonce
            status = (s.status, s.details)
            s.cancel()
            return [x.name for x in first.resources], removed, status

    try:
        clusters, removed, status = asyncio.run(run())
        assert clusters == ["backend"]
        assert status == (None, ""), status  # still open
        assert removed == [[f"nope-{r}-{i}" for i in range(4)] for r in range(10)]
    finally:
        xds.stop()
