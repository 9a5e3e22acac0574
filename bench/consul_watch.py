"""Benchmark: N concurrent blocking watchers on one devconsul, a KV write every interval.

Every watcher long-polls `GET /v1/kv/<key>?index=..&wait=..` (what WeightWatcher and
`azprobe weights --watch` do) on its own connection. The writer PUTs a sequence number
every 100 ms. A watcher "sees" write s at the first answer carrying a value >= s (a
watcher still re-arming when the next write lands gets the newer value: that still counts
as seeing s, as it would for a real consumer). Prints progress to stderr and ONE final
JSON line: p50/p99 of per-watcher latency, p50/p99 of the time until *every* watcher saw
a write, devconsul's CPU %, watchers, writes.

    .venv/bin/python bench/consul_watch.py [--watchers 500] [--interval 0.1] [--duration 10]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from azprobe.dev.devconsul.testing import DevConsul  # noqa: E402

KEY = "azprobe/v1/weights"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def watcher(host: str, port: int, seen: dict[int, float], stop_after: int) -> tuple[int, int]:
    """Long-poll on one keep-alive connection (raw HTTP/1.1, so the client's own parsing
    cost stays out of the figures) until the value `stop_after` has been seen."""
    reader, writer = await asyncio.open_connection(host, port)
    index = "0"
    highest = 0
    errors = 0
    answers = 0
    try:
        while highest < stop_after:
            writer.write(f"GET /v1/kv/{KEY}?index={index}&wait=30s HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            status, headers, body = await _read_response(reader)
            now = time.monotonic()
            answers += 1
            index = headers.get("x-consul-index", index)
            if status != 200:
                errors += 1
                continue
            value = int(base64.b64decode(json.loads(body)[0]["Value"]))
            for seq in range(highest + 1, value + 1):
                seen[seq] = now
            highest = max(highest, value)
    finally:
        writer.close()
    return errors, answers


def watcher_process(host: str, port: int, count: int, stop_after: int, out: "multiprocessing.Queue") -> None:
    """One client process running `count` watchers; reports (seen maps, errors, answers)."""

    async def main() -> None:
        seen: list[dict[int, float]] = [{} for _ in range(count)]
        outcomes = await asyncio.gather(*(watcher(host, port, seen[i], stop_after) for i in range(count)))
        out.put((seen, sum(e for e, _ in outcomes), sum(a for _, a in outcomes)))

    asyncio.run(main())


async def run(watchers: int, interval: float, duration: float, processes: int) -> dict[str, object]:
    n_writes = int(duration / interval)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="bench-devconsul-") as data_dir, \
            DevConsul(data_dir=data_dir, node_name="bench", max_conns_per_client=watchers + 100) as dc:
        proc = psutil.Process(dc.pid)
        async with aiohttp.ClientSession() as session:
            async with session.put(f"{dc.url}/v1/kv/{KEY}", data=b"0") as resp:
                assert resp.status == 200
            shares = [watchers // processes + (1 if i < watchers % processes else 0) for i in range(processes)]
            workers = [ctx.Process(target=watcher_process, args=(dc.host, dc.port, n, n_writes, queue))
                       for n in shares if n]
            for w in workers:
                w.start()
            try:
                # all watchers parked server-side before the first write
                deadline = time.monotonic() + 120
                while dc_parked(dc) < watchers:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"only {dc_parked(dc)} of {watchers} watchers parked after 120 s")
                    await asyncio.sleep(0.05)
                print(f"{watchers} watchers parked ({len(workers)} client processes); "
                      f"writing every {interval * 1000:.0f} ms for {duration:.0f} s", file=sys.stderr)
                write_times: dict[int, float] = {}
                cpu_before = proc.cpu_times()
                wall_before = time.monotonic()
                next_at = time.monotonic()
                for seq in range(1, n_writes + 1):
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                    write_times[seq] = time.monotonic()
                    async with session.put(f"{dc.url}/v1/kv/{KEY}", data=str(seq).encode()) as resp:
                        assert resp.status == 200 and await resp.text() == "true"
                    next_at += interval
                results = [await asyncio.to_thread(queue.get, True, 60) for _ in workers]
                cpu_after = proc.cpu_times()
                wall = time.monotonic() - wall_before
            finally:
                for w in workers:
                    w.join(timeout=5)
                    if w.is_alive():
                        w.kill()
    per_watcher = [seen for seen_list, _, _ in results for seen in seen_list]
    errors = sum(e for _, e, _ in results)
    answers = sum(a for _, _, a in results)
    latencies = []
    all_seen = []
    missing = 0
    for seq in range(1, n_writes + 1):
        got = [w[seq] - write_times[seq] for w in per_watcher if seq in w]
        missing += len(per_watcher) - len(got)
        latencies.extend(got)
        if len(got) == len(per_watcher):
            all_seen.append(max(got))
    cpu_s = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    return {
        "bench": "consul_watch",
        "watchers": watchers,
        "writes": n_writes,
        "interval_ms": interval * 1000,
        "p50_ms": round(quantile(latencies, 0.50) * 1000, 2),
        "p99_ms": round(quantile(latencies, 0.99) * 1000, 2),
        "all_watchers_p50_ms": round(quantile(all_seen, 0.50) * 1000, 2),
        "all_watchers_p99_ms": round(quantile(all_seen, 0.99) * 1000, 2),
        "missed_deliveries": missing,
        "client_errors": errors,
        "devconsul_cpu_percent": round(100 * cpu_s / wall, 1),
        # load-independent cost: server CPU per answered long-poll (answer + re-park)
        "devconsul_cpu_us_per_answer": round(1e6 * cpu_s / max(answers, 1), 1),
        "answers": answers,
        "client_processes": len(workers),
        "host_cpus": psutil.cpu_count(),
        "host_load_1m": round(psutil.getloadavg()[0], 2),
    }


def dc_parked(dc: DevConsul) -> int:
    try:
        return dc.parked_queries()
    except OSError:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watchers", type=int, default=500)
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between writes")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of writing")
    parser.add_argument("--processes", type=int, default=2, help="client processes sharing the watchers")
    args = parser.parse_args()
    if args.watchers < 1 or args.processes < 1 or args.interval <= 0 or args.duration < args.interval:
        parser.error("need --watchers >= 1, --interval > 0, --duration >= --interval")
    print(json.dumps(asyncio.run(run(args.watchers, args.interval, args.duration, args.processes))))


if __name__ == "__main__":
    main()
