#!/usr/bin/env python3
"""Service overhead as users see it: how much slower is a service with azprobe loaded?

nginx (Debian) serves a small response in a lab server namespace (az-b); wrk (Debian) in
the az-a client namespace drives it, once with keep-alive connections and once with a new
connection per request. Each mode runs PAIRS times with the agent loaded and not loaded,
interleaved (off/on, then on/off, ...) so drift in a shared machine hits both sides alike.
Per pair: requests/s ratio (on / off) and P99 latency ratio; reported as median with min
and max. Also the machine's busy CPU time per request (all CPUs, from /proc/stat: the
service, wrk, softirqs, the probe and the agent alike), and capacity_ratio = its off / on:
the throughput ratio a CPU-bound service would see at the same CPU. On a shared VM the
CPU a run gets from the host varies by ±15 % between runs of one arm, which moves
requests/s far more than the probe does; busy CPU per request moves with it (the machine
is CPU-bound in both arms), so neither ratio resolves a 1 % effect.

probe_cost does not compare runs: with one agent loaded and BPF run-time stats on
(BPF_ENABLE_STATS, only in this phase: bpf_stats adds two clock reads to every handler
run, which must not weigh on the A/B pairs), each mode runs wrk 3 times and
reads, around each run, the agent's handler run time and run count (its /metrics), the
agent process's user+sys CPU time (its kernel CPU clock, to the ns: psutil's 10 ms ticks
are about what the agent takes in a run), and the machine's busy CPU. Per run and
request: the handlers' kernel time (bpf_ns_per_request; per handler its runs and ns per
run), the busy CPU, the agent's CPU, their shares of the busy CPU (bpf_share,
agent_share), and implied_rps_ratio = 1 - bpf_share - agent_share: a CPU-bound service at
saturation loses exactly the CPU the probe and the agent take per request. All are ratios
within one run, so the host's run-to-run noise cancels. Reported per mode as the median
of the 3 runs. What bpf_stats leaves out and puts in: a classic tracepoint's record,
built before the program runs, is not in it (on classic hooks implied_rps_ratio flatters
the probe); its own two clock reads per run are (~70 ns of every run here), so on
tp_btf hooks it overstates the handlers. bench/hook_overhead.py measures the whole from the
service's side. Handler runs and busy CPU are the whole machine's: the bench needs the
machine otherwise idle.

toggled_pairs answers the A/B question with the noise taken out: one agent runs in this
process all along (its loop reading the maps every interval), and only its handlers are
attached or detached between wrk runs of TOGGLE_S seconds, TOGGLE_PAIRS pairs per mode in
ABBA order. Attaching takes microseconds, so a pair is 2 s apart instead of ~20 s, and
the host's drift, which is slow, is the same for both arms. Reported per mode: the
per-pair requests/s ratio (median, mean and the mean's standard error), the ratio of the
total requests, and the per-pair P99 ratio (median). The agent's own CPU is in both
arms; probe_cost gives its share.

Then the agent's own CPU (% of one core) and RSS under the lab's traffic generators at
about 20,000 segments/s plus 500 new connections/s.
Goals: throughput ratio >= 0.99 (and implied_rps_ratio >= 0.99), P99 ratio <= 1.02,
agent <= 2 % of a core and <= 160 MB. Prints one JSON line at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from azprobe.agent.bpf_syscall import run_time_stats  # noqa: E402
from azprobe.agent.probe import Probe  # noqa: E402
from tests.agent_harness import running_agent  # noqa: E402
from azprobe.dev.lab import Lab, LabSpec, TrafficSpec, unique_lab_name  # noqa: E402
from azprobe.dev.lab.netns import ns_argv  # noqa: E402
from azprobe.daemon.address_file import format_host_port, wait_for_address_file  # noqa: E402
# bench/ is sys.path[0]
from hook_overhead import Hooks  # noqa: E402
from probe_overhead import agent_stats, exit_on_sigterm, log, wait_healthy  # noqa: E402

PAIRS = int(os.environ.get("AZPROBE_BENCH_PAIRS", "5"))
RUN_S = int(os.environ.get("AZPROBE_BENCH_RUN_SECONDS", "5"))
LOAD_S = float(os.environ.get("AZPROBE_BENCH_SECONDS", "15"))
SETTLE_S = 3.0
PROBE_COST_RUNS = 3
TOGGLE_PAIRS = int(os.environ.get("AZPROBE_BENCH_TOGGLE_PAIRS", "100"))
TOGGLE_S = 1
MODES = (("keepalive", True), ("new_connection", False))
NGINX_PORT = 8080
# 3 clients x 3 targets: 56 new connections/s each = 500/s; 10 long-lived connections
# each with a round trip every 9 ms ~ 10,000 round trips/s ~ 20,000 received segments/s.
LOAD = TrafficSpec(rate=56.0, conns=10, interval_ms=9.0)
NGINX_CONF = """
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path {dir}; proxy_temp_path {dir}; fastcgi_temp_path {dir};
  uwsgi_temp_path {dir}; scgi_temp_path {dir};
  server {{
    listen {addr}:{port} reuseport backlog=4096;
    location / {{ return 200 "azprobe service_overhead\\n"; }}
  }}
}}
"""
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def parse_wrk(out: str) -> tuple[float, float, int]:
    """(requests/s, P99 ms, requests) from `wrk --latency` output."""
    rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))
    value, unit = re.search(r"^\s+99%\s+([0-9.]+)(us|ms|s)\s*$", out, re.MULTILINE).groups()
    requests = int(re.search(r"^\s*([0-9]+) requests in ", out, re.MULTILINE).group(1))
    return rps, float(value) * UNITS[unit], requests


def busy_cpu_seconds() -> float:
    """CPU time all CPUs spent not idle since boot (/proc/stat: user, nice, system, irq,
    softirq; guest time is inside user; idle, iowait and steal are not work done here)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


