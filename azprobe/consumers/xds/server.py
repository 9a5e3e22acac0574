"""The gRPC shell of `azprobe xds`: the Aggregated Discovery Service (SotW and delta)
and the standalone Endpoint Discovery Service, on grpcio's asyncio server.

A stream is one coroutine (grpc's handler task) reading requests, and one small record
(StreamInfo) in the Hub. The Hub holds the latest snapshot per view; a change, like a
request, "kicks" the stream: a write task is started when none runs (or told to look
again when one does), writes what the stream lacks of its view's latest snapshot
(azprobe.consumers.xds.streams) and ends. Nothing is queued, so a stream that does not
read blocks only its own write task (gRPC flow control) with one response in flight,
and an idle stream holds no task of ours at all. The responses are the snapshot's
bytes, serialized once per view, version and selection of resources and shared by every
stream owed the same; per stream only the nonce is appended (streams.EncodedResponse),
so the response handlers take bytes (no serializer).

A stream's view is chosen once, from the first request's node.locality.zone: the zone's
own view when the server has one, else the global view.

Ending a stream from outside (SIGTERM's drain, the idle timeout) cancels its handler
with the reason recorded in StreamInfo.ending, and the handler turns that into the
stream's status.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.service.discovery.v3 import ads_pb2, ads_pb2_grpc, discovery_pb2
from envoy.service.endpoint.v3 import eds_pb2, eds_pb2_grpc

from azprobe.consumers.xds import resources
from azprobe.consumers.xds.metrics import XdsMetrics
from azprobe.consumers.xds.snapshot import ViewSnapshot
from azprobe.consumers.xds.sources import GLOBAL_VIEW
from azprobe.consumers.xds.streams import DeltaStream, ProtocolError, SotwStream, short_type

log = logging.getLogger(__name__)
MAX_LOGGED_DETAIL = 300
SWEEP_EVERY_S = 1.0  # the idle check's period (shorter when the idle timeout is)
ADS_SERVICE = ads_pb2.DESCRIPTOR.services_by_name["AggregatedDiscoveryService"].full_name
EDS_SERVICE = eds_pb2.DESCRIPTOR.services_by_name["EndpointDiscoveryService"].full_name


@dataclass(frozen=True)
class Limits:
    max_streams: int = 10_000
    max_streams_per_client: int = 1_000
    max_resource_names: int = 1024
    first_request_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0
    drain_s: float = 5.0


@dataclass(frozen=True)
class Ending:
    """Why the server ends a stream: the status its client gets, and the refusal counted."""

    code: grpc.StatusCode
    message: str
    reason: str = ""  # azprobe_xds_refused_streams_total's reason; "" for an OK end


@dataclass(slots=True, eq=False)
class StreamInfo:
    id: int
    kind: str
    peer: str
    state: SotwStream | DeltaStream
    context: Any  # grpc.aio.ServicerContext
    view: str = ""
    node_id: str = ""
    started: float = field(default_factory=time.monotonic)
    active: float = field(default_factory=time.monotonic)  # last request read or response written
    responses: int = 0
    nacks: int = 0
    task: asyncio.Task[Any] | None = None  # the handler
    writer: asyncio.Task[None] | None = None  # the write task, while one runs
    again: bool = False  # kicked while writing: look once more
    ending: Ending | None = None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "peer": self.peer, "view": self.view, "node": self.node_id,
                "age_s": round(time.monotonic() - self.started, 1), "responses": self.responses,
                "nacks": self.nacks}


def _ignore(_: StreamInfo) -> None:
    pass


class Hub:
    """The latest snapshot of every view, and the streams to kick when one changes."""

    def __init__(self, snapshots: dict[str, ViewSnapshot], metrics: XdsMetrics) -> None:
        if GLOBAL_VIEW not in snapshots:
            raise ValueError("the global view is required")
        self.snapshots = dict(snapshots)
        self.changed_at: dict[str, float] = {}  # view -> monotonic time its input change was read
        self.metrics = metrics
        self.streams: dict[int, StreamInfo] = {}
        self.per_peer: dict[str, int] = {}
        self.draining = False
        self.kick: Callable[[StreamInfo], None] = _ignore  # the StreamRunner's
        self.end: Callable[[StreamInfo, Ending], None] = lambda info, ending: None
        self.drain_s = 0.0
        self._next_id = 0

    def view_for(self, zone: str) -> str:
        return zone if zone and zone != GLOBAL_VIEW and zone in self.snapshots else GLOBAL_VIEW

    def publish(self, snapshots: dict[str, ViewSnapshot], changed_at: float) -> list[str]:
        """Install the snapshots whose content differs; kick their streams. The changed views."""
        changed = [view for view, snap in snapshots.items()
                   if view not in self.snapshots or self.snapshots[view].system_version != snap.system_version]
        for view in changed:
            self.snapshots[view] = snapshots[view]
            self.changed_at[view] = changed_at
        if changed:
            wake = set(changed)
            for info in list(self.streams.values()):
                if info.view in wake:
                    self.kick(info)
        return changed

    def open(self, kind: str, peer: str, state: SotwStream | DeltaStream, context: Any) -> StreamInfo:
        self._next_id += 1
        info = StreamInfo(self._next_id, kind, peer, state, context)
        self.streams[info.id] = info
        self.per_peer[peer] = self.per_peer.get(peer, 0) + 1
        return info

    def close(self, info: StreamInfo) -> None:
        if self.streams.pop(info.id, None) is None:
            return
        left = self.per_peer.get(info.peer, 1) - 1
        if left:
            self.per_peer[info.peer] = left
        else:
            self.per_peer.pop(info.peer, None)
        if info.view:
            self.metrics.streams.labels(info.kind, info.view).dec()

    def drain(self) -> None:
        """No new streams; the open ones end with OK, spread over drain_s, so their
        clients' reconnects to other replicas are spread too."""
        self.draining = True
        loop = asyncio.get_running_loop()
        for info in list(self.streams.values()):
            loop.call_later(random.uniform(0, self.drain_s), self.end, info,
                            Ending(grpc.StatusCode.OK, "server is draining; reconnect"))


