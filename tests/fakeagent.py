"""Fake azprobe agents for controller tests and the scale bench.

A FakeAgent produces windows exactly per azprobe/contracts/window.py (to_json) into a ring and
answers `GET /v1/windows?after=SEQ` like the real agent. One FakeAgentServer (aiohttp on
its own thread and loop, real HTTP on 127.0.0.1) serves many agents: agent KEY lives at
`http://127.0.0.1:PORT/a/KEY` (the controller appends /v1/windows to the base URL).
Tests steer an agent directly: pause it (no new windows: stale), restart it (new boot_id,
seq from 1), push garbage, fail its pulls with HTTP 500, make it slow, or have it answer
any bytes at all (raw_answer). An Impersonator is a hostile agent that writes windows in
other nodes' names.

`python -m tests.fakeagent --agents N --azs az-a,az-b,az-c --address-file F` serves N
generated agents on port 0 and writes the bound host:port to F, like the daemons do (the
bench runs it as a separate process).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass

import uvloop
from aiohttp import web

from azprobe.clients.transport import raise_file_limit
from azprobe.daemon.address_file import write_address_file
from azprobe.security.tls import RotatingContext, TlsFiles, server_context
from azprobe.contracts.sketch import Histogram
from azprobe.contracts.window import (HOST_RTT_BUCKETS, HostStats, PathStats, Utilisation, Window, WindowError,
                                      host_rtt_bucket, parse_window)
from azprobe.contracts.windowcodec import COMPACT_TYPE, JSON_TYPE, encode_compact_page, encode_compact_window, negotiate


@dataclass
class PathSpec:
    """What one window of a path looks like: per-window counts and latencies."""

    dst: str
    conn_attempts: int = 100
    failures: int = 0  # of the attempts, how many time out
    syn_retrans: int = 0
    rto: int = 0
    rtt_ms: float = 10.0
    connect_ms: float = 10.0
    src: str | None = None  # default: the agent's own AZ

    def stats(self, src: str) -> PathStats:
        rtt = Histogram()
        rtt.record(int(self.rtt_ms * 1000), max(self.conn_attempts, 1))
        connect = Histogram()
        ok = max(self.conn_attempts - self.failures, 0)
        if ok:
            connect.record(int(self.connect_ms * 1000), ok)
        return PathStats(src=self.src or src, dst=self.dst, conn_attempts=self.conn_attempts, conn_ok=ok,
                         conn_timeout=self.conn_attempts - ok, syn_retrans=self.syn_retrans, rto=self.rto,
                         retrans=self.syn_retrans + self.rto, rtt_us=rtt, connect_us=connect)


@dataclass
class HostSpec:
    """One destination address of a path, per window: the window's optional hosts section."""

    dst: str
    addr: str
    connects: int = 20
    failures: int = 0
    rto: int = 0
    rtt_ms: float = 1.0
    rtt_samples: int = 40

    def stats(self, src: str) -> HostStats:
        buckets = [0] * HOST_RTT_BUCKETS
        buckets[host_rtt_bucket(int(self.rtt_ms * 1000))] = self.rtt_samples
        return HostStats(src, self.dst, self.addr, self.connects, self.failures, self.rto, self.rto, buckets)


