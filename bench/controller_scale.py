"""Controller scale bench: 5,000 synthetic agents x 3 AZs, one collect+decide cycle per second.

The agents are served cheaply by ONE separate process (tests/fakeagent.py bulk mode: one
port, agent N at http://127.0.0.1:PORT/a/N, a new window per agent per second, each agent's
ending at its own point of the second as in a fleet whose agents started at different
times; --lockstep ends them all at one instant, so a cycle that straddles that instant
takes a second window from some agents), so the
numbers are the controller's: real HTTP pulls of every agent, parse_window on every
window, the store's per-node sums, the spike detector, model + safety for the global
and per-source views. Consul is not involved (publishing is one txn per cycle).

--real-agents serves every agent through the agent's own HTTP server instead
(tests/promagent.py: one azprobe.agent.http server per agent, its own port, in one
separate process), so the pulls also measure the agent's side of the wire; use a few
hundred agents (a thread-per-connection stdlib server each), not thousands.

Prints progress on stderr and ONE final JSON line on stdout:
cycle p50/p99/max (s, wall), the CPU seconds each cycle used (p50/p99: the figure that
does not depend on what else runs on the box) and the kernel's part of them (p50: system
time, mostly the pulls' sends and receives), pull p50 (s), the controller process's CPU %
of one core over the measured cycles, windows held / new per cycle, failed pulls, and the
1-minute load average (this box is shared), and the controller's CPU µs per agent window
(all its CPU over the measured cycles / windows taken in), and after the cycles the latency
of one agent's pull (p50/p99 of 50 sequential keep-alive pulls of agent 0 with the
controller's client). Goal: <= 1 s per cycle at p99, no failed pull, well under 200 µs of
CPU per agent window (docs/scale.md).

--tls pulls every agent over mutual TLS (a node certificate per agent from a test CA,
one port per agent, served by --agent-procs fake processes; the controller's
[agents.tls] and agents.identity binding every answer): the cycles are measured once
every connection is open (keep-alive; `connect_*`: the first connection of all, each
agent's whole ring on its first pull), and then every connection is dropped, as after a
leader change, and the cycles until every agent answers again are reported
(`reconnect_*`): the handshake cost of a full reconnect. Each of the two reports its
cycles, their wall seconds (`wall_s`, and `elapsed_s` from the first cycle's start until
every agent answered), the slowest cycle, the controller's CPU seconds and ms per agent,
the handshakes it made and per second, the fake agents' CPU seconds, and the first
cycle's failed pulls. `handshakes_in_measured_cycles` counts the connections remade
during the measured cycles (a pull past its deadline keeps its connection, so 0 unless
one was lost), `responses_drained` the answers read after their pull's deadline.

    .venv/bin/python bench/controller_scale.py [--agents 5000] [--cycles 20] [--real-agents] [--tls [--agent-procs 2]] [--lockstep]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from azprobe.daemon.address_file import wait_for_address_file  # noqa: E402
from azprobe.clients.agent import pull_page  # noqa: E402
from azprobe.clients.transport import AgentHttpClient, Endpoint, raise_file_limit  # noqa: E402
from azprobe.controller.config import ControllerConfig, parse_config  # noqa: E402
from azprobe.controller.main import Controller, next_start, run_event_loop  # noqa: E402


BENCH_AZS = ["az-a", "az-b", "az-c"]  # the fake agents' --azs default


def bench_config(urls: list[str], interval_s: float, **agents: object) -> ControllerConfig:
    """The benches' controller: `urls` as its static agents, `agents` more [agents] keys."""
    return parse_config({
        "controller": {"name": "bench", "interval_s": interval_s, "evaluation_window_s": 5.0,
                       "listen": "127.0.0.1:9741"},
        "consul": {"address": "http://127.0.0.1:1"},  # never contacted: the benches run cycles only
        "agents": {"static": urls, **agents},
        "topology": {"azs": BENCH_AZS},
    })


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def run(controller: Controller, cycles: int, warmup: int, interval: float) -> dict:
    proc = psutil.Process()
    durations: list[float] = []
    cpu_per_cycle: list[float] = []
    sys_per_cycle: list[float] = []  # the kernel's part: sending and receiving the pulls
    pulls: list[float] = []
    windows: list[int] = []
    new_windows: list[int] = []
    failed: list[int] = []
    cpu_start = wall_start = None
    next_at = time.monotonic()
    for i in range(warmup + cycles):
        if i == warmup:
            t = proc.cpu_times()
            cpu_start, wall_start = t.user + t.system, time.monotonic()
        cpu_before, sys_before = time.process_time(), proc.cpu_times().system
        out = await controller.cycle()
        if i >= warmup:
            cpu_per_cycle.append(time.process_time() - cpu_before)
            sys_per_cycle.append(proc.cpu_times().system - sys_before)
            durations.append(out.duration_s)
            pulls.append(out.pull.duration_s)
            windows.append(len(controller.collector.store))
            new_windows.append(out.pull.ingested)
            failed.append(out.pull.failed)
            print(f"cycle {i - warmup + 1}/{cycles}: {out.duration_s:.3f} s, cpu {cpu_per_cycle[-1]:.3f} s "
                  f"(pull {out.pull.duration_s:.3f} s, "
                  f"{out.pull.ingested} new windows, {out.pull.failed} failed)", file=sys.stderr)
        next_at = next_start(next_at, time.monotonic(), interval)  # the daemon's schedule
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    t = proc.cpu_times()
    cpu_s = t.user + t.system - cpu_start
    cpu = cpu_s / (time.monotonic() - wall_start)
    await controller.collector.close()
    shares = {az: z.share for az, z in views[""].zones.items()} if (views := controller.handover.views()) else {}
    return {"cycle_p50_s": round(statistics.median(durations), 4), "cycle_p99_s": round(quantile(durations, 0.99), 4),
            "cycle_max_s": round(max(durations), 4), "pull_p50_s": round(statistics.median(pulls), 4),
            "cycle_cpu_p50_s": round(statistics.median(cpu_per_cycle), 4),
            "cycle_cpu_p99_s": round(quantile(cpu_per_cycle, 0.99), 4),
            "cycle_sys_cpu_p50_s": round(statistics.median(sys_per_cycle), 4),
            "controller_cpu_pct": round(100 * cpu, 1), "windows_in_evaluation": int(statistics.median(windows)),
            "new_windows_per_cycle": int(statistics.median(new_windows)),
            "failed_pulls_max": max(failed), "failed_pulls_total": sum(failed),
            # Every CPU second of the controller process (pulls, decoding, merge, decisions,
            # its metrics server) over the windows it took in: the figure issue 11 budgets.
            "cpu_us_per_agent_window": round(1e6 * cpu_s / max(sum(new_windows), 1), 1),
            "shares": shares}