class AgentProcess:
    """`azprobe agent` as a process; with `ns`, inside that namespace (the sock_diag
    collector sees the sockets of its own namespace), health-checked from inside it."""

    def __init__(self, config: Path, collector: str = "auto", lab: Lab | None = None, ns: str | None = None) -> None:
        # Port 0: the agent binds a free port itself and reports it in the address file.
        address_file = Path(tempfile.mkdtemp(prefix="azprobe-bench-")) / "agent.address"
        # Scheduled as systemd/azprobe-agent.service runs it (CPUSchedulingPolicy=batch, Nice=10).
        argv = ["chrt", "--batch", "0", "nice", "-n", "10",
                sys.executable, "-m", "azprobe.commands.cli", "agent", "--config", str(config), "--collector", collector,
                "--listen", "127.0.0.1:0", "--address-file", str(address_file)]
        self.proc = subprocess.Popen(ns_argv(ns, argv) if ns else argv,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            address = wait_for_address_file(address_file, alive=lambda: self.proc.poll() is None, timeout_s=60)
            if address is None:
                raise SystemExit(f"bench: agent reported no address (exit {self.proc.poll()})")
            self.url = f"http://{format_host_port(*address)}"
            if ns and lab:
                check = ["curl", "-sf", "-o", "/dev/null", f"{self.url}/healthz"]
                deadline = time.monotonic() + 60
                while lab.exec(ns, check, check=False).returncode != 0:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise SystemExit(f"bench: agent in {ns} did not become healthy")
                    time.sleep(0.2)
            else:
                wait_healthy(self.url, self.proc, timeout=60)
        except SystemExit:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class WrkRun(NamedTuple):
    rps: float
    p99_ms: float
    cpu_us_per_request: float  # busy CPU, all CPUs
    requests: int


def wrk(lab: Lab, url: str, keepalive: bool, seconds: int = RUN_S) -> WrkRun:
    """One wrk run: requests/s, P99 ms, busy CPU µs per request, requests."""
    argv = ["wrk", "-t1", "-c16", f"-d{seconds}s", "--latency", url]
    if not keepalive:
        argv[1:1] = ["-H", "Connection: close"]
    cpu0 = busy_cpu_seconds()
    out = lab.exec(lab.client_ns("az-a"), argv, timeout=seconds + 30).stdout
    cpu1 = busy_cpu_seconds()
    rps, p99, requests = parse_wrk(out)
    return WrkRun(rps, p99, round(1e6 * (cpu1 - cpu0) / max(requests, 1), 2), requests)


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4)}


