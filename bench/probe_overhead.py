#!/usr/bin/env python3
"""Probe overhead under a fixed lab load.

Runs `azprobe agent` (subprocess) on a lab with a fixed traffic mix, loads bpf/empty.bpf.c
(an empty tcp_probe handler, on the hook kind the agent uses: tp_btf where the kernel's
BTF allows) in this process as the baseline, holds BPF run-time stats on
for the run (BPF_ENABLE_STATS, released after), and measures over DURATION_S:
  - ns_per_event per azprobe handler (run_time_ns / run_cnt deltas, from the agent's
    /metrics, which reads its own /proc/self/fdinfo) and empty_ns_per_event (ours);
  - the programs on one tracepoint run in attach order, and the first pays about 60 ns
    more for the same code (an empty program: 126-135 ns first, 70-72 ns after another;
    docs/probe.md "What a segment costs"). So an empty program is attached before the
    agent's and one after it: the agent's handler is compared with the one after it, in
    the same (not first) place; the first one's cost is reported as first_empty_ns;
  - events_per_s: runs of all azprobe handlers per second;
  - agent_cpu_pct (of one core) and agent_rss_mb of the agent process.
Goals: tcp_probe <= 2x empty; agent <= 2 % of a core. Prints one JSON line at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from azprobe import bpf  # noqa: E402
from azprobe.contracts import prom  # noqa: E402
from azprobe.daemon.address_file import format_host_port, wait_for_address_file  # noqa: E402
from azprobe.agent.bpf_syscall import run_time_stats  # noqa: E402
from azprobe.agent.probe import (BTF_HOOKS_FLAG, BtfHooks, btf_hooks, check_prerequisites,  # noqa: E402
                                 compile_program, load_btf_handlers, program_stats)
from azprobe.dev.lab import Lab, LabSpec, TrafficSpec, unique_lab_name  # noqa: E402

DURATION_S = float(os.environ.get("AZPROBE_BENCH_SECONDS", "15"))
# [agent] rtt_sample_ticks for the measured agent; unset: the agent's default.
RTT_SAMPLE_TICKS = os.environ.get("AZPROBE_BENCH_RTT_SAMPLE_TICKS", "")
WARMUP_S = 3.0
LOAD = TrafficSpec(rate=20.0, conns=4, interval_ms=10.0)  # per (client, target): the fixed load
# The agent's BPF run-time and run-count counters, one sample per handler.
METRIC = re.compile(rf'^({prom.BPF_RUN_TIME.series}|{prom.BPF_RUN_COUNT.series})'
                    r'\{prog="([a-z_]+)"\} ([0-9.e+-]+)$')


def exit_on_sigterm(main_pid: int):
    """A SIGTERM handler that unwinds the bench's own process like Ctrl-C (so its `with`
    blocks remove the lab), and ends forked helpers (pyroute2 forks to enter namespaces)
    at once: unwinding a fork's copy of the `with` blocks would tear down the lab."""
    def handler(_signum: int, _frame: object) -> None:
        if os.getpid() == main_pid:
            sys.exit(143)
        os._exit(143)
    return handler


class EmptyHandler:
    """bpf/empty.bpf.c on tcp_probe, on the hook kind the agent uses (tp_btf where the
    kernel's BTF allows, loaded the way the agent loads its own)."""

    def __init__(self, hooks: BtfHooks | None) -> None:
        self.program = compile_program(bpf.EMPTY_PROGRAM, [BTF_HOOKS_FLAG] if hooks else [])
        self.handlers = load_btf_handlers(self.program, hooks) if hooks else []

    def stats(self) -> tuple[int, int]:
        """(run_time_ns, run_cnt) so far."""
        return program_stats(self.program, self.handlers)["tcp_probe"]


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def agent_stats(url: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for line in urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode().splitlines():
        m = METRIC.match(line)
        if m:
            is_time = m.group(1) == prom.BPF_RUN_TIME.series
            value = float(m.group(3))  # run time in seconds: back to the kernel's integer ns
            out.setdefault(m.group(2), [0, 0])[0 if is_time else 1] = round(value * 1e9) if is_time else int(value)
    return out


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"bench: agent exited {proc.returncode}: {proc.stderr.read()}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("bench: agent did not become healthy")


def stop_agent(agent: subprocess.Popen | None) -> None:
    if agent is not None and agent.poll() is None:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=10)
        except subprocess.TimeoutExpired:
            agent.kill()