class FakeAgent:
    def __init__(self, node: str, az: str, paths: list[PathSpec], *, ring_size: int = 300,
                 cpu: float = 0.3, mem: float = 0.5, hosts: list[HostSpec] | None = None) -> None:
        self.node = node
        self.az = az
        self.paths = paths
        self.hosts = hosts or []  # empty: windows without the hosts section, as before
        self.cpu = cpu
        self.mem = mem
        self.boot_id = uuid.uuid4().hex
        self.seq = 0
        self.ring: deque[dict] = deque(maxlen=ring_size)
        self.paused = False  # True: answers pulls but makes no new windows (stale)
        self.fail_status = 0  # non-zero: answer every pull with this HTTP status
        self.delay_s = 0.0  # answer this late (a slow agent)
        self.raw_answer: tuple[bytes, str] | None = None  # (body, media type) served instead of the ring
        self.held = 0  # pulls being held back by delay_s right now
        self.pulls = 0
        self.lock = threading.Lock()

    def emit(self, end: float | None = None, interval_s: float = 1.0) -> dict:
        """Append one window ending at `end` (default now) to the ring and return it."""
        end = time.time() if end is None else end
        with self.lock:
            self.seq += 1
            window = Window(node=self.node, az=self.az, boot_id=self.boot_id, seq=self.seq,
                            start=end - interval_s, end=end, util=Utilisation(self.cpu, self.mem),
                            paths=[p.stats(self.az) for p in self.paths], hosts=[h.stats(self.az) for h in self.hosts])
            doc = window.to_json()
            self.ring.append(doc)
        return doc

    def push_raw(self, doc: dict) -> None:
        """Put any document in the ring (garbage tests); it takes the next seq if it has one."""
        with self.lock:
            if isinstance(doc.get("seq"), int):
                self.seq = max(self.seq, doc["seq"])
            self.ring.append(doc)

    def next_seq(self) -> int:
        with self.lock:
            self.seq += 1
            return self.seq

    def restart(self) -> None:
        """A new boot: new boot_id, seq from 1, empty ring (the real agent's ring is in memory)."""
        with self.lock:
            self.boot_id = uuid.uuid4().hex
            self.seq = 0
            self.ring.clear()

    def drop_ring(self) -> None:
        """Forget every window (the ring wrapped while nobody pulled): the next pull sees a gap."""
        with self.lock:
            self.ring.clear()

    def body(self, after: int) -> dict:
        with self.lock:
            self.pulls += 1
            windows = [w for w in self.ring if not isinstance(w.get("seq"), int) or w["seq"] > after]
            return {"node": self.node, "az": self.az, "boot_id": self.boot_id, "windows": windows}

    def encoded_body(self, after: int, accept: str | None) -> tuple[bytes, str]:
        """The response body and its media type, negotiated like the real agent; a ring
        holding garbage documents (push_raw) is served as JSON, which can carry them. An
        answer without `node` is "" in the compact form."""
        doc = self.body(after)
        if negotiate(accept) == COMPACT_TYPE:
            try:
                encoded = [encode_compact_window(parse_window(w)) for w in doc["windows"]]
                return encode_compact_page(doc.get("node", ""), doc["az"], doc["boot_id"], encoded), COMPACT_TYPE
            except WindowError:
                pass
        return json.dumps(doc).encode(), JSON_TYPE


class Impersonator(FakeAgent):
    """A hostile agent: each emit() writes one window per name in `names` (node -> its AZ),
    each with this agent's paths; its answers name `header`, or no node at all (None)."""

    def __init__(self, names: dict[str, str], paths: list[PathSpec], *, header: str | None = None,
                 **kwargs: object) -> None:
        super().__init__(header or "impersonator", next(iter(names.values())), paths, **kwargs)  # type: ignore[arg-type]
        self.names = dict(names)
        self.header = header

    def emit(self, end: float | None = None, interval_s: float = 1.0) -> dict:
        end = time.time() if end is None else end
        doc: dict = {}
        with self.lock:
            for i, (node, az) in enumerate(self.names.items()):
                self.seq += 1
                at = end - 1e-4 * (i + 1)  # an `end` no honest window has: nothing is a duplicate
                doc = Window(node=node, az=az, boot_id=self.boot_id, seq=self.seq, start=at - interval_s, end=at,
                             util=Utilisation(self.cpu, self.mem), paths=[p.stats(az) for p in self.paths]).to_json()
                self.ring.append(doc)
        return doc

    def body(self, after: int) -> dict:
        doc = super().body(after)
        if self.header is None:
            del doc["node"]
        else:
            doc["node"] = self.header
        return doc