SEQUENTIAL_PULLS = 50


async def sequential_pulls(url: str, count: int) -> dict:
    """One agent pulled `count` times in a row on one kept-alive connection, each after the
    newest window it had (a controller's steady pull): the latency of a pull, which a
    cycle's pull phase cannot be shorter than."""
    client, ep = AgentHttpClient(), Endpoint.parse(url)
    took: list[float] = []
    try:
        page = await pull_page(client, ep, 0)  # the connection is open before the first timed pull
        after = max((w.seq or 0 for w in page.windows), default=0)
        for _ in range(count):
            started = time.perf_counter()
            page = await pull_page(client, ep, after)
            took.append(time.perf_counter() - started)
            after = max([after] + [w.seq or 0 for w in page.windows])
    finally:
        client.close()
    return {"pull_latency_p50_s": round(statistics.median(took), 5), "pull_latency_p99_s": round(quantile(took, 0.99), 5)}


def start_fake_agents(args: argparse.Namespace, env: dict, address_file: Path) -> tuple[list[subprocess.Popen], list[str]]:
    """The bulk fake agents; with --tls in --agent-procs processes (agents split evenly), as
    TLS costs the agents' side a handshake and the encryption of every answer, which one
    process on a shared 2-core box does not keep up with at 5,000 agents: the bench is of
    the controller, each real agent has a host of its own."""
    procs = args.agent_procs if args.tls else 1
    servers: list[subprocess.Popen] = []
    for i in range(procs):
        first, count = i * args.agents // procs, (i + 1) * args.agents // procs - i * args.agents // procs
        tls = ["--tls-dir", str(address_file.parent), "--first", str(first)] if args.tls else []
        servers.append(subprocess.Popen([sys.executable, "-m", "tests.fakeagent", "--agents", str(count),
                                         "--interval", str(args.interval), "--address-file", f"{address_file}.{i}",
                                         *tls, *([] if args.lockstep else ["--stagger"])], cwd=ROOT, env=env))
    for i, server in enumerate(servers):
        address = wait_for_address_file(Path(f"{address_file}.{i}"), alive=lambda: server.poll() is None, timeout_s=600)
        if address is None:
            for s in servers:
                s.terminate()
            raise SystemExit(f"bench: the fake agents reported no address (exit {server.poll()})")
    if args.tls:
        ports = [port for i in range(procs) for port in json.loads(
            (address_file.parent / f"ports-{i * args.agents // procs}.json").read_text())]
        return servers, [f"https://127.0.0.1:{port}/a/{i}" for i, port in enumerate(ports)]
    return servers, [f"http://127.0.0.1:{address[1]}/a/{i}" for i in range(args.agents)]