def main() -> None:
    # SIGTERM unwinds like Ctrl-C: the lab is removed and bpf_stats released.
    signal.signal(signal.SIGTERM, exit_on_sigterm(os.getpid()))
    check_prerequisites()
    agent = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(run_time_stats())
        stack.callback(lambda: stop_agent(agent))
        with tempfile.TemporaryDirectory() as tmp, \
                Lab.up(LabSpec(name=unique_lab_name("bn"), state_dir=Path(tmp), traffic=LOAD)) as lab:
            address_file = Path(tmp) / "agent.address"
            config = lab.agent_config_path
            if RTT_SAMPLE_TICKS:
                config = Path(tmp) / "agent.toml"
                config.write_text(lab.agent_config_path.read_text().replace(
                    "[agent]\n", f"[agent]\nrtt_sample_ticks = {int(RTT_SAMPLE_TICKS)}\n", 1))
            # The empty programs hook tcp_probe as the agent does (tp_btf where BTF allows).
            hooks = btf_hooks()
            first = EmptyHandler(hooks)  # takes the first place on tcp_probe
            agent = subprocess.Popen([sys.executable, "-m", "azprobe.commands.cli", "agent", "--config",
                                      str(config), "--listen", "127.0.0.1:0",
                                      "--address-file", str(address_file)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            address = wait_for_address_file(address_file, alive=lambda: agent.poll() is None, timeout_s=60)
            if address is None:
                raise SystemExit(f"bench: agent reported no address (exit {agent.poll()})")
            url = f"http://{format_host_port(*address)}"
            wait_healthy(url, agent)
            empty = EmptyHandler(hooks)
            proc = psutil.Process(agent.pid)
            time.sleep(WARMUP_S)  # a benchmark's fixed warm-up, not synchronisation

            t0, cpu0 = time.monotonic(), sum(proc.cpu_times()[:2])
            a0, e0, f0 = agent_stats(url), empty.stats(), first.stats()
            time.sleep(DURATION_S)  # the measurement interval
            t1, cpu1 = time.monotonic(), sum(proc.cpu_times()[:2])
            a1, e1, f1 = agent_stats(url), empty.stats(), first.stats()
            rss_mb = proc.memory_info().rss / 2**20
            traffic = lab.traffic_stats()

        seconds = t1 - t0
        per_prog = {}
        events = 0
        for prog, (ns1, n1) in sorted(a1.items()):
            ns0, n0 = a0.get(prog, [0, 0])
            runs = n1 - n0
            events += runs
            per_prog[prog] = {"ns_per_event": round((ns1 - ns0) / runs, 1) if runs else None,
                              "events_per_s": round(runs / seconds, 1)}
        empty_runs = e1[1] - e0[1]
        empty_ns = (e1[0] - e0[0]) / empty_runs if empty_runs else None
        first_runs = f1[1] - f0[1]
        first_ns = (f1[0] - f0[0]) / first_runs if first_runs else None
        probe_ns = per_prog.get("tcp_probe", {}).get("ns_per_event")
        result = {
            "bench": "probe_overhead",
            "duration_s": round(seconds, 2),
            "load": {"rate_per_target": LOAD.rate, "long_lived_per_target": LOAD.conns,
                     "request_interval_ms": LOAD.interval_ms, "clients": len(traffic)},
            "ns_per_event": {p: v["ns_per_event"] for p, v in per_prog.items()},
            "events_per_s_by_prog": {p: v["events_per_s"] for p, v in per_prog.items()},
            "rtt_sample_ticks": int(RTT_SAMPLE_TICKS) if RTT_SAMPLE_TICKS else "default",
            "hooks": "btf" if hooks else "classic",
            "empty_ns_per_event": round(empty_ns, 1) if empty_ns else None,
            "first_empty_ns_per_event": round(first_ns, 1) if first_ns else None,
            "tcp_probe_vs_empty": round(probe_ns / empty_ns, 2) if probe_ns and empty_ns else None,
            "events_per_s": round(events / seconds, 1),
            "agent_cpu_pct": round(100.0 * (cpu1 - cpu0) / seconds, 2),
            "agent_rss_mb": round(rss_mb, 1),
        }
    log(f"goals: tcp_probe <= 2x empty ({result['tcp_probe_vs_empty']}x), "
        f"agent <= 2 % of a core ({result['agent_cpu_pct']} %)")
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
