"""Fail-static in the data plane: az-b drained (Envoy priority 1), the controller gone
(the weights frozen as they are), then az-a and az-c blackholed. Envoy's health checks
must move the users to az-b by themselves: azprobe ranks zones, it never removes one.

The frozen document is the shape a controller writes in a drain (az-b degraded at the
1 % floor, the others ok), put straight into Consul KV with a long expiry, and no
controller runs: nothing can "help" the data plane. `azprobe envoy-eds --watch` renders
it exactly as in the drill's azprobe mode.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from azprobe.clients.consul import ConsulSettings, make_client
from azprobe.contracts.weights import WeightsDoc, ZoneWeights
from azprobe.dev.demo.runner import LoopStack
from azprobe.dev.drill.metrics import RequestRecord, time_bins
from azprobe.dev.drill.runner import DataPlane, DrillSpec, _hold
from azprobe.dev.demo.scenarios import get_scenario

FROZEN_TTL_S = 600.0
FAILED_OVER_SUCCESS = 0.95  # a bin counts as failed over when this many requests succeed...
FAILED_OVER_SHARE = 0.95  # ...and this many went to the drained zone


@dataclass
class FailStaticResult:
    drained_az: str
    blackholed: list[str]
    share_before: float | None  # the drained zone's share before the blackhole (~0)
    failover_s: float | None  # blackhole -> every later bin succeeds through the drained zone
    failed_requests: int  # between the blackhole and the failover
    success_after_pct: float | None  # after the failover
    requests: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def frozen_drain_doc(azs: list[str], drained: str, now: float | None = None) -> WeightsDoc:
    now = time.time() if now is None else now
    healthy = [az for az in azs if az != drained]
    shares = {az: (100 - 1) // len(healthy) for az in healthy}
    shares[healthy[0]] += 99 - sum(shares.values())
    zones = {az: ZoneWeights(1.0, shares[az], 0.99, 0.999, 2.0, 0.3, 500, "ok", ("drill: healthy",))
             for az in healthy}
    zones[drained] = ZoneWeights(0.14, 1, 0.2, 0.95, 400.0, 0.3, 500, "degraded", ("drill: drained, then frozen",))
    return WeightsDoc(generation=1, generated_at=now, expires_at=now + FROZEN_TTL_S, leader="drill-frozen",
                      model="default", state="degraded", zones=zones)


def run_fail_static(stack: LoopStack, *, drained: str = "az-b", client_az: str = "az-a", rate: float = 100.0,
                    before_s: float = 3.0, blackhole_s: float = 10.0) -> FailStaticResult:
    prefix = f"azprobe/failstatic-{uuid.uuid4().hex[:8]}/"
    doc = frozen_drain_doc(stack.azs, drained)
    client = make_client(ConsulSettings(address=stack.consul_url))
    client.kv.put(f"{prefix}weights", doc.dumps())
    spec = DrillSpec(scenario=get_scenario("blackhole"), modes=("azprobe",), rate=rate, client_az=client_az)
    plane = DataPlane(stack, "azprobe", spec, stack.work_dir / "drill" / "fail-static", prefix)
    blackholed = [az for az in stack.azs if az != drained]
    try:
        plane.start()
        started = time.monotonic()
        _hold(before_s, plane.check_alive)
        t_black = time.monotonic()
        for az in blackholed:
            stack.lab.fault(az, blackhole=True)
        _hold(blackhole_s, plane.check_alive)
        end = time.monotonic()
    finally:
        stack.clear()
        records, _ = plane.close()
    return score_fail_static(records, drained, blackholed, started, t_black, end)


def score_fail_static(records: list[RequestRecord], drained: str, blackholed: list[str], started: float,
                      t_black: float, end: float) -> FailStaticResult:
    before = [r for r in records if started + 1.0 <= r.t < t_black]
    bins = time_bins(records, t_black, end, t_black)
    failover = None
    for i, b in enumerate(bins):
        good = all(x.requests and (x.requests - x.errors) / x.requests >= FAILED_OVER_SUCCESS
                   and x.shares.get(drained, 0.0) >= FAILED_OVER_SHARE for x in bins[i:])
        if good and bins[i:]:
            failover = b.t
            break
    after = [r for r in records if failover is not None and r.t >= t_black + failover]
    return FailStaticResult(
        drained_az=drained, blackholed=blackholed,
        share_before=sum(1 for r in before if r.az == drained) / len(before) if before else None,
        failover_s=failover,
        failed_requests=sum(1 for r in records if t_black <= r.t < t_black + (failover or end - t_black) and not r.ok),
        success_after_pct=100.0 * sum(1 for r in after if r.ok) / len(after) if after else None,
        requests=len(records))