def start_real_agents(args: argparse.Namespace, env: dict) -> tuple[subprocess.Popen, list[str]]:
    server = subprocess.Popen([sys.executable, "-m", "tests.promagent", "--agents", str(args.agents),
                               "--interval", str(args.interval)], cwd=ROOT, env=env, stdout=subprocess.PIPE)
    assert server.stdout is not None
    ready, _, _ = select.select([server.stdout], [], [], 120)
    line = server.stdout.readline() if ready else b""
    if not line:
        server.terminate()
        raise SystemExit(f"bench: the real agents printed no URLs (exit {server.poll()})")
    return server, json.loads(line)


def cpu_s(procs: list[psutil.Process]) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in procs)


BENCH_IDENTITY = "spiffe://bench.test/azprobe/node/{node}"


def make_pki(directory: Path, agents: int) -> dict:
    """A CA, the controller's client certificate and one node certificate per agent
    (`n<KEY>`, the bulk fake's node names); returns the controller's [agents.tls]."""
    from tests.pki import TestCA

    ca = TestCA.create(directory, "ca")
    controller = ca.issue("controller", uri=["spiffe://bench.test/azprobe/controller"], file_stem="controller")
    for i in range(agents):
        ca.issue(f"n{i}", uri=[BENCH_IDENTITY.replace("{node}", f"n{i}")])
    return {"cert_file": controller.cert_file, "key_file": controller.key_file, "ca_file": ca.cert_file}


async def until_connected(controller: Controller, interval: float, agent_servers: list[psutil.Process],
                          max_cycles: int = 60) -> dict:
    """Cycles from no open connection (the first start, or a new leader) until every agent
    answers: their wall time (cycles only, and `elapsed_s` from the first cycle's start to
    the end of the one every agent answered in), the CPU they took on both sides, how many
    handshakes the controller made (a failed or timed-out pull does not redo one: its
    connection lingers for the next), the first one's failed pulls."""
    http = controller.collector._http
    handshakes_before, started = http.counters["handshakes"], time.monotonic()
    agent_cpu_before = cpu_s(agent_servers)
    cpu_before, wall, cycles, failed_first, slowest = time.process_time(), 0.0, 0, None, 0.0
    next_at = time.monotonic()
    for cycles in range(1, max_cycles + 1):
        cycle_cpu = time.process_time()
        out = await controller.cycle()
        wall += out.duration_s
        slowest = max(slowest, out.duration_s)
        failed_first = out.pull.failed if failed_first is None else failed_first
        print(f"connecting, cycle {cycles}: {out.duration_s:.3f} s, cpu {time.process_time() - cycle_cpu:.3f} s "
              f"(pull {out.pull.duration_s:.3f} s, {out.pull.ingested} new windows, {out.pull.failed} failed), "
              f"{http.counters['handshakes'] - handshakes_before} handshakes, {http.counters}", file=sys.stderr)
        if out.pull.failed == 0:
            break
        next_at = next_start(next_at, time.monotonic(), interval)
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    elapsed = time.monotonic() - started
    cpu = time.process_time() - cpu_before
    handshakes = http.counters["handshakes"] - handshakes_before
    return {"cycles": cycles, "wall_s": round(wall, 3), "elapsed_s": round(elapsed, 3), "cycle_max_s": round(slowest, 3),
            "cpu_s": round(cpu, 3), "first_cycle_failed": failed_first,
            "cpu_ms_per_agent": round(1e3 * cpu / max(len(controller.collector.cursors), 1), 3),
            "handshakes": handshakes, "handshakes_per_s": round(handshakes / max(elapsed, 1e-9), 1),
            "agent_server_cpu_s": round(cpu_s(agent_servers) - agent_cpu_before, 3)}


