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
requests/s far more than the probe does; CPU per request does not depend on it. Then the agent's own CPU (% of one core) and RSS under the lab's traffic
generators at about 20,000 segments/s plus 500 new connections/s.
Goals: throughput ratio >= 0.99, P99 ratio <= 1.02, agent <= 2 % of a core and <= 160 MB.
Prints one JSON line at the end.
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

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from azprobe.dev.lab import Lab, LabSpec, TrafficSpec, unique_lab_name  # noqa: E402
from azprobe.dev.lab.netns import ns_argv  # noqa: E402
from azprobe.address_file import format_host_port, wait_for_address_file  # noqa: E402
from probe_overhead import exit_on_sigterm, log, wait_healthy  # noqa: E402  (bench/ is sys.path[0])

PAIRS = int(os.environ.get("AZPROBE_BENCH_PAIRS", "5"))
RUN_S = int(os.environ.get("AZPROBE_BENCH_RUN_SECONDS", "5"))
LOAD_S = float(os.environ.get("AZPROBE_BENCH_SECONDS", "15"))
SETTLE_S = 3.0
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
                sys.executable, "-m", "azprobe.cli", "agent", "--config", str(config), "--collector", collector,
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


def wrk(lab: Lab, url: str, keepalive: bool) -> tuple[float, float, float]:
    """(requests/s, P99 ms, busy CPU µs per request) of one wrk run."""
    argv = ["wrk", "-t1", "-c16", f"-d{RUN_S}s", "--latency", url]
    if not keepalive:
        argv[1:1] = ["-H", "Connection: close"]
    cpu0 = busy_cpu_seconds()
    out = lab.exec(lab.client_ns("az-a"), argv, timeout=RUN_S + 30).stdout
    cpu1 = busy_cpu_seconds()
    rps, p99, requests = parse_wrk(out)
    return rps, p99, round(1e6 * (cpu1 - cpu0) / max(requests, 1), 2)


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4)}


def service_pairs(lab: Lab, config: Path, url: str) -> dict:
    result = {}
    for mode, keepalive in (("keepalive", True), ("new_connection", False)):
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
            rps_ratio.append(runs[True][0] / runs[False][0])
            p99_ratio.append(runs[True][1] / runs[False][1])
            capacity_ratio.append(runs[False][2] / runs[True][2])
            raw.append({"off": runs[False], "on": runs[True]})
            log(f"{mode} pair {i + 1}: off {runs[False]}, on {runs[True]}")
        result[mode] = {"rps_ratio": spread(rps_ratio), "p99_ratio": spread(p99_ratio),
                        "capacity_ratio": spread(capacity_ratio),
                        "cpu_us_per_request_off_median": round(statistics.median(r["off"][2] for r in raw), 2),
                        "rps_off_median": round(statistics.median(r["off"][0] for r in raw), 1),
                        "p99_ms_off_median": round(statistics.median(r["off"][1] for r in raw), 3)}
    return result


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
    # SIGTERM unwinds like Ctrl-C, so the lab, nginx and any agent are removed.
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
            load = agent_under_load(lab, lab.agent_config_path)
            # The fallback sees its own namespace's sockets: run it in az-a's client
            # namespace (a third of the load's connections, all of their TIME_WAITs).
            fallback = agent_under_load(lab, lab.agent_config_path, "sockdiag", lab.client_ns("az-a"))
        finally:
            nginx.terminate()
            nginx.wait(timeout=10)
    result = {"bench": "service_overhead", "pairs": PAIRS, "run_s": RUN_S, **service, "agent_under_load": load,
              "sockdiag_agent_under_load": fallback}
    ka, nc = service["keepalive"], service["new_connection"]
    log(f"goals: rps ratio >= 0.99 (keepalive {ka['rps_ratio']['median']}, new conn {nc['rps_ratio']['median']}; "
        f"at equal CPU {ka['capacity_ratio']['median']}, {nc['capacity_ratio']['median']}), "
        f"P99 ratio <= 1.02 ({ka['p99_ratio']['median']}, {nc['p99_ratio']['median']}), agent <= 2 % "
        f"({load['agent_cpu_pct']}) and <= 160 MB ({load['agent_rss_mb']})")
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
