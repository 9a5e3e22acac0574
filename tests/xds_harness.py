"""`azprobe xds serve` as a subprocess on port 0, and grpc.aio clients of it (the
official stubs from xds-protos), for the xDS tests and bench/xds_fanout.py."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from azprobe.config import dump_toml
from azprobe.daemon.address_file import read_address_file
from tests.helpers import stop_process

ROOT = Path(__file__).resolve().parents[1]
ENDPOINTS = {"az-a": ["198.18.1.2:8080"], "az-b": ["198.18.2.2:8080"], "az-c": ["198.18.3.2:8080"]}
CLA = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
RDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"


def write_config(work: Path, consul_url: str, *, prefix: str = "azprobe/v1/", endpoints: dict | None = None,
                 xds: dict[str, Any] | None = None, services: list[dict[str, Any]] | None = None,
                 topology: dict[str, list[str]] | None = None, consul: dict[str, str] | None = None) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    eps = work / "endpoints.json"
    eps.write_text(json.dumps(endpoints or ENDPOINTS))
    tables: dict[str, Any] = {"xds": {"listen": "127.0.0.1:0", "metrics_listen": "127.0.0.1:0", **(xds or {})},
                              "consul": {"address": consul_url, "prefix": prefix, **(consul or {})}}
    if topology:
        tables["topology"] = topology
    text = dump_toml(tables)
    for svc in services or [{"name": "backend", "endpoints_file": str(eps)}]:
        text += "\n[[service]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in svc.items())
    path = work / "xds.toml"
    path.write_text(text)
    return path


@dataclass
class XdsProcess:
    config: Path
    work: Path
    proc: subprocess.Popen[bytes] | None = None
    address: str = ""
    metrics_url: str = ""
    env: dict[str, str] = field(default_factory=dict)

    def start(self, timeout_s: float = 20.0) -> "XdsProcess":
        addr_file, metrics_file = self.work / "xds.address", self.work / "metrics.address"
        for f in (addr_file, metrics_file):
            f.unlink(missing_ok=True)
        self.log = self.work / "xds.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "azprobe.commands.cli", "-v", "xds", "serve",
                                      "--config", str(self.config), "--address-file", str(addr_file),
                                      "--metrics-address-file", str(metrics_file)],
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, cwd=ROOT,
                                     env={**os.environ, **self.env})
        deadline = time.monotonic() + timeout_s
        while not (addr_file.exists() and metrics_file.exists()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"azprobe xds exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"azprobe xds did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        text = addr_file.read_text().strip()
        self.address = text if text.startswith("unix:") else "%s:%d" % read_address_file(addr_file)
        self.metrics_url = "http://%s:%d" % read_address_file(metrics_file)
        return self

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.metrics_url + path, timeout=5) as r:
            return r.read().decode()

    def status(self) -> dict[str, Any]:
        return json.loads(self.get("/status"))

    def metric(self, name: str, **labels: str) -> float:
        """The value of one series of /metrics (0 when absent)."""
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in self.get("/metrics").splitlines():
            if line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            name_part, _, label_part = series.partition("{")
            if name_part == name and ",".join(sorted(label_part.rstrip("}").split(","))) == want:
                return float(value)
        return 0.0

    def rss_kb(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self, timeout_s: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            stop_process(self.proc, timeout_s)
        return self.proc.returncode


class Stream:
    """One bidi xDS stream: `send(req)`, `recv(timeout)` (None on timeout), `.status`
    once it ended (a grpc.StatusCode), for SotW or delta alike."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.status: Any = None
        self.details = ""
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        import grpc

        try:
            async for msg in self.call:
                await self.queue.put(msg)
            self.status = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as exc:
            self.status, self.details = exc.code(), exc.details() or ""
        except asyncio.CancelledError:
            raise
        await self.queue.put(None)

    async def send(self, req: Any) -> None:
        await self.call.write(req)

    async def recv(self, timeout: float = 10.0) -> Any:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            return None

    async def ended(self, timeout: float = 10.0) -> Any:
        deadline = time.monotonic() + timeout
        while self.status is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return self.status

    def cancel(self) -> None:
        self.call.cancel()
        self._task.cancel()


def node(zone: str = "", node_id: str = "test") -> Any:
    from envoy.config.core.v3 import base_pb2

    return base_pb2.Node(id=node_id, cluster="test", locality=base_pb2.Locality(zone=zone))


def sotw(type_url: str, names: list[str] = (), *, zone: str | None = "", nonce: str = "", version: str = "",
         error: str | None = None) -> Any:
    from envoy.service.discovery.v3 import discovery_pb2
    from google.rpc import status_pb2

    req = discovery_pb2.DiscoveryRequest(type_url=type_url, resource_names=list(names), response_nonce=nonce,
                                         version_info=version)
    if zone is not None:
        req.node.CopyFrom(node(zone))
    if error is not None:
        req.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    return req


def delta(type_url: str, subscribe: list[str] = (), unsubscribe: list[str] = (), *, zone: str | None = "",
          nonce: str = "", error: str | None = None) -> Any:
    from envoy.service.discovery.v3 import discovery_pb2
    from google.rpc import status_pb2

    req = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, resource_names_subscribe=list(subscribe),
                                              resource_names_unsubscribe=list(unsubscribe), response_nonce=nonce)
    if zone is not None:
        req.node.CopyFrom(node(zone))
    if error is not None:
        req.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    return req


def ads_stub(channel: Any) -> Any:
    from envoy.service.discovery.v3 import ads_pb2_grpc

    return ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)


def eds_stub(channel: Any) -> Any:
    from envoy.service.endpoint.v3 import eds_pb2_grpc

    return eds_pb2_grpc.EndpointDiscoveryServiceStub(channel)


def assignment(any_msg: Any) -> Any:
    from envoy.config.endpoint.v3 import endpoint_pb2

    cla = endpoint_pb2.ClusterLoadAssignment()
    assert any_msg.Unpack(cla)
    return cla


def localities(cla: Any) -> list[tuple[str, int, int, list[tuple[str, int]]]]:
    """(zone, weight, priority, endpoints) of each locality, as on the wire."""
    return [(l.locality.zone, l.load_balancing_weight.value, l.priority,
             [(e.endpoint.address.socket_address.address, e.endpoint.address.socket_address.port_value)
              for e in l.lb_endpoints]) for l in cla.endpoints]


def assert_never_empty(cla: Any) -> None:
    """The fail-static contract on the wire: an assignment has endpoints and no weight 0."""
    assert cla.endpoints, f"empty assignment on the wire: {cla}"
    for l in cla.endpoints:
        assert l.lb_endpoints, f"a locality without endpoints on the wire: {l}"
        assert l.load_balancing_weight.value >= 1, f"weight {l.load_balancing_weight.value} on the wire: {l}"


async def wait_until(predicate: Any, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def aiter_requests(queue: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    while (item := await queue.get()) is not None:
        yield item