async def run_tls(controller: Controller, args: argparse.Namespace, agent_servers: list[psutil.Process]) -> dict:
    """Connect every agent, measure the cycles on the kept-alive connections (run() closes
    them at its end), then the full reconnect a new leader makes."""
    first = await until_connected(controller, args.interval, agent_servers)
    handshakes_connected = controller.collector._http.counters["handshakes"]
    result = await run(controller, args.cycles, args.warmup, args.interval)
    # connections lost during the measured cycles (0 when every one was kept)
    handshakes_steady = controller.collector._http.counters["handshakes"] - handshakes_connected
    again = await until_connected(controller, args.interval, agent_servers)
    await controller.collector.close()
    guard = controller.collector.guard
    counters = controller.collector._http.counters
    result.update({f"connect_{k}": v for k, v in first.items()})
    result.update({f"reconnect_{k}": v for k, v in again.items()})
    result.update({"identity_refused": sum(guard.refused.values()),
                   "tls_failures": sum(guard.handshake_failures.values()),
                   "handshakes_in_measured_cycles": handshakes_steady,
                   "responses_drained": counters["drained"], "drains_closed": counters["drain_closed"]})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=5000)
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--real-agents", action="store_true",
                        help="one real agent HTTP server per agent (tests/promagent.py) instead of the bulk fake")
    parser.add_argument("--tls", action="store_true", help="mutual TLS, a node certificate per agent (bulk fake)")
    parser.add_argument("--agent-procs", type=int, default=2, help="--tls: processes serving the fake agents")
    parser.add_argument("--lockstep", action="store_true",
                        help="every fake agent's windows end at the same instant (default: staggered, as in a fleet)")
    args = parser.parse_args()
    if args.tls and args.real_agents:
        raise SystemExit("bench: --tls serves the bulk fake agents; leave out --real-agents")

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # A SIGTERM (timeout(1), a CI limit) ends the bench through its `finally`: no fake agent outlives it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    address_dir = tempfile.TemporaryDirectory(prefix="azprobe-bench-")
    address_file = Path(address_dir.name) / "fakeagent.address"
    agents_tls = make_pki(Path(address_dir.name), args.agents) if args.tls else None
    if args.real_agents:
        server, urls = start_real_agents(args, env)
        servers = [server]
    else:
        servers, urls = start_fake_agents(args, env, address_file)
    try:
        config = bench_config(urls, args.interval, pull_timeout_s=0.8,
                              **({"tls": agents_tls, "identity": BENCH_IDENTITY} if agents_tls else {}))
        raise_file_limit()  # as the daemon does, before the collector sizes its pool
        controller = Controller(config)
        if args.tls:
            result = run_event_loop(run_tls(controller, args, [psutil.Process(s.pid) for s in servers]))
        else:
            result = run_event_loop(run(controller, args.cycles, args.warmup, args.interval))
            result.update(run_event_loop(sequential_pulls(urls[0], SEQUENTIAL_PULLS)))
        result.update({"agents": args.agents, "azs": 3, "cycles": args.cycles, "goal_cycle_s": 1.0,
                       "agents_served_by": "agent.http" if args.real_agents else "fakeagent bulk",
                       "transport": "mutual TLS" if args.tls else "http",
                       "agent_server_cpu_s_total": round(cpu_s([psutil.Process(s.pid) for s in servers]), 1),
                       "agent_procs": len(servers),
                       "load_avg_1m": round(os.getloadavg()[0], 2)})
        print(json.dumps(result, sort_keys=True))
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(10)
        address_dir.cleanup()


if __name__ == "__main__":
    main()