class FakeAgentServer:
    """Serves many FakeAgents over real HTTP on 127.0.0.1 from one background thread."""

    def __init__(self, interval_s: float | None = None, port: int = 0, tls: TlsFiles | None = None) -> None:
        self.agents: dict[str, FakeAgent] = {}
        # tls: HTTPS with this certificate for every agent served here (ca_file: the CA
        # clients must be signed by), rotated like the agent's: a new file is used by the
        # next handshake.
        self.tls = RotatingContext(tls, "agent.tls", server_context) if tls else None
        self.interval_s = interval_s  # None: windows only when the test calls emit()
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._stop_ticker = threading.Event()
        self._ticker: threading.Thread | None = None

    def add(self, key: str, agent: FakeAgent) -> str:
        self.agents[key] = agent
        return self.url(key)

    def url(self, key: str) -> str:
        """Agent KEY's base URL; the agent added with key "" answers at the root, like a real one."""
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}/a/{key}" if key else f"{scheme}://127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.tls is not None and request.transport is not None:
            tls = request.transport.get_extra_info("ssl_object")
            if tls is not None and tls.context is not self.tls.current():
                # Made with material since rotated: not used again, like the agent's own
                # server (agent/httpserver/tlsserve.py); the client retries on a new one.
                request.transport.close()
                return web.Response(status=503)
        agent = self.agents.get(request.match_info.get("key", ""))
        if agent is None:
            return web.json_response({"error": "no such agent"}, status=404)
        if agent.delay_s:
            agent.held += 1
            try:  # a slow agent, but one that does not hold up the server's shutdown
                await asyncio.wait_for(self._stopping.wait(), agent.delay_s)
            except asyncio.TimeoutError:
                pass
            finally:
                agent.held -= 1
        if agent.fail_status:
            return web.Response(status=agent.fail_status, text="injected failure")
        try:
            after = int(request.query.get("after", "0"))
        except ValueError:
            return web.json_response({"error": "after: not an integer"}, status=400)
        body, media = agent.raw_answer or agent.encoded_body(after, request.headers.get("Accept"))
        return web.Response(body=body, content_type=media)

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_get("/a/{key}/v1/windows", self._handle)
        app.router.add_get("/v1/windows", self._handle)
        runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", self.port, backlog=4096,
                           ssl_context=self.tls.serving_context() if self.tls else None)
        loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._runner = runner
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    def _tick(self) -> None:
        assert self.interval_s
        while not self._stop_ticker.wait(self.interval_s):
            for agent in list(self.agents.values()):
                if not agent.paused:
                    agent.emit(interval_s=self.interval_s)

    def start(self) -> "FakeAgentServer":
        self._thread = threading.Thread(target=self._serve, name="fake-agents", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake agent server did not start")
        if self.interval_s:
            for agent in self.agents.values():
                agent.emit(interval_s=self.interval_s)
            self._ticker = threading.Thread(target=self._tick, name="fake-agent-ticker", daemon=True)
            self._ticker.start()
        return self

    def stop(self) -> None:
        self._stop_ticker.set()
        if self._ticker:
            self._ticker.join(5)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(10)

    def __enter__(self) -> "FakeAgentServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def zone_agents(azs: list[str], per_az: int, *, sick: dict[str, PathSpec] | None = None,
                attempts: int = 50) -> dict[str, FakeAgent]:
    """`per_az` agents in each AZ, each with a path to every AZ; `sick[dst]` overrides a dst's spec."""
    agents = {}
    for az in azs:
        for i in range(per_az):
            paths = [(sick or {}).get(dst) or PathSpec(dst=dst, conn_attempts=attempts) for dst in azs]
            agents[f"{az}-{i}"] = FakeAgent(f"node-{az}-{i}", az, paths)
    return agents


class _BulkAgents:
    """The bench's cheap server: N agents, one pre-serialised window per (agent, seq)."""

    def __init__(self, n: int, azs: list[str], interval_s: float, attempts: int, stagger: bool = False) -> None:
        self.interval_s = interval_s
        self.started = time.time()
        self.stagger = stagger
        self.boot = uuid.uuid4().hex
        self.azs = azs
        self.n = n
        templates = {}
        self.windows: dict[str, Window] = {}
        for az in azs:
            agent = FakeAgent("NODE", az, [PathSpec(dst=d, conn_attempts=attempts) for d in azs])
            agent.boot_id = self.boot
            doc = agent.emit(end=1.0)
            self.windows[az] = parse_window(doc)
            templates[az] = json.dumps(doc).replace('"seq": 1', '"seq": %SEQ%') \
                .replace('"start": 0.0, "end": 1.0', '"start": %START%, "end": %END%')
        self.templates = templates
        self.ring = 10

    def _started(self, key: int) -> float:
        """When agent `key` started. Staggered: a fleet's agents start at different times, so
        their windows end spread over the interval (a low-discrepancy sequence, whatever the
        number of agents or processes), not all at one instant."""
        return self.started + (key * 0.6180339887498949 % 1.0) * self.interval_s if self.stagger else self.started

    def _seqs(self, key: int, after: int, now: float | None) -> range:
        now_seq = int(((time.time() if now is None else now) - self._started(key)) / self.interval_s) + 1
        return range(max(after + 1, now_seq - self.ring + 1, 1), now_seq + 1)

    def body(self, key: int, after: int, compact: bool = False, now: float | None = None) -> bytes:
        """Agent `key`'s answer to ?after=`after` at `now` (the wall clock's when None)."""
        az = self.azs[key % len(self.azs)]
        started = self._started(key)
        if compact:
            template = self.windows[az]
            windows = [encode_compact_window(Window(
                node=f"n{key}", az=az, boot_id=self.boot, seq=seq, start=started + (seq - 1) * self.interval_s,
                end=started + seq * self.interval_s, util=template.util, paths=template.paths))
                for seq in self._seqs(key, after, now)]
            return encode_compact_page(f"n{key}", az, self.boot, windows)
        parts = []
        template = self.templates[az].replace("NODE", f"n{key}")
        for seq in self._seqs(key, after, now):
            end = started + seq * self.interval_s
            parts.append(template.replace("%SEQ%", str(seq)).replace("%START%", repr(end - self.interval_s))
                         .replace("%END%", repr(end)))
        return (f'{{"node": "n{key}", "az": "{az}", "boot_id": "{self.boot}", "windows": ['
                + ", ".join(parts) + "]}").encode()