def service_pairs(lab: Lab, config: Path, url: str) -> dict:
    result = {}
    for mode, keepalive in MODES:
        rps_ratio, p99_ratio, capacity_ratio, raw = [], [], [], []
        for i in range(PAIRS):
            runs = {}
            for loaded in ((False, True) if i % 2 == 0 else (True, False)):
                agent = AgentProcess(config) if loaded else None
                # Both arms start after the same settle time: a loaded run otherwise
                # starts seconds later (the agent's load) than an unloaded one, after the
                # previous run's sockets and CPU load have had longer to drain.
                time.sleep(SETTLE_S)
                try:
                    runs[loaded] = wrk(lab, url, keepalive)
                finally:
                    if agent:
                        agent.stop()
            rps_ratio.append(runs[True].rps / runs[False].rps)
            p99_ratio.append(runs[True].p99_ms / runs[False].p99_ms)
            capacity_ratio.append(runs[False].cpu_us_per_request / runs[True].cpu_us_per_request)
            raw.append({"off": runs[False], "on": runs[True]})
            log(f"{mode} pair {i + 1}: off {runs[False]}, on {runs[True]}")
        result[mode] = {"rps_ratio": spread(rps_ratio), "p99_ratio": spread(p99_ratio),
                        "capacity_ratio": spread(capacity_ratio),
                        "cpu_us_per_request_off_median": round(statistics.median(r["off"].cpu_us_per_request
                                                                                 for r in raw), 2),
                        "rps_off_median": round(statistics.median(r["off"].rps for r in raw), 1),
                        "p99_ms_off_median": round(statistics.median(r["off"].p99_ms for r in raw), 3)}
    return result


def process_cpu_seconds(pid: int) -> float:
    """user + sys CPU time of the process, every thread (exited ones too), to the ns: the
    kernel's CPU clock of process `pid` (the clockid clock_getcpuclockid(3) returns:
    CPUCLOCK_SCHED of the whole process). psutil's times come in 10 ms clock ticks, and the
    agent takes about one tick in a run: a median of 3 runs then often reads 0."""
    return time.clock_gettime_ns(((~pid) << 3) | 2) / 1e9


def run_cost(run: WrkRun, before: dict[str, list[int]], after: dict[str, list[int]], agent_cpu_s: float) -> dict:
    """One run's probe and agent cost per request, unrounded; the shares are of the busy
    CPU per request of the same run, so the run's throughput cancels out."""
    requests = max(run.requests, 1)
    runs, ns_per_event = {}, {}
    bpf_ns = 0
    for prog, (ns1, n1) in sorted(after.items()):
        ns0, n0 = before.get(prog, [0, 0])
        bpf_ns += ns1 - ns0
        runs[prog] = (n1 - n0) / requests
        ns_per_event[prog] = (ns1 - ns0) / (n1 - n0) if n1 > n0 else None
    if not any(runs.values()):
        raise SystemExit("bench: the agent counted no BPF handler runs (bpf_stats off or no probe loaded)")
    busy_ns = 1e3 * run.cpu_us_per_request
    bpf_share = bpf_ns / requests / busy_ns
    agent_share = 1e9 * agent_cpu_s / requests / busy_ns
    return {"rps": run.rps, "cpu_us_per_request": run.cpu_us_per_request, "bpf_ns_per_request": bpf_ns / requests,
            "agent_cpu_us_per_request": 1e6 * agent_cpu_s / requests, "bpf_share": bpf_share,
            "agent_share": agent_share, "implied_rps_ratio": 1.0 - bpf_share - agent_share,
            "bpf_ns_per_event": ns_per_event, "bpf_runs_per_request": runs}


def toggled_pairs(lab: Lab, config: Path, url: str) -> dict:
    """Per mode, TOGGLE_PAIRS pairs of TOGGLE_S-second wrk runs with the agent's handlers
    attached and detached (see the module docstring)."""
    probe = Probe.load()
    try:
        with running_agent(config, probe=probe):  # its loop reads the maps all along
            result = toggle_modes(lab, url, Hooks(probe))  # detached until a run attaches them
    finally:
        probe.close()  # after the agent has stopped reading it
    return {"pairs": TOGGLE_PAIRS, "run_s": TOGGLE_S, **result}


