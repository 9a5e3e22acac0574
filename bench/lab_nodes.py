"""What one agent per client node costs: the demo's stack (lab with N client nodes per
AZ, traffic, devconsul, one agent per node) without controllers, measured with psutil.

Prints one line of progress, then ONE final JSON line:
  {"nodes_per_az": N, "agents": n, "agents_ready_s": s, "agent_rss_mb": {"mean", "max"},
   "agent_cpu_pct": {"mean", "max"}, "generator_cpu_pct": {...}, "total_cpu_pct": x, ...}
CPU is percent of one core over --measure-s seconds with the lab's default traffic.
Needs root (namespaces, BPF).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import psutil

from azprobe.dev.demo.runner import LoopStack
from azprobe.dev.lab.lab import unique_lab_name
from azprobe.dev.lab.netns import pids_in_namespaces
from azprobe.dev.lab.topology import DEFAULT_NODES_PER_AZ


def _cpu_pct(procs: list[psutil.Process], seconds: float) -> list[float]:
    def cpu(p: psutil.Process) -> float:
        try:
            t = p.cpu_times()
            return t.user + t.system
        except psutil.Error:
            return 0.0
    before = [cpu(p) for p in procs]
    time.sleep(seconds)  # the measurement interval itself, not synchronisation
    return [round(100.0 * (cpu(p) - b) / seconds, 1) for p, b in zip(procs, before)]


def _stats(values: list[float]) -> dict[str, float]:
    return {"mean": round(sum(values) / len(values), 1) if values else 0.0, "max": max(values, default=0.0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes-per-az", type=int, default=DEFAULT_NODES_PER_AZ)
    parser.add_argument("--measure-s", type=float, default=10.0)
    args = parser.parse_args(argv)
    started = time.monotonic()
    with LoopStack(lab_name=unique_lab_name("bn"), nodes_per_az=args.nodes_per_az) as stack:
        ready_s = round(time.monotonic() - started, 2)
        agents = [psutil.Process(a.pid) for a in stack.agents.values() if a.pid]
        client_ns = [n.ns for n in stack.lab.nodes]
        generators = [psutil.Process(pid) for pid in pids_in_namespaces(client_ns)]
        print(f"{len(agents)} agents, {len(generators)} generators up in {ready_s} s; measuring "
              f"{args.measure_s:g} s", file=sys.stderr, flush=True)
        cpu = _cpu_pct(agents + generators, args.measure_s)
        agent_cpu, gen_cpu = cpu[:len(agents)], cpu[len(agents):]
        rss = [round(p.memory_info().rss / 2**20, 1) for p in agents]
    print(json.dumps({"nodes_per_az": args.nodes_per_az, "agents": len(agents), "stack_ready_s": ready_s,
                      "agent_rss_mb": _stats(rss), "agent_cpu_pct": _stats(agent_cpu),
                      "generator_cpu_pct": _stats(gen_cpu),
                      "total_cpu_pct": round(sum(cpu), 1)}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