class _BulkProtocol(asyncio.Protocol):
    """A bare keep-alive HTTP/1.1 responder: aiohttp's server costs more CPU per request
    than the controller under test at 5,000 requests a second on a 2-core box."""

    bulk: _BulkAgents

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, self.buf = self.buf.split(b"\r\n\r\n", 1)
            target = head.split(b"\r\n", 1)[0].split(b" ")[1].decode()
            path, _, query = target.partition("?")
            parts = path.split("/")  # ["", "a", KEY, "v1", "windows"]
            compact = COMPACT_TYPE.encode() in head
            media = COMPACT_TYPE if compact else JSON_TYPE
            try:
                key = int(parts[2])
                after = int(query.partition("after=")[2].partition("&")[0] or 0)
                body, status = self.bulk.body(key, after, compact), b"200 OK"
            except (IndexError, ValueError):
                body, status, media = b'{"error": "bad request"}', b"400 Bad Request", JSON_TYPE
            self.transport.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + media.encode()  # type: ignore[attr-defined]
                                 + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def _serve_bulk(n: int, azs: list[str], interval_s: float, attempts: int, address_file: str,
                tls_dir: str = "", first: int = 0, stagger: bool = False) -> None:
    _BulkProtocol.bulk = _BulkAgents(first + n, azs, interval_s, attempts, stagger)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        if tls_dir:  # one port per agent, each with the node certificate n<KEY> (bench --tls)
            raise_file_limit()
            ca, ports = f"{tls_dir}/ca.crt", []
            for key in range(first, first + n):
                ctx = server_context(TlsFiles(f"{tls_dir}/n{key}.crt", f"{tls_dir}/n{key}.key", ca), "agent.tls")
                server = await loop.create_server(_BulkProtocol, "127.0.0.1", 0, backlog=64, ssl=ctx)
                ports.append(server.sockets[0].getsockname()[1])
            with open(f"{tls_dir}/ports-{first}.json", "w") as f:
                json.dump(ports, f)
            write_address_file(address_file, "127.0.0.1", ports[0])
        else:
            server = await loop.create_server(_BulkProtocol, "127.0.0.1", 0, backlog=8192)
            write_address_file(address_file, "127.0.0.1", server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    uvloop.run(main())  # the controller's loop too: the bench's server should not hog the box


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=5000)
    parser.add_argument("--azs", default="az-a,az-b,az-c")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--attempts", type=int, default=50)
    parser.add_argument("--address-file", required=True, help="where to write the bound host:port")
    parser.add_argument("--tls-dir", default="", help="HTTPS: ca.crt and n<KEY>.crt/.key per agent; the ports "
                        "go to ports-FIRST.json there")
    parser.add_argument("--first", type=int, default=0, help="HTTPS: serve agents FIRST .. FIRST+N-1 (one process "
                        "of several)")
    parser.add_argument("--stagger", action="store_true", help="agents' windows end spread over the interval, as "
                        "in a fleet whose agents started at different times (default: all at one instant)")
    args = parser.parse_args()
    try:
        _serve_bulk(args.agents, args.azs.split(","), args.interval, args.attempts, args.address_file, args.tls_dir,
                    args.first, args.stagger)
    except KeyboardInterrupt:
        sys.exit(0)