def client_address(peer: str) -> str:
    """"ipv4:10.0.0.1:5555" -> "ipv4:10.0.0.1"; a unix peer is one client per socket path."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return f"{kind}:{rest.rsplit(':', 1)[0]}"
    return kind or "unknown"


class StreamRunner:
    def __init__(self, hub: Hub, limits: Limits) -> None:
        self.hub, self.limits = hub, limits
        hub.kick, hub.end, hub.drain_s = self.kick, self.end, limits.drain_s
        self._sweeper: asyncio.TimerHandle | None = None

    async def run(self, kind: str, state: SotwStream | DeltaStream, requests: AsyncIterator[Any],
                  context: grpc.aio.ServicerContext) -> None:
        hub = self.hub
        peer = client_address(context.peer() or "")
        await self._admit(context, peer)
        info = hub.open(kind, peer, state, context)
        info.task = asyncio.current_task()
        self._start_sweeper()
        try:
            if not await self._first(info, requests):
                return  # the client closed before asking anything
            async for req in requests:
                info.active = time.monotonic()
                if self._handle(req, info):
                    self.kick(info)
            # the client closed its side: the stream ends with OK
        except ProtocolError as exc:
            await self._refuse(context, "protocol", getattr(grpc.StatusCode, exc.code), str(exc))
        except asyncio.CancelledError:
            ending = info.ending
            if ending is None:
                raise  # grpc's: the client went away
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            if ending.reason:
                await self._refuse(context, ending.reason, ending.code, ending.message)
        finally:
            if info.writer is not None:
                info.writer.cancel()
            hub.close(info)

    async def _first(self, info: StreamInfo, requests: AsyncIterator[Any]) -> bool:
        """The first request, within first_request_timeout_s: it names the view."""
        try:
            first = await asyncio.wait_for(anext(requests), self.limits.first_request_timeout_s)
        except StopAsyncIteration:
            return False
        except asyncio.TimeoutError:
            await self._refuse(info.context, "first_request_timeout", grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"no request within {self.limits.first_request_timeout_s:g} s")
        has_node = first.HasField("node")
        info.view = self.hub.view_for(first.node.locality.zone if has_node else "")
        info.node_id = first.node.id[:200] if has_node else ""
        self.hub.metrics.streams.labels(info.kind, info.view).inc()
        info.active = time.monotonic()
        self._handle(first, info)
        self.kick(info)
        return True

    async def _admit(self, context: grpc.aio.ServicerContext, peer: str) -> None:
        """Refuse a new stream while draining or over a stream limit (the call ends)."""
        hub = self.hub
        if hub.draining:
            await self._refuse(context, "draining", grpc.StatusCode.UNAVAILABLE, "server is draining; reconnect")
        if len(hub.streams) >= self.limits.max_streams:
            await self._refuse(context, "streams", grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"server holds its maximum of {self.limits.max_streams} streams")
        if hub.per_peer.get(peer, 0) >= self.limits.max_streams_per_client:
            await self._refuse(context, "per_client", grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"{peer} holds its maximum of {self.limits.max_streams_per_client} streams")

    def kick(self, info: StreamInfo) -> None:
        """Something changed for this stream: write what it lacks (one write task at most)."""
        if not info.view or info.ending is not None:
            return
        if info.writer is None:
            info.writer = asyncio.get_running_loop().create_task(self._write(info))
        else:
            info.again = True

    def end(self, info: StreamInfo, ending: Ending) -> None:
        if info.ending is None and info.task is not None and self.hub.streams.get(info.id) is info:
            info.ending = ending
            info.task.cancel()

    async def _write(self, info: StreamInfo) -> None:
        """Write what this stream has not seen of its view's latest snapshot."""
        hub, metrics = self.hub, self.hub.metrics
        try:
            while True:
                info.again = False
                for response in info.state.pending(hub.snapshots[info.view]):
                    info.responses += 1  # counted before the write returns: the client may have it already
                    metrics.pushed(response.type_url)
                    await info.context.write(response.wire())
                    info.active = time.monotonic()
                    changed_at = hub.changed_at.get(info.view)
                    if changed_at is not None and changed_at > info.started:
                        metrics.push_delay.observe(max(0.0, time.monotonic() - changed_at))
                if not info.again:
                    return
        except (grpc.RpcError, asyncio.InvalidStateError, grpc.aio.AbortError) as exc:
            log.debug("stream %d: write failed (%s); the stream is ending", info.id, type(exc).__name__)
        finally:
            info.writer = None

    def _start_sweeper(self) -> None:
        if self._sweeper is None:
            period = min(SWEEP_EVERY_S, self.limits.idle_timeout_s / 4)
            self._sweeper = asyncio.get_running_loop().call_later(period, self._sweep, period)

    def _sweep(self, period: float) -> None:
        """End the streams on which nothing moved, either way, for idle_timeout_s."""
        idle_s = self.limits.idle_timeout_s
        cutoff = time.monotonic() - idle_s
        for info in list(self.hub.streams.values()):
            if info.active < cutoff:  # a write blocked that long counts: the client stopped reading
                self.end(info, Ending(grpc.StatusCode.UNAVAILABLE,
                                      f"no request or response on this stream for {idle_s:g} s; reconnect", "idle"))
        self._sweeper = asyncio.get_running_loop().call_later(period, self._sweep, period)

    def _handle(self, req: Any, info: StreamInfo) -> bool:
        """Apply one request; True when the stream may be owed a response because of it."""
        outcome = info.state.on_request(req)
        if outcome.nack is not None:
            info.nacks += 1
            self.hub.metrics.nacks.labels(short_type(outcome.type_url)).inc()
            log.warning("NACK of %s from node %r (%s, view %s): %s", short_type(outcome.type_url), info.node_id,
                        info.peer, info.view, outcome.nack[:MAX_LOGGED_DETAIL].encode("unicode_escape").decode())
        return outcome.may_owe

    async def _refuse(self, context: grpc.aio.ServicerContext, reason: str, code: grpc.StatusCode,
                      message: str) -> None:
        self.hub.metrics.refused.labels(reason).inc()
        await context.abort(code, message)  # raises: ends this stream only


class AdsServicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self, runner: StreamRunner) -> None:
        self.runner = runner

    async def StreamAggregatedResources(self, request_iterator, context):  # type: ignore[no-untyped-def,override]
        state = SotwStream(resources.TYPES, max_names=self.runner.limits.max_resource_names)
        await self.runner.run("ads-sotw", state, request_iterator, context)

    async def DeltaAggregatedResources(self, request_iterator, context):  # type: ignore[no-untyped-def,override]
        state = DeltaStream(resources.TYPES, max_names=self.runner.limits.max_resource_names)
        await self.runner.run("ads-delta", state, request_iterator, context)


class EdsServicer(eds_pb2_grpc.EndpointDiscoveryServiceServicer):
    def __init__(self, runner: StreamRunner) -> None:
        self.runner = runner

    async def StreamEndpoints(self, request_iterator, context):  # type: ignore[no-untyped-def,override]
        state = SotwStream((resources.ENDPOINT,), max_names=self.runner.limits.max_resource_names)
        await self.runner.run("eds-sotw", state, request_iterator, context)

    async def DeltaEndpoints(self, request_iterator, context):  # type: ignore[no-untyped-def,override]
        state = DeltaStream((resources.ENDPOINT,), max_names=self.runner.limits.max_resource_names)
        await self.runner.run("eds-delta", state, request_iterator, context)


def grpc_options(max_message_bytes: int, idle_timeout_s: float, keepalive_s: float,
                 keepalive_timeout_s: float) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_connection_idle_ms", int(idle_timeout_s * 1000)),  # a connection without streams
        ("grpc.keepalive_time_ms", int(keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.so_reuseport", 0),
    ]


def _stream_handlers(servicer: Any, methods: dict[str, Any]) -> dict[str, grpc.RpcMethodHandler]:
    # responses arrive serialized (streams.EncodedResponse.wire): no response_serializer
    return {name: grpc.stream_stream_rpc_method_handler(getattr(servicer, name), request_deserializer=request.FromString)
            for name, request in methods.items()}


def build_server(hub: Hub, limits: Limits, options: list[tuple[str, int]]) -> grpc.aio.Server:
    server = grpc.aio.server(options=options)
    runner = StreamRunner(hub, limits)
    sotw, delta = discovery_pb2.DiscoveryRequest, discovery_pb2.DeltaDiscoveryRequest
    for service, handlers in (
            (ADS_SERVICE, _stream_handlers(AdsServicer(runner), {"StreamAggregatedResources": sotw,
                                                                 "DeltaAggregatedResources": delta})),
            (EDS_SERVICE, _stream_handlers(EdsServicer(runner), {"StreamEndpoints": sotw, "DeltaEndpoints": delta}))):
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
        server.add_registered_method_handlers(service, handlers)
    return server


Refresh = Callable[[], None]
