"""Benchmark: the scheduler extender in the scheduling path. One pod = a filter, then a
prioritize of the nodes the filter kept (kube-scheduler's order), against 5,000 nodes in
3 zones, over HTTP to a real `azprobe scheduler-extender` process (keep-alive, as
kube-scheduler's client), weights from a devconsul with one zone drained. Both modes:

- nodes: full Node objects (`nodeCacheCapable: false`), ~3.5 KB each, as the API serves them;
- names: NodeNames only (`nodeCacheCapable: true`), zones from a name pattern.

Goal: p99 per pod <= 20 ms. Prints progress to stderr and ONE final JSON line (with
`load_avg_1m`, the machine is shared: timings are noisy): per mode,
p50/p99/max of the pod (filter + prioritize) and of each verb, request body sizes, and
`answer_only`: the same pod answered in this process without HTTP (Extender.answer: the
body's decode, the decision, the answer's encode), wall and CPU time (the CPU time is
what the extender's own code costs, also on a machine other jobs share); the rest of
`pod` is HTTP, the kernel's copies and the client.

    .venv/bin/python bench/extender.py [--nodes 5000] [--pods 200] [--warmup 10]
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from azprobe.clients.consul import ConsulSettings, make_client  # noqa: E402
from azprobe.consumers.scheduler.server import FRESH, Extender, Usable  # noqa: E402
from azprobe.consumers.scheduler.zones import NodeZones  # noqa: E402
from azprobe.contracts.weights import WeightsDoc, ZoneWeights  # noqa: E402
from azprobe.daemon.address_file import wait_for_address_file  # noqa: E402
from azprobe.dev.devconsul.testing import DevConsul  # noqa: E402
from azprobe.dev.kube import extender_body, node_object, pod_object  # noqa: E402

ZONES = ("az-a", "az-b", "az-c")


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values_s: list[float]) -> dict[str, float]:
    return {"p50_ms": round(quantile(values_s, 0.5) * 1000, 2), "p99_ms": round(quantile(values_s, 0.99) * 1000, 2),
            "max_ms": round(max(values_s) * 1000, 2)}


def drained_doc() -> WeightsDoc:
    now = time.time()
    zones = {"az-a": ZoneWeights(1.0, 50, 0.98, 0.999, 2.0, 0.3, 500, "ok", ()),
             "az-b": ZoneWeights(1.0, 49, 0.98, 0.999, 2.0, 0.3, 500, "ok", ()),
             "az-c": ZoneWeights(0.14, 1, 0.1, 0.6, 900.0, 0.3, 500, "degraded", ())}
    return WeightsDoc(1, now, now + 3600, "bench", "default", "degraded", zones)


def post(conn: http.client.HTTPConnection, verb: str, body: bytes) -> tuple[float, bytes]:
    started = time.perf_counter()
    conn.request("POST", f"/{verb}", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    out = response.read()
    elapsed = time.perf_counter() - started
    if response.status != 200:
        raise SystemExit(f"{verb}: HTTP {response.status}: {out[:200]!r}")
    return elapsed, out


class FixedWeights:
    def __init__(self, doc: WeightsDoc) -> None:
        self.doc = doc

    def usable(self) -> Usable:
        return Usable(self.doc, FRESH, "bench")


def answer_only(mode: str, n_nodes: int, pods: int) -> dict:
    """One pod's filter + prioritize through Extender.answer, in this process."""
    names = [f"{ZONES[i % 3]}-node-{i:05d}" for i in range(n_nodes)]
    nodes = [node_object(name, ZONES[i % 3]) for i, name in enumerate(names)]
    patterns = (re.compile("(?P<zone>az-[a-c])-node-[0-9]+"),)
    extender = Extender(FixedWeights(drained_doc()), NodeZones(patterns=patterns), max_nodes=15_000)
    pod = pod_object()
    kept = [n for n in nodes if not n["metadata"]["name"].startswith("az-c")]
    if mode == "nodes":
        filter_body, prioritize_body = extender_body(pod, nodes), extender_body(pod, kept)
    else:
        filter_body = extender_body(pod, node_names=names)
        prioritize_body = extender_body(pod, node_names=[n["metadata"]["name"] for n in kept])
    del nodes, kept
    # The bench's own objects (the HTTP runs' node dicts) are frozen out of the cycle
    # collector, so its passes over them are not counted as the extender's cost: the
    # extender's process holds none of them.
    gc.collect()
    gc.freeze()
    times, cpu = [], []
    try:
        for _ in range(pods):
            started, started_cpu = time.perf_counter(), time.process_time()
            assert extender.answer("filter", filter_body)[0] == 200
            assert extender.answer("prioritize", prioritize_body)[0] == 200
            times.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
    finally:
        gc.unfreeze()
    return {"wall": summary(times), "cpu": summary(cpu)}


