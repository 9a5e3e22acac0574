"""HTTP/1.1 in the lab: a server per AZ and a load client that records every request.

    python -m azprobe.dev.lab.http server --port 8080 --az az-b
        Keep-alive HTTP/1.1 on every address of the namespace. Every response (any path,
        /healthz included) is `200` with the header `x-az: <az>` and the AZ as body, so a
        client behind a proxy sees which AZ served it.
    python -m azprobe.dev.lab.http load --url 127.0.0.1:10000 --rate 100 --out F
            [--admin 127.0.0.1:9901 --admin-out G]
        Open-loop load: `rate` GET requests per second, each on an idle keep-alive
        connection or a new one, whatever the previous requests are doing (a closed loop
        would slow down with the server and hide the latency users see). One record per
        request to --out (CSV: monotonic send time, latency ms, status, serving AZ);
        status 0 = client timeout, -1 = connection error. With --admin it first waits
        until Envoy is LIVE with every host healthy, then samples Envoy's request counters
        (/clusters) to --admin-out twice a second (JSON lines): per zone, and per host its
        rq_total and health_flags (`/degraded_eds_health` when the EDS marks it DEGRADED).

Why our own client rather than hey or wrk: the drill needs per-request timestamps and
the serving AZ of every request (for the timeline and to cross-check Envoy's counters);
hey reports only aggregates without them and wrk needs a Lua script for each. Why our own
server rather than nginx: one tiny process per AZ that names its AZ in every response,
with no config files or Debian package. Both speak plain HTTP/1.1 through a real Envoy.

Both print "ready" on stdout once serving/started (the lab's process protocol).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from azprobe.dev.lab.topology import HTTP_PORT
from azprobe.dev.lab.traffic import _has_ipv6_address, _ready, _until_signalled

MAX_HEADER_BYTES = 16 * 1024
MAX_BODY_BYTES = 1024 * 1024
MAX_CONNECTIONS = 256  # the load client's bound: beyond it a request counts as an error
CLIENT_TIMEOUT = 0  # status of a request the client gave up on
CLIENT_ERROR = -1  # status of a request whose connection failed


# --- server -------------------------------------------------------------------------

async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, az: str) -> None:
    body = f"{az}\n".encode()
    response = (f"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {len(body)}\r\n"
                f"x-az: {az}\r\n\r\n").encode() + body
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError:
                writer.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
                             b"connection: close\r\n\r\n")
                break
            length = _content_length(head)
            if length is None or length > MAX_BODY_BYTES:
                writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                break
            if length:
                await reader.readexactly(length)
            writer.write(response)
            await writer.drain()
            if b"\r\nconnection: close" in head.lower():
                break
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        pass
    finally:
        writer.close()


def _content_length(head: bytes) -> int | None:
    """The request's Content-Length (0 when absent), None when malformed."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            value = value.strip()
            return int(value) if value.isdigit() else None
    return 0


async def serve(port: int, az: str) -> None:
    hosts = ["0.0.0.0"] + (["::"] if _has_ipv6_address() else [])
    servers = [await asyncio.start_server(lambda r, w: _serve_connection(r, w, az), host, port, backlog=1024,
                                          reuse_address=True, limit=MAX_HEADER_BYTES)
               for host in hosts]
    _ready()
    await _until_signalled()
    for server in servers:
        server.close()


# --- load client --------------------------------------------------------------------

