"""The drill through the other door: proxyless gRPC. A real grpcio client in the client
AZ's namespace calls `xds:///backend`; its bootstrap names its zone and points at
`azprobe xds serve` (azprobe.dev.drill.xdsdoor); real grpcio servers answer in every
AZ's server namespace. The fault, the controller and the scoring are the Envoy drill's
(azprobe.dev.demo.runner.run_scenario, azprobe.dev.drill.metrics).

Besides the Envoy drill's figures it reports the published shares: the effective shares
(drained zones 0) of the document of the client's view just before the fault, to hold
the client's own split against.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from azprobe.clients.consul import ConsulSettings
from azprobe.consumers.failover import effective_shares
from azprobe.consumers.watch import WeightWatcher
from azprobe.contracts import kv
from azprobe.contracts.weights import WeightsDoc
from azprobe.dev.demo.runner import LoopStack, run_scenario
from azprobe.dev.drill.metrics import ModeFigures, RequestRecord, in_window, mode_figures, parse_records
from azprobe.dev.drill.runner import DrillSpec, _hold
from azprobe.dev.drill.xdsdoor import XdsDoor
from azprobe.dev.lab import netns
from azprobe.dev.lab.grpcapp import GRPC_PORT
from azprobe.dev.lab.processes import spawn_in_ns, wait_ready
from azprobe.errors import PrerequisiteError

MODULE = "azprobe.dev.lab.grpcapp"
SERVICE = "backend"
PUBLISHED_WINDOW_S = 4.0  # the client's split just before the fault, against the document then


@dataclass
class ProxylessFigures:
    figures: ModeFigures
    published_before: dict[str, float]  # AZ -> percent of requests the document asks for
    client_before: dict[str, float]  # AZ -> percent of the client's calls in the PUBLISHED_WINDOW_S before the fault

    def to_json(self) -> dict[str, Any]:
        return {**self.figures.to_json(), "published_before": self.published_before,
                "client_before": self.client_before}


def bootstrap(socket: str, zone: str) -> dict[str, Any]:
    """A gRPC xDS bootstrap (gRFC A27) naming the client's zone."""
    return {"xds_servers": [{"server_uri": f"unix://{socket}", "channel_creds": [{"type": "insecure"}],
                             "server_features": ["xds_v3"]}],
            "node": {"id": f"lab-grpc-{zone}", "cluster": "azprobe-lab", "locality": {"zone": zone}}}


def split(requests: list[RequestRecord], azs: list[str]) -> dict[str, float]:
    ok = [r for r in requests if r.ok]
    return {az: (100.0 * sum(1 for r in ok if r.az == az) / len(ok) if ok else 0.0) for az in azs}


def run_proxyless(stack: LoopStack, spec: DrillSpec, progress: Any = lambda m: None) -> ProxylessFigures:
    lab = stack.lab
    work = stack.work_dir / "drill" / "grpc"
    work.mkdir(parents=True, exist_ok=True)
    records_path = work / "calls.csv"
    records_path.unlink(missing_ok=True)
    prefix = f"azprobe/drill-{uuid.uuid4().hex[:8]}/"
    sick = spec.scenario.sick_azs(stack.azs)
    history: list[tuple[float, WeightsDoc]] = []
    with ExitStack() as exit_stack:
        servers, logs = [], []
        for az in lab.azs:
            logs.append(work / f"server-{az}.log")
            servers.append(spawn_in_ns(lab.server_ns(az), netns.python_argv(MODULE, "server", "--az", az,
                                                                            "--port", str(GRPC_PORT)), logs[-1]))
        exit_stack.callback(lambda: netns.kill_pids([p.pid for p in servers]))
        wait_ready(servers, logs)
        door = XdsDoor(work, stack.consul_url, prefix,
                       {az: [f"{lab.server_addr(az)}:{GRPC_PORT}"] for az in lab.azs}, list(lab.azs), SERVICE)
        exit_stack.callback(door.stop)
        door.start()
        watcher = WeightWatcher(ConsulSettings.from_env(address=stack.consul_url, prefix=prefix),
                                kv.weights_name(spec.client_az),
                                on_change=lambda doc: history.append((time.monotonic(), doc)))
        watcher.start()
        exit_stack.callback(watcher.stop)
        argv = ["env", "GRPC_XDS_BOOTSTRAP_CONFIG=" + json.dumps(bootstrap(str(door.socket), spec.client_az)),
                *netns.python_argv(MODULE, "load", "--target", f"xds:///{SERVICE}", "--rate", str(spec.rate),
                                   "--out", str(records_path))]
        log = work / "load.log"
        load = spawn_in_ns(lab.client_ns(spec.client_az), argv, log)
        exit_stack.callback(lambda: netns.kill_pids([load.pid]))
        wait_ready([load], [log], timeout=40.0)
        run_start = time.monotonic()
        progress(f"grpc: {spec.rate:g} calls/s from {spec.client_az} to xds:///{SERVICE}")
        try:
            result = run_scenario(stack, spec.scenario, fault_s=spec.fault_s, prefix=prefix, safety=spec.safety)
            # KV recovered; the client's split follows one push and a subchannel later, and
            # the recovery figure needs MIN_HOLD_S of it before the run ends.
            _hold(spec.recovery_s, door.check_alive)
        finally:
            stack.clear()
        run_end = time.monotonic()
        netns.kill_pids([load.pid], timeout=5.0)  # SIGTERM: the client flushes its records
    records = parse_records(records_path.read_text()) if records_path.exists() else []
    if not records:
        raise PrerequisiteError(f"the gRPC client recorded no calls; see {work}/load.log")
    fault_start = next(e.t for e in result.events if e.action == "fault")
    fault_end = max(e.t for e in result.events if e.action == "clear")
    figures = mode_figures("azprobe-grpc", records, [], sick, run_start=run_start, fault_start=fault_start,
                           fault_end=fault_end, run_end=run_end, grace_s=spec.grace_s, azs=stack.azs)
    figures.kv_detect_s, figures.kv_recover_s = result.metrics.detect_s, result.metrics.recover_s
    before = [doc for t, doc in history if t < fault_start]
    if not before:
        raise PrerequisiteError(f"no weights document of view {spec.client_az} before the fault")
    published = {az: round(v, 2) for az, v in effective_shares(before[-1]).items()}
    client = {az: round(v, 2) for az, v in
              split(in_window(records, fault_start - PUBLISHED_WINDOW_S, fault_start), list(stack.azs)).items()}
    return ProxylessFigures(figures, published, client)
