"""Benchmark: what grpcio's asyncio server alone costs per stream, the floor under
bench/xds_fanout.py's figures.

A do-nothing grpc.aio bidi handler (raw bytes, no protobuf, no azprobe) holds N streams
from a client process shaped as xds_fanout's (`--per-channel` streams per channel, a
connection per channel, opened at 1,000/s). Per round the server writes 300 bytes to
every stream, one task per write as azprobe does, and every client answers with a small
message (the ACK). Prints ONE JSON line: the server's RSS per stream once every stream
is open, the CPU seconds the server and the client each spent per round, the time from
the round's start to the last stream receiving it (p50, p99 over rounds), load_avg_1m.

    .venv/bin/python bench/grpc_floor.py [--streams 5000] [--per-channel 100] [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.xds_fanout import cpu_s, quantile  # noqa: E402

METHOD = "/floor.Floor/Stream"
BODY = b"x" * 300


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def server(port_q, go, stop) -> None:
    import grpc

    async def main() -> None:
        contexts = []

        async def handler(requests, context):  # type: ignore[no-untyped-def]
            contexts.append(context)
            async for _ in requests:
                pass

        srv = grpc.aio.server()
        srv.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "floor.Floor", {"Stream": grpc.stream_stream_rpc_method_handler(handler)})])
        port_q.put(srv.add_insecure_port("127.0.0.1:0"))
        await srv.start()
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            if go.is_set():
                go.clear()
                await asyncio.gather(*[loop.create_task(c.write(BODY)) for c in list(contexts)])
            await asyncio.sleep(0.005)

    asyncio.run(main())


def clients(port: int, streams: int, per_channel: int, counts, stop) -> None:
    import grpc

    async def main() -> None:
        options = [("grpc.use_local_subchannel_pool", 1)]
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options)
                    for _ in range((streams + per_channel - 1) // per_channel)]

        async def one(i: int) -> None:
            call = channels[i // per_channel].stream_stream(METHOD)()
            await call.write(b"hello")
            counts[i] = 1
            while True:
                message = await call.read()
                counts[i] += 1
                await call.write(b"ack" + message[:8])

        tasks = []
        for i in range(streams):
            tasks.append(asyncio.ensure_future(one(i)))
            if i % 100 == 99:
                await asyncio.sleep(0.1)
        while not stop.is_set():
            await asyncio.sleep(0.1)

    asyncio.run(main())


def wait_all(counts, k: int, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if min(counts) >= k:
            return True
        time.sleep(0.005)
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=5000)
    parser.add_argument("--per-channel", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    ctx = multiprocessing.get_context("spawn")
    port_q, go, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    counts = ctx.Array("i", args.streams, lock=False)
    srv = ctx.Process(target=server, args=(port_q, go, stop))
    srv.start()
    cli = None
    try:
        port = port_q.get(timeout=30)
        time.sleep(1.0)  # the server's imports settle before the baseline RSS (a measurement, not a sync)
        rss0 = rss_kb(srv.pid)
        cli = ctx.Process(target=clients, args=(port, args.streams, args.per_channel, counts, stop))
        cli.start()
        if not wait_all(counts, 1, 120):
            print("not every stream opened", file=sys.stderr)
            return 1
        time.sleep(2.0)  # as xds_fanout: let the allocator settle before reading RSS
        rss1 = rss_kb(srv.pid)
        cpu0, last = (cpu_s(srv.pid), cpu_s(cli.pid)), []
        for k in range(2, args.rounds + 2):
            t0 = time.monotonic()
            go.set()
            if not wait_all(counts, k, 60):
                print(f"round {k - 1}: not every stream got it within 60 s", file=sys.stderr)
                return 1
            last.append(time.monotonic() - t0)
        print(json.dumps({
            "bench": "grpc_floor", "streams": args.streams, "streams_per_channel": args.per_channel,
            "rounds": args.rounds, "rss_per_stream_kb": round((rss1 - rss0) / args.streams, 2),
            "server_cpu_s_per_round": round((cpu_s(srv.pid) - cpu0[0]) / args.rounds, 3),
            "client_cpu_s_per_round": round((cpu_s(cli.pid) - cpu0[1]) / args.rounds, 3),
            "last_stream_p50_s": round(quantile(last, 0.5), 3), "last_stream_p99_s": round(quantile(last, 0.99), 3),
            "load_avg_1m": round(os.getloadavg()[0], 2)}))
    finally:
        stop.set()
        for p in (cli, srv):
            if p is not None:
                p.join(10)
                if p.is_alive():
                    p.terminate()
                    p.join(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