def _parse_response_head(head: bytes) -> tuple[int, int, str]:
    """(status, content-length, x-az) of a response head."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    status = int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else CLIENT_ERROR
    length, az = 0, "-"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        if key == b"content-length" and value.strip().isdigit():
            length = int(value.strip())
        elif key == b"x-az":
            az = value.strip().decode("ascii", "replace")[:32]
    return status, length, az


class LoadClient:
    """Open-loop HTTP/1.1 load over a pool of keep-alive connections."""

    def __init__(self, host: str, port: int, rate: float, timeout_s: float, out: Path) -> None:
        self.host, self.port, self.rate, self.timeout_s = host, port, rate, timeout_s
        self.out = out
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.open = 0
        self.records: list[str] = []
        self.request = "GET / HTTP/1.1\r\nhost: backend\r\nuser-agent: azprobe-lab\r\n\r\n".encode()

    async def one(self) -> None:
        sent = time.monotonic()
        status, az = CLIENT_ERROR, "-"
        conn = None
        try:
            async with asyncio.timeout(self.timeout_s):
                if self.idle:
                    conn = self.idle.pop()
                elif self.open < MAX_CONNECTIONS:
                    self.open += 1
                    try:
                        conn = await asyncio.open_connection(self.host, self.port, limit=MAX_HEADER_BYTES)
                    except BaseException:
                        self.open -= 1
                        raise
                else:
                    raise ConnectionError("connection limit")
                reader, writer = conn
                writer.write(self.request)
                head = await reader.readuntil(b"\r\n\r\n")
                status, length, az = _parse_response_head(head)
                if length > MAX_BODY_BYTES:
                    raise ConnectionError("response body too large")
                await reader.readexactly(length)
            self.idle.append(conn)
            conn = None
        except TimeoutError:
            status = CLIENT_TIMEOUT
        except (OSError, ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            status = CLIENT_ERROR
        finally:
            if conn is not None:  # failed mid-request: the connection's state is unknown
                conn[1].close()
                self.open -= 1
        self.records.append(f"{sent:.6f},{(time.monotonic() - sent) * 1000:.3f},{status},{az}\n")

    async def run(self) -> None:
        period = 1.0 / self.rate
        next_at = time.monotonic()
        tasks: set[asyncio.Task[None]] = set()
        while True:
            task = asyncio.create_task(self.one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    def flush(self) -> None:
        if self.records:
            with open(self.out, "a") as fh:
                fh.writelines(self.records)
            self.records = []


async def http_get(host: str, port: int, path: str, timeout_s: float = 1.0, limit: int = 4 * 1024 * 1024) -> bytes:
    """One GET with `connection: close` (the body until EOF), for Envoy's admin endpoint
    (which refuses HTTP/1.0)."""
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n".encode())
            data = await reader.read(limit)
            while chunk := await reader.read(limit):
                data += chunk
                if len(data) > limit:
                    raise ValueError(f"admin response over {limit} bytes")
        finally:
            writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return _dechunk(body) if b"transfer-encoding: chunked" in head.lower() else body


def _dechunk(body: bytes) -> bytes:
    """A chunked transfer-encoded body, decoded (Envoy's admin answers HTTP/1.1 that way)."""
    out, rest = b"", body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            break
        out, rest = out + rest[:size], rest[size + 2:]
    return out


def host_counters(clusters_json: bytes, cluster: str) -> dict[str, dict[str, object]]:
    """Envoy /clusters?format=json -> zone -> {rq_total, rq_error, healthy, priority},
    summed over the zone's hosts."""
    doc = json.loads(clusters_json)
    zones: dict[str, dict[str, object]] = {}
    for status in doc.get("cluster_statuses", []):
        if status.get("name") != cluster:
            continue
        for host in status.get("host_statuses", []):
            zone = str(host.get("locality", {}).get("zone", "-"))[:64]
            stats = {s.get("name"): int(s.get("value", 0)) for s in host.get("stats", []) if "value" in s}
            health = host.get("health_status", {})
            healthy = (health.get("eds_health_status", "HEALTHY") == "HEALTHY"
                       and not any(v is True for k, v in health.items() if k != "eds_health_status"))
            entry = zones.setdefault(zone, {"rq_total": 0, "rq_error": 0, "healthy": True,
                                            "priority": int(host.get("priority", 0))})
            entry["rq_total"] = int(entry["rq_total"]) + stats.get("rq_total", 0)  # type: ignore[call-overload]
            entry["rq_error"] = int(entry["rq_error"]) + stats.get("rq_error", 0)  # type: ignore[call-overload]
            entry["healthy"] = bool(entry["healthy"]) and healthy
    return zones


def host_flags(clusters_text: bytes, cluster: str) -> dict[str, dict[str, object]]:
    """Envoy /clusters (text: `cluster::host::stat::value` lines) -> host -> {rq_total,
    health_flags}, the per-host view the JSON's zone sums hide."""
    hosts: dict[str, dict[str, object]] = {}
    for line in clusters_text.decode("utf-8", "replace").splitlines():
        parts = line.split("::")
        if len(parts) != 4 or parts[0] != cluster:
            continue
        _, host, stat, value = parts
        if stat not in ("rq_total", "health_flags") or ":" not in host:
            continue  # the cluster's own lines (circuit breakers, names) share the format
        entry = hosts.setdefault(host[:64], {"rq_total": 0, "health_flags": "healthy"})
        if stat == "rq_total" and value.isdigit():
            entry["rq_total"] = int(value)
        elif stat == "health_flags":
            entry["health_flags"] = value[:200]
    return hosts


async def wait_envoy_ready(host: str, port: int, cluster: str, timeout_s: float) -> None:
    """Until Envoy's admin says LIVE and every host of `cluster` is healthy."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            ready = (await http_get(host, port, "/ready")).strip()
            if ready == b"LIVE":
                zones = host_counters(await http_get(host, port, "/clusters?format=json"), cluster)
                if zones and all(z["healthy"] for z in zones.values()):
                    return
                last = f"hosts {zones}"
            else:
                last = f"/ready says {ready[:80]!r}"
        except (OSError, TimeoutError, ValueError) as exc:
            last = str(exc) or type(exc).__name__
        await asyncio.sleep(0.1)
    raise SystemExit(f"envoy at {host}:{port} not ready within {timeout_s:g} s: {last}")


async def sample_admin(host: str, port: int, cluster: str, out: Path) -> None:
    while True:
        try:
            t = time.monotonic()
            zones = host_counters(await http_get(host, port, "/clusters?format=json"), cluster)
            hosts = host_flags(await http_get(host, port, "/clusters"), cluster)
            with open(out, "a") as fh:
                fh.write(json.dumps({"t": t, "zones": zones, "hosts": hosts}) + "\n")
        except (OSError, TimeoutError, ValueError):
            pass  # a missed sample leaves a gap, the next one covers it
        await asyncio.sleep(0.5)


async def run_load(args: argparse.Namespace) -> None:
    host, _, port = args.url.rpartition(":")
    client = LoadClient(host, int(port), args.rate, args.timeout_s, args.out)
    tasks = []
    if args.admin:
        admin_host, _, admin_port = args.admin.rpartition(":")
        await wait_envoy_ready(admin_host, int(admin_port), args.cluster, args.ready_timeout_s)
        tasks.append(asyncio.create_task(sample_admin(admin_host, int(admin_port), args.cluster, args.admin_out)))
    tasks.append(asyncio.create_task(client.run()))

    async def flusher() -> None:
        while True:
            await asyncio.sleep(0.5)
            client.flush()

    tasks.append(asyncio.create_task(flusher()))
    _ready()
    await _until_signalled()
    for task in tasks:
        task.cancel()
    client.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="azprobe.dev.lab.http")
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("server")
    s.add_argument("--port", type=int, default=HTTP_PORT)
    s.add_argument("--az", required=True)
    c = sub.add_parser("load")
    c.add_argument("--url", required=True, help="host:port of the proxy (or a server)")
    c.add_argument("--rate", type=float, default=100.0, help="requests per second")
    c.add_argument("--timeout-s", type=float, default=2.0, help="a request slower than this counts as failed")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--admin", default=None, help="Envoy admin host:port to wait for and sample")
    c.add_argument("--admin-out", type=Path, default=None)
    c.add_argument("--cluster", default="backend")
    c.add_argument("--ready-timeout-s", type=float, default=20.0)
    args = parser.parse_args(argv)
    if args.role == "server":
        asyncio.run(serve(args.port, args.az))
        return 0
    if not 0.1 <= args.rate <= 5000:
        parser.error(f"--rate {args.rate} is outside 0.1..5000")
    if args.admin and args.admin_out is None:
        parser.error("--admin needs --admin-out")
    asyncio.run(run_load(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
