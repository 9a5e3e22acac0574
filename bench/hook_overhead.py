#!/usr/bin/env python3
"""What the probe costs a service end to end, hooked on BTF-typed vs classic tracepoints.

bpf_stats counts a handler's own run time only. A classic tracepoint also builds its trace
record for every event (buffer, field copies, caller registers) before the program runs;
a BTF-typed one (tp_btf) hands the program the kernel's arguments, and the program reads
the few socket fields it needs itself with plain loads (docs/probe.md "BTF-typed
tracepoints"). Which costs a
service less can only be seen from the service's side, so: a C loop in a lab namespace,
timed per iteration with no probe, with the agent's program on classic tracepoints and
with it on tp_btf ones (both compiled and given a topology that puts the loop's address in
an AZ, so connects fill the flow cache and segments are sampled as in production), the
three interleaved round by round (this VM's speed drifts by ±20 % over seconds, so only
differences within a round mean anything). Two loops:
  connect:  connect to our own listener, accept, close both with an RST (6 state changes);
  exchange: one connection, a 1-byte request and a 1-byte response (2 received segments).
Prints one JSON line: per loop, the median ns per iteration without the probe and the
medians of the per-round differences (classic - none, btf - none, classic - btf) with the
mean and standard error of the last.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from azprobe.agent.lpm import trie_entries  # noqa: E402
from azprobe.agent.probe import Probe, check_prerequisites  # noqa: E402
from azprobe.dev.lab import Lab, LabSpec, unique_lab_name  # noqa: E402
from probe_overhead import exit_on_sigterm, log  # noqa: E402  (bench/ is sys.path[0])

ROUNDS = int(os.environ.get("AZPROBE_BENCH_ROUNDS", "100"))
ITERATIONS = {"connect": int(os.environ.get("AZPROBE_BENCH_CONNECTS", "3000")),
              "exchange": int(os.environ.get("AZPROBE_BENCH_EXCHANGES", "20000"))}
LOOP_C = r"""
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
/* loop connect|exchange ADDRESS N: prints ns per iteration. */
int main(int argc, char **argv) {
    struct sockaddr_in sa = {.sin_family = AF_INET};
    if (argc != 4 || inet_pton(AF_INET, argv[2], &sa.sin_addr) != 1) return 2;
    int exchange = strcmp(argv[1], "exchange") == 0, n = atoi(argv[3]), one = 1;
    int l = socket(AF_INET, SOCK_STREAM, 0);
    socklen_t len = sizeof sa;
    if (bind(l, (void *)&sa, sizeof sa) || listen(l, 128) || getsockname(l, (void *)&sa, &len)) {
        perror("listen");
        return 1;
    }
    int c = -1, a = -1;
    if (exchange) {
        c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (void *)&sa, sizeof sa)) { perror("connect"); return 1; }
        a = accept(l, NULL, NULL);
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    struct linger rst = {1, 0}; /* connect loop: close with RST, no TIME_WAIT piling up */
    char byte = 'x';
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
        if (exchange) {
            if (write(c, &byte, 1) != 1 || read(a, &byte, 1) != 1 || write(a, &byte, 1) != 1 ||
                read(c, &byte, 1) != 1) { perror("exchange"); return 1; }
            continue;
        }
        c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (void *)&sa, sizeof sa)) { perror("connect"); return 1; }
        a = accept(l, NULL, NULL);
        setsockopt(c, SOL_SOCKET, SO_LINGER, &rst, sizeof rst);
        close(c);
        close(a);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.1f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / n);
    return 0;
}
"""


class Hooks:
    """One loaded azprobe program whose hooks this bench attaches and detaches."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.funcs = [name for name in probe.bpf.funcs if name.startswith(b"tracepoint__")]
        self.detach()

    def attach(self) -> None:
        for name in self.funcs:
            category, event = name[len(b"tracepoint__"):].split(b"__", 1)
            self.probe.bpf.attach_tracepoint(tp=category + b":" + event, fn_name=name)
        for handler in self.probe.btf_handlers:
            handler.attach()

    def detach(self) -> None:
        for tp in list(self.probe.bpf.tracepoint_fds):
            self.probe.bpf.detach_tracepoint(tp)
        for handler in self.probe.btf_handlers:
            handler.detach()


def main() -> None:
    signal.signal(signal.SIGTERM, exit_on_sigterm(os.getpid()))
    check_prerequisites()
    with tempfile.TemporaryDirectory() as tmp, \
            Lab.up(LabSpec(name=unique_lab_name("hk"), state_dir=Path(tmp) / "lab", traffic=False)) as lab:
        loop = Path(tmp) / "loop"
        (Path(tmp) / "loop.c").write_text(LOOP_C)
        subprocess.run(["cc", "-O2", "-o", str(loop), str(Path(tmp) / "loop.c")], check=True)
        ns, addr = lab.server_ns("az-b"), lab.server_addr("az-b")
        btf_probe, classic_probe = Probe.load(), Probe.load(btf_path=Path(tmp) / "no-btf")
        try:
            if btf_probe.hooks != "btf":
                raise SystemExit("bench: the probe fell back to classic hooks here (its log says why): "
                                 "there are no tp_btf hooks to compare")
            # The loop's address in an AZ of its own (id 2; the node is in 1): a real path.
            entries = trie_entries({"az-loop": [ipaddress.ip_network(f"{addr}/32")]}, {"az-loop": 2})
            variants = {"none": None, "classic": Hooks(classic_probe), "btf": Hooks(btf_probe)}
            for hooks in (variants["classic"], variants["btf"]):
                hooks.probe.set_topology(entries, 1)
            result = {"bench": "hook_overhead", "rounds": ROUNDS}
            for mode, iterations in ITERATIONS.items():
                ns_per = {name: [] for name in variants}
                for r in range(ROUNDS):
                    for name in (list(variants) if r % 2 == 0 else list(reversed(variants))):
                        hooks = variants[name]
                        if hooks:
                            hooks.attach()
                        try:
                            out = lab.exec(ns, [str(loop), mode, addr, str(iterations)], timeout=120).stdout
                            ns_per[name].append(float(out))
                        finally:
                            if hooks:
                                hooks.detach()
                    if (r + 1) % 20 == 0:
                        log(f"{mode}: {r + 1}/{ROUNDS} rounds")

                def diff(a: str, b: str) -> list[float]:
                    return [x - y for x, y in zip(ns_per[a], ns_per[b])]

                classic_btf = diff("classic", "btf")
                result[mode] = {
                    "iterations": iterations,
                    "ns_per_iteration_none_median": round(statistics.median(ns_per["none"])),
                    "classic_minus_none_ns_median": round(statistics.median(diff("classic", "none"))),
                    "btf_minus_none_ns_median": round(statistics.median(diff("btf", "none"))),
                    "classic_minus_btf_ns": {
                        "median": round(statistics.median(classic_btf)), "mean": round(statistics.mean(classic_btf)),
                        "stderr": round(statistics.stdev(classic_btf) / len(classic_btf) ** 0.5)},
                }
        finally:
            btf_probe.close()
            classic_probe.close()
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