def toggle_modes(lab: Lab, url: str, hooks: Hooks) -> dict:
    """toggled_pairs' measurement, per mode."""
    result = {}
    for mode, keepalive in MODES:
        rps_ratio, p99_ratio, requests = [], [], {False: 0, True: 0}
        for i in range(TOGGLE_PAIRS):
            runs = {}
            for attached in ((False, True) if i % 2 == 0 else (True, False)):
                if attached:
                    hooks.attach()
                try:
                    runs[attached] = wrk(lab, url, keepalive, TOGGLE_S)
                finally:
                    hooks.detach()
                requests[attached] += runs[attached].requests
            rps_ratio.append(runs[True].rps / runs[False].rps)
            p99_ratio.append(runs[True].p99_ms / runs[False].p99_ms)
            if (i + 1) % 20 == 0:
                log(f"{mode}: {i + 1}/{TOGGLE_PAIRS} toggled pairs, requests/s ratio so far "
                    f"{statistics.median(rps_ratio):.4f}")
        result[mode] = {
            "rps_ratio": {**spread(rps_ratio), "mean": round(statistics.mean(rps_ratio), 4),
                          "stderr": round(statistics.stdev(rps_ratio) / len(rps_ratio) ** 0.5, 4)},
            "requests_ratio": round(requests[True] / requests[False], 4),
            "p99_ratio": spread(p99_ratio),
        }
    return result


def median_by_prog(runs: list[dict], key: str, digits: int) -> dict[str, float | None]:
    """Per handler, the median over the runs that have a value (a handler that did not run
    has no ns per event)."""
    progs = sorted({prog for r in runs for prog in r[key]})
    out = {}
    for prog in progs:
        values = [r[key][prog] for r in runs if r[key].get(prog) is not None]
        out[prog] = round(statistics.median(values), digits) if values else None
    return out


def probe_cost(lab: Lab, config: Path, url: str) -> dict:
    """Per mode, the median of PROBE_COST_RUNS runs of the probe's and the agent's CPU per
    request (see the module docstring); the agent is loaded throughout."""
    digits = {"rps": 1, "cpu_us_per_request": 2, "bpf_ns_per_request": 1, "agent_cpu_us_per_request": 3,
              "bpf_share": 5, "agent_share": 5, "implied_rps_ratio": 4}
    result = {}
    # bpf_stats is on only here, never while the A/B pairs run; released on an exception
    # and on SIGTERM (which unwinds like Ctrl-C).
    with run_time_stats():
        # The BPF collector explicitly: "auto" falling back to sock_diag has no handlers to measure.
        agent = AgentProcess(config, "bpf")
        try:
            pid = agent.proc.pid
            for mode, keepalive in MODES:
                runs = []
                for i in range(PROBE_COST_RUNS):
                    # As in service_pairs: the previous run's sockets and CPU load drain first.
                    time.sleep(SETTLE_S)
                    # The scrapes are outside wrk's busy-CPU window; their own loopback
                    # connection adds a few dozen handler runs to 10^4-10^5 requests.
                    before, cpu0 = agent_stats(agent.url), process_cpu_seconds(pid)
                    run = wrk(lab, url, keepalive)
                    cpu1, after = process_cpu_seconds(pid), agent_stats(agent.url)
                    cost = run_cost(run, before, after, cpu1 - cpu0)
                    runs.append(cost)
                    log(f"{mode} probe cost run {i + 1}: {run.requests} requests ({run.rps:.0f}/s), "
                        f"busy {cost['cpu_us_per_request']:.2f} µs, bpf {cost['bpf_ns_per_request']:.0f} ns "
                        f"({100 * cost['bpf_share']:.2f} %), agent {cost['agent_cpu_us_per_request']:.3f} µs "
                        f"({100 * cost['agent_share']:.3f} %) per request; implied rps ratio "
                        f"{cost['implied_rps_ratio']:.4f}; runs per request "
                        + ", ".join(f"{p} {n:.2f}" for p, n in cost["bpf_runs_per_request"].items() if n))
                result[mode] = {key: round(statistics.median(r[key] for r in runs), d) for key, d in digits.items()}
                result[mode]["bpf_ns_per_event"] = median_by_prog(runs, "bpf_ns_per_event", 1)
                result[mode]["bpf_runs_per_request"] = median_by_prog(runs, "bpf_runs_per_request", 3)
        finally:
            agent.stop()
    return {"runs": PROBE_COST_RUNS, **result}


