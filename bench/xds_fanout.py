"""Benchmark: N concurrent delta-ADS streams on one `azprobe xds serve` process.

The clients run in another process (grpc.aio, the official stubs), `--per-channel`
streams sharing each channel; every stream subscribes to the ClusterLoadAssignment
`backend` with a zone from a rotation (each zone's view falls back to the global
document). Once every stream holds its first assignment, the server's RSS is read; then
`--changes` weights documents are written to devconsul, each once every stream has the
previous one. A stream's k-th update after the first is change k.

Prints progress to stderr and ONE JSON line: per change, the time from the KV write to
the LAST stream receiving it (p50, p99 over changes), the per-stream latency (p50, p99
over all streams and changes), the server's RSS per stream, the CPU seconds the server
and the client process each spent per change (both share the machine's cores), and
load_avg_1m at the end.

    .venv/bin/python bench/xds_fanout.py [--streams 5000] [--per-channel 100] [--changes 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from azprobe.dev.devconsul.testing import DevConsul  # noqa: E402
from tests import xds_harness as h  # noqa: E402
from tests.helpers import sample_weights_doc  # noqa: E402

ZONES = ("", "az-a", "az-b", "az-c")
FIRST_RESPONSE_S = 10.0


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def clients(address: str, streams: int, per_channel: int, changes: int, counts, ready, done, out) -> None:
    import grpc

    async def main() -> None:
        arrivals: list[list[float]] = [[] for _ in range(streams)]
        # A channel of its own connection per `per_channel` streams, as a fleet of clients
        # has (grpc would otherwise put every channel to one target on one connection).
        options = [("grpc.use_local_subchannel_pool", 1)]
        channels = [grpc.aio.insecure_channel(address, options=options)
                    for _ in range((streams + per_channel - 1) // per_channel)]
        calls = []
        reopened = [0]
        errors: dict[str, int] = {}

        async def open_one(i: int) -> tuple[object, object]:
            call = h.ads_stub(channels[i // per_channel]).DeltaAggregatedResources()
            calls.append(call)
            await call.write(h.delta(h.CLA, ["backend"], zone=ZONES[i % len(ZONES)], nonce=""))
            return call, await call.read()

        async def one(i: int) -> None:
            tries = 0
            while True:
                # A stream refused in a burst (the server's grpc core turns calls away while
                # too many wait to be picked up) or never answered is opened again after a
                # randomised back-off, as xDS clients do; each is counted.
                try:
                    call, first = await asyncio.wait_for(open_one(i), FIRST_RESPONSE_S)
                    if first is not grpc.aio.EOF:
                        break
                    errors["EOF"] = errors.get("EOF", 0) + 1
                except asyncio.TimeoutError:
                    errors["no answer"] = errors.get("no answer", 0) + 1
                except grpc.aio.AioRpcError as exc:
                    errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                except asyncio.InvalidStateError:
                    errors["finished"] = errors.get("finished", 0) + 1
                reopened[0] += 1
                tries += 1
                # exponential, jittered: retries in lockstep would keep the server as busy as the burst did
                await asyncio.sleep(random.uniform(0.5, 1.0) * min(2 ** tries, 16))
            r = first
            while r is not grpc.aio.EOF:
                arrivals[i].append(time.monotonic())
                counts[i] = len(arrivals[i])
                await call.write(h.delta(h.CLA, zone=None, nonce=r.nonce))  # ACK
                if len(arrivals[i]) > changes:
                    break
                r = await call.read()

        tasks = []
        for i in range(streams):
            tasks.append(asyncio.ensure_future(one(i)))
            if i % 100 == 99:
                await asyncio.sleep(0.1)  # open the streams at a pace (1,000/s), not in one burst
        ready.set()
        while not done.is_set():
            await asyncio.sleep(0.1)
        for call in calls:
            call.cancel()
        for t in tasks:
            t.cancel()
        out.send((arrivals, reopened[0], errors))
        for ch in channels:
            await ch.close()

    asyncio.run(main())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=5000)
    parser.add_argument("--per-channel", type=int, default=100)
    parser.add_argument("--changes", type=int, default=10)
    args = parser.parse_args()
    ctx = multiprocessing.get_context("spawn")
    proc = None
    with tempfile.TemporaryDirectory() as tmp, DevConsul(data_dir=Path(tmp) / "dc") as dc:
        work = Path(tmp)
        cfg = h.write_config(work, dc.url, xds={"max_streams": args.streams + 100,
                                                "max_streams_per_client": args.streams + 100})
        xds = h.XdsProcess(cfg, work).start()
        try:
            gen = 1
            dc.request("PUT", "/v1/kv/azprobe/v1/weights", sample_weights_doc(gen, ttl_s=3600, shares={"az-a": 40, "az-b": 30,
                                                                                   "az-c": 30}).dumps())
            deadline = time.monotonic() + 20
            while xds.status()["views"]["global"]["generation"] != gen and time.monotonic() < deadline:
                time.sleep(0.05)
            rss_before = xds.rss_kb()
            counts = ctx.Array("i", args.streams, lock=False)
            ready, done = ctx.Event(), ctx.Event()
            receiver, sender = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=clients, args=(xds.address, args.streams, args.per_channel, args.changes,
                                                     counts, ready, done, sender))
            proc.start()

            def wait_all(k: int, timeout: float) -> bool:
                end = time.monotonic() + timeout
                while time.monotonic() < end:
                    if min(counts) >= k:
                        return True
                    time.sleep(0.01)
                return False

            t0 = time.monotonic()
            if not wait_all(1, 120):
                print(f"only {sum(1 for c in counts if c)} of {args.streams} streams got an assignment",
                      file=sys.stderr)
                return 1
            print(f"{args.streams} streams up in {time.monotonic() - t0:.1f} s", file=sys.stderr)
            time.sleep(2.0)  # let the allocator settle before reading RSS (a measurement, not a sync)
            rss_streams = xds.rss_kb()
            cpu0 = cpu_s(xds.proc.pid), cpu_s(proc.pid)
            writes = []
            for k in range(1, args.changes + 1):
                gen += 1
                a = 40 + (k % 2) * 5
                doc = sample_weights_doc(gen, {"az-a": a, "az-b": 100 - a - 30, "az-c": 30}, ttl_s=3600)
                writes.append(time.monotonic())
                dc.request("PUT", "/v1/kv/azprobe/v1/weights", doc.dumps())
                if not wait_all(k + 1, 60):
                    print(f"change {k}: not every stream got it within 60 s", file=sys.stderr)
                    return 1
                print(f"change {k}: last stream after {time.monotonic() - writes[-1]:.3f} s", file=sys.stderr)
            cpu = (cpu_s(xds.proc.pid) - cpu0[0]) / args.changes, (cpu_s(proc.pid) - cpu0[1]) / args.changes
            done.set()
            arrivals, reopened, open_errors = receiver.recv()
            proc.join(30)
            last = [max(a[k] for a in arrivals) - writes[k - 1] for k in range(1, args.changes + 1)]
            each = [a[k] - writes[k - 1] for a in arrivals for k in range(1, args.changes + 1)]
            print(json.dumps({
                "bench": "xds_fanout", "streams": args.streams, "streams_per_channel": args.per_channel,
                "changes": args.changes, "streams_reopened": reopened, "open_errors": open_errors,
                "last_stream_p50_s": round(quantile(last, 0.5), 3), "last_stream_p99_s": round(quantile(last, 0.99), 3),
                "per_stream_p50_s": round(quantile(each, 0.5), 3), "per_stream_p99_s": round(quantile(each, 0.99), 3),
                "rss_per_stream_kb": round((rss_streams - rss_before) / args.streams, 2),
                "server_rss_mb": round(rss_streams / 1024, 1),
                "server_cpu_s_per_change": round(cpu[0], 3), "client_cpu_s_per_change": round(cpu[1], 3),
                "load_avg_1m": round(os.getloadavg()[0], 2),
            }))
        finally:
            if proc is not None and proc.is_alive():
                proc.terminate()
                proc.join(10)
            xds.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
