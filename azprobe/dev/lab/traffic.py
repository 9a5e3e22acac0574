"""Lab traffic, run as processes inside lab namespaces.

    python -m azprobe.dev.lab.traffic server --port 7000 [--port 7001 ...]
        TCP echo on every address of the namespace (IPv4 and, if present, IPv6).
    python -m azprobe.dev.lab.traffic client --target az-a=198.18.1.2 ... --port 7000
            [--rate 5] [--conns 2] [--interval-ms 50] [--stats-file F]
        Per target: `rate` new connections per second (connect, one request/response,
        close), so connect statistics flow; and `conns` long-lived connections doing a
        request/response every `interval-ms`, so smoothed-RTT samples flow. Outcomes per
        target are written to --stats-file (JSON) twice a second.
    python -m azprobe.dev.lab.traffic probe --addr 198.18.2.2 --port 7000 --count 10
        Blocking connects, one after another; prints one JSON object with outcomes and
        connect times in ms. Used by tests as an independent stopwatch.

Servers and clients print "ready" on stdout once listening/started, then nothing more.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REQUEST = b"x" * 64


def _ready() -> None:
    print("ready", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)


def _has_ipv6_address() -> bool:
    try:
        with open("/proc/net/if_inet6") as fh:
            return any(not line.split()[0].startswith("fe80") and line.split()[0] != "0" * 31 + "1"
                       for line in fh)
    except FileNotFoundError:
        return False


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve(ports: Sequence[int]) -> None:
    hosts = ["0.0.0.0"] + (["::"] if _has_ipv6_address() else [])
    servers = []
    for port in ports:
        for host in hosts:
            # backlog: the generator opens bursts of connections from several clients
            servers.append(await asyncio.start_server(_echo, host, port, backlog=1024, reuse_address=True))
    _ready()
    await _until_signalled()
    for server in servers:
        server.close()


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def _outcome(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(exc, ConnectionResetError):
        return "reset"
    return "error"


class Generator:
    def __init__(self, targets: dict[str, str], port: int, rate: float, conns: int, interval_s: float,
                 stats_file: Path | None, connect_timeout_s: float = 3.0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.targets = targets
        self.port = port
        self.rate = rate
        self.conns = conns
        self.interval_s = interval_s
        self.stats_file = stats_file
        self.stats = {name: {"ok": 0, "refused": 0, "timeout": 0, "reset": 0, "error": 0,
                             "requests": 0, "long_lived_up": 0} for name in targets}

    async def one_connection(self, name: str, addr: str) -> None:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(addr, self.port), self.connect_timeout_s)
        except BaseException as exc:  # noqa: BLE001 - every outcome is counted
            if isinstance(exc, asyncio.CancelledError):
                raise
            self.stats[name][_outcome(exc)] += 1
            return
        self.stats[name]["ok"] += 1
        try:
            writer.write(REQUEST)
            await asyncio.wait_for(reader.readexactly(len(REQUEST)), self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def new_connections(self, name: str, addr: str) -> None:
        period = 1.0 / self.rate
        next_at = time.monotonic()
        tasks: set[asyncio.Task[None]] = set()
        while True:
            task = asyncio.create_task(self.one_connection(name, addr))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def long_lived(self, name: str, addr: str) -> None:
        while True:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(addr, self.port), self.connect_timeout_s)
            except (OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.5)
                continue
            self.stats[name]["long_lived_up"] += 1
            try:
                while True:
                    writer.write(REQUEST)
                    await asyncio.wait_for(reader.readexactly(len(REQUEST)), 30.0)
                    self.stats[name]["requests"] += 1
                    await asyncio.sleep(self.interval_s)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                pass
            finally:
                self.stats[name]["long_lived_up"] -= 1
                writer.close()

    async def write_stats(self) -> None:
        while self.stats_file is not None:
            tmp = self.stats_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"time": time.time(), "targets": self.stats}))
            os.replace(tmp, self.stats_file)
            await asyncio.sleep(0.5)

    async def run(self) -> None:
        tasks = []
        for name, addr in self.targets.items():
            if self.rate > 0:
                tasks.append(asyncio.create_task(self.new_connections(name, addr)))
            for _ in range(self.conns):
                tasks.append(asyncio.create_task(self.long_lived(name, addr)))
        tasks.append(asyncio.create_task(self.write_stats()))
        _ready()
        await _until_signalled()
        for task in tasks:
            task.cancel()


def probe(addr: str, port: int, count: int, timeout_s: float, interval_s: float) -> dict[str, object]:
    """Sequential blocking connects; connect time measured around connect() alone."""
    result: dict[str, object] = {"ok": 0, "refused": 0, "timeout": 0, "error": 0, "connect_ms": []}
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    for i in range(count):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        started = time.perf_counter()
        try:
            sock.connect((addr, port))
            result["connect_ms"].append((time.perf_counter() - started) * 1000.0)  # type: ignore[union-attr]
            result["ok"] += 1  # type: ignore[operator]
        except ConnectionRefusedError:
            result["refused"] += 1  # type: ignore[operator]
        except (TimeoutError, socket.timeout):
            result["timeout"] += 1  # type: ignore[operator]
        except OSError as exc:
            result["error"] += 1  # type: ignore[operator]
            result.setdefault("errors", []).append(errno.errorcode.get(exc.errno or 0, str(exc)))  # type: ignore[union-attr]
        finally:
            sock.close()
        if interval_s and i + 1 < count:
            time.sleep(interval_s)  # pacing between probes, not synchronisation
    return result


def _target(value: str) -> tuple[str, str]:
    name, sep, addr = value.partition("=")
    if not sep or not name or not addr:
        raise argparse.ArgumentTypeError(f"{value!r} is not NAME=ADDRESS")
    return name, addr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="azprobe.dev.lab.traffic")
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("server")
    s.add_argument("--port", type=int, action="append", required=True)
    c = sub.add_parser("client")
    c.add_argument("--target", type=_target, action="append", required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--rate", type=float, default=5.0, help="new connections per second per target")
    c.add_argument("--conns", type=int, default=2, help="long-lived connections per target")
    c.add_argument("--interval-ms", type=float, default=50.0, help="pause between requests on a long-lived conn")
    c.add_argument("--stats-file", type=Path)
    c.add_argument("--connect-timeout-s", type=float, default=3.0, help="slower connects count as timeouts")
    p = sub.add_parser("probe")
    p.add_argument("--addr", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--timeout-s", type=float, default=1.0)
    p.add_argument("--interval-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    if args.role == "server":
        asyncio.run(serve(args.port))
    elif args.role == "client":
        gen = Generator(dict(args.target), args.port, args.rate, args.conns, args.interval_ms / 1000.0,
                        args.stats_file, args.connect_timeout_s)
        asyncio.run(gen.run())
    else:
        print(json.dumps(probe(args.addr, args.port, args.count, args.timeout_s, args.interval_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