def agent_under_load(lab: Lab, config: Path, collector: str = "bpf", ns: str | None = None) -> dict:
    lab.start_traffic(LOAD)
    agent = AgentProcess(config, collector, lab, ns)
    try:
        proc = psutil.Process(agent.proc.pid)
        time.sleep(3.0)  # a benchmark's fixed warm-up, not synchronisation
        before = lab.traffic_stats()
        t0, cpu0 = time.monotonic(), sum(proc.cpu_times()[:2])
        segs0 = tcp_in_segs(lab)
        time.sleep(LOAD_S)  # the measurement interval
        t1, cpu1 = time.monotonic(), sum(proc.cpu_times()[:2])
        segs1 = tcp_in_segs(lab)
        after = lab.traffic_stats()
        rss_mb = proc.memory_info().rss / 2**20
    finally:
        agent.stop()
        lab.stop_traffic()
    seconds = t1 - t0
    new_conns = sum(t.get("ok", 0) for az in after.values() for t in az.values()) - \
        sum(t.get("ok", 0) for az in before.values() for t in az.values())
    return {"segments_in_per_s": round((segs1 - segs0) / seconds), "new_conns_per_s": round(new_conns / seconds),
            "agent_cpu_pct": round(100.0 * (cpu1 - cpu0) / seconds, 2), "agent_rss_mb": round(rss_mb, 1)}


def tcp_in_segs(lab: Lab) -> int:
    """TCP segments received in every lab namespace (the kernel's own count)."""
    return sum(lab.netstat(ns).get("TcpInSegs", 0) for ns in lab.namespaces if ns != lab.router_ns)


def main() -> None:
    # SIGTERM unwinds like Ctrl-C, so the lab, nginx and any agent are removed and
    # bpf_stats is restored.
    signal.signal(signal.SIGTERM, exit_on_sigterm(os.getpid()))
    with tempfile.TemporaryDirectory() as tmp, \
            Lab.up(LabSpec(name=unique_lab_name("so"), state_dir=Path(tmp) / "lab", traffic=False)) as lab:
        addr = lab.server_addr("az-b")
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(NGINX_CONF.format(dir=tmp, addr=addr, port=NGINX_PORT))
        nginx = subprocess.Popen(ns_argv(lab.server_ns("az-b"), ["nginx", "-c", str(conf), "-g", "daemon off;"]),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            url = f"http://{addr}:{NGINX_PORT}/"
            deadline = time.monotonic() + 15
            while lab.exec(lab.client_ns("az-a"), ["wrk", "-t1", "-c1", "-d1s", url], check=False).returncode:
                if time.monotonic() > deadline or nginx.poll() is not None:
                    raise SystemExit(f"bench: nginx not serving: {nginx.stderr.read() if nginx.poll() else ''}")
                time.sleep(0.2)
            service = service_pairs(lab, lab.agent_config_path, url)
            toggled = toggled_pairs(lab, lab.agent_config_path, url)
            cost = probe_cost(lab, lab.agent_config_path, url)
            load = agent_under_load(lab, lab.agent_config_path)
            # The fallback sees its own namespace's sockets: run it in az-a's client
            # namespace (a third of the load's connections, all of their TIME_WAITs).
            fallback = agent_under_load(lab, lab.agent_config_path, "sockdiag", lab.client_ns("az-a"))
        finally:
            nginx.terminate()
            nginx.wait(timeout=10)
    result = {"bench": "service_overhead", "pairs": PAIRS, "run_s": RUN_S, **service, "toggled": toggled,
              "probe_cost": cost,
              "agent_under_load": load, "sockdiag_agent_under_load": fallback}
    ka, nc = service["keepalive"], service["new_connection"]
    cka, cnc = cost["keepalive"], cost["new_connection"]
    log(f"goals: rps ratio >= 0.99 (keepalive {ka['rps_ratio']['median']}, new conn {nc['rps_ratio']['median']}; "
        f"at equal CPU {ka['capacity_ratio']['median']}, {nc['capacity_ratio']['median']}; "
        f"from CPU per request {cka['implied_rps_ratio']}, {cnc['implied_rps_ratio']}: "
        f"bpf {cka['bpf_ns_per_request']}, {cnc['bpf_ns_per_request']} ns of "
        f"{cka['cpu_us_per_request']}, {cnc['cpu_us_per_request']} µs, agent {cka['agent_cpu_us_per_request']}, "
        f"{cnc['agent_cpu_us_per_request']} µs; "
        f"handlers toggled {toggled['keepalive']['rps_ratio']['median']}, "
        f"{toggled['new_connection']['rps_ratio']['median']}), "
        f"P99 ratio <= 1.02 ({ka['p99_ratio']['median']}, {nc['p99_ratio']['median']}; handlers toggled "
        f"{toggled['keepalive']['p99_ratio']['median']}, {toggled['new_connection']['p99_ratio']['median']}), "
        f"agent <= 2 % "
        f"({load['agent_cpu_pct']}) and <= 160 MB ({load['agent_rss_mb']})")
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