def run_mode(conn: http.client.HTTPConnection, mode: str, n_nodes: int, pods: int, warmup: int) -> dict:
    names = [f"{ZONES[i % 3]}-node-{i:05d}" for i in range(n_nodes)]
    nodes = [node_object(name, ZONES[i % 3]) for i, name in enumerate(names)] if mode == "nodes" else None
    pod_times, filter_times, prioritize_times = [], [], []
    filter_bytes = prioritize_bytes = 0
    for i in range(warmup + pods):
        pod = pod_object(f"web-7c9d8f6b5-{i:05d}")
        body = extender_body(pod, nodes) if mode == "nodes" else extender_body(pod, node_names=names)
        t_filter, out = post(conn, "filter", body)
        result = json.loads(out)
        if mode == "nodes":
            kept_body = extender_body(pod, result["Nodes"]["items"])
        else:
            kept_body = extender_body(pod, node_names=result["NodeNames"])
        assert len(result["FailedAndUnresolvableNodes"]) == n_nodes // 3, "the drained zone was not filtered"
        t_prioritize, out = post(conn, "prioritize", kept_body)
        if i >= warmup:
            filter_times.append(t_filter)
            prioritize_times.append(t_prioritize)
            pod_times.append(t_filter + t_prioritize)
        filter_bytes, prioritize_bytes = len(body), len(kept_body)
    print(f"{mode}: {pods} pods, pod p99 {quantile(pod_times, 0.99) * 1000:.1f} ms", file=sys.stderr)
    return {"pod": summary(pod_times), "filter": summary(filter_times), "prioritize": summary(prioritize_times),
            "filter_body_bytes": filter_bytes, "prioritize_body_bytes": prioritize_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, DevConsul(data_dir=Path(tmp) / "dc") as dc:
        assert make_client(ConsulSettings(address=dc.url)).kv.put("azprobe/v1/weights", drained_doc().dumps())
        config = Path(tmp) / "extender.toml"
        config.write_text('[extender]\nlisten = "127.0.0.1:0"\n'
                          f'[consul]\naddress = "{dc.url}"\n'
                          '[nodes]\nname_patterns = ["(?P<zone>az-[a-c])-node-[0-9]+"]\n')
        address_file = Path(tmp) / "address"
        proc = subprocess.Popen([sys.executable, "-m", "azprobe.commands.cli", "scheduler-extender", "--config",
                                 str(config), "--address-file", str(address_file)], stdin=subprocess.DEVNULL)
        try:
            address = wait_for_address_file(address_file, alive=lambda: proc.poll() is None, timeout_s=20)
            if address is None:
                raise SystemExit("the extender did not start")
            conn = http.client.HTTPConnection(*address, timeout=30)
            deadline = time.monotonic() + 20
            while json.loads(post(conn, "filter", extender_body(pod_object(), node_names=["az-c-node-1",
                                                                                         "az-a-node-2"]))[1]
                             )["NodeNames"] != ["az-a-node-2"]:
                if time.monotonic() > deadline:
                    raise SystemExit("the extender never read the weights")
                time.sleep(0.1)
            modes = {mode: run_mode(conn, mode, args.nodes, args.pods, args.warmup) for mode in ("nodes", "names")}
        finally:
            proc.terminate()
            proc.wait(10)
    for mode, figures in modes.items():
        figures["answer_only"] = answer_only(mode, args.nodes, args.pods)
    print(json.dumps({"bench": "extender", "nodes": args.nodes, "pods": args.pods, "goal_p99_ms": 20,
                      "modes": modes, "load_avg_1m": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
